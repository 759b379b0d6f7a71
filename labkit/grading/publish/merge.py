"""Merging the shards of a class: a pure function of the parts, the same whatever order they come in.

`merge` takes the results of each part (scoreboard.json) and gives the class's: every part must have
been graded with the same kit, labs, configurations, policy and course inputs (overrides, extensions:
every shard carries the whole class's), or the merge is refused naming the file and line where they
differ, and nothing is written. The parts are put in one order (by the students they hold) before
anything is taken from them, so `merge p2 p1` writes the same bytes as `merge p1 p2`, and those of a
single run of the whole class.

`merge_folders` does it for --out folders: the scoreboard, each student's submission history
(OUT/history/<id>/) and the course's state (OUT/course/, which must be the same in every part).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from labkit.grading.classwide.results import configs_of, labs_of
from labkit.grading.publish import scoreboard
from labkit.grading.publish.scoreboard import DRAWN, MergeError
from labkit.grading.state import course

PER_PART = ("students", "notes", "rows")  # what each part holds of its own; every other key is the class's


def _text(part: dict) -> str:
    """A part as its scoreboard.json has it (to name the line of a key)."""
    return json.dumps(part, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _line(part: dict, key: str) -> int:
    """The line of a top-level key in the part's scoreboard.json (1 when it is not there)."""
    for n, line in enumerate(_text(part).splitlines(), 1):
        if line.startswith(f' "{key}":'):
            return n
    return 1


def _order(parts: list[dict], names: list[str]) -> list[tuple[dict, str]]:
    """The parts in one order whatever order they were given in: by the students they hold, then their text."""
    return sorted(zip(parts, names), key=lambda p: (sorted(p[0].get("students", {})), _text(p[0])))


def merge(parts: list[dict], names: list[str] | None = None) -> dict:
    """One class's results from the results of its shards: the same as grading the class in one run.

    `names`: where each part was read (its scoreboard.json), for the messages.
    """
    if not parts:
        raise MergeError("nothing to merge")
    names = names or [f"part {i}" for i in range(1, len(parts) + 1)]
    ordered = _order(parts, names)
    first, _ = ordered[0]
    _refuse_other_gradings(ordered)
    students, notes, rows = _gathered(ordered)
    labs = [lab["number"] for lab in labs_of(first)]
    configs = [c["name"] for c in configs_of(first)]
    ordered_rows = sorted(
        rows.values(),
        key=lambda r: (
            r["student"],
            labs.index(r["lab"]) if r["lab"] in labs else 0,
            configs.index(r["config"]) if r["config"] in configs else 0,
        ),
    )
    shared = {
        k: v for k, v in first.items() if k not in DRAWN and k not in PER_PART
    }  # drawn again from the class
    return {
        **shared,
        "students": {s: students[s] for s in sorted(students)},
        "notes": notes,
        "rows": ordered_rows,
    }


def _refuse_other_gradings(ordered: list[tuple[dict, str]]) -> None:
    """Every part graded as the first was (kit, labs, configurations, course inputs), or a MergeError naming where."""
    first, first_name = ordered[0]
    for part, name in ordered[1:]:
        for key in sorted(set(first) | set(part)):
            if key in PER_PART or key in DRAWN or part.get(key) == first.get(key):
                continue
            what = {"kit": "version of the kit", "format": "format of results"}.get(key, key)
            raise MergeError(
                f"{name}, line {_line(part, key)}: graded with another {what} than {first_name} "
                f"(line {_line(first, key)}): grade every shard with the same --labs, --configs and "
                "course inputs (roster, policy, overrides, extensions), with the same version of the "
                "kit; nothing was merged"
            )


def _gathered(ordered: list[tuple[dict, str]]) -> tuple[dict[str, dict], list[str], dict[tuple, dict]]:
    """The parts' students, notes and rows together; a student or row two parts hold differently is a MergeError."""
    students: dict[str, dict] = {}
    owner: dict[str, str] = {}
    rows: dict[tuple, dict] = {}
    notes: list[str] = []
    for part, name in ordered:
        for student, info in part.get("students", {}).items():
            if student in students and students[student] != info:
                raise MergeError(
                    f"{name}, line {_line(part, 'students')}: student {student!r} is also in "
                    f"{owner[student]}, graded otherwise: merge each shard once; nothing was merged"
                )
            students[student], owner[student] = info, name
        notes += [n for n in part.get("notes", []) if n not in notes]
        for r in part.get("rows", []):
            key = (r["student"], r["lab"], r["config"])
            if key in rows and rows[key] != r:
                raise MergeError(
                    f"{name}, line {_line(part, 'rows')}: {r['student']} lab {r['lab']} on "
                    f"{r['config']} is in two parts with different results; nothing was merged"
                )
            rows[key] = r
    return students, notes, rows


def merge_folders(folders: list[Path], out: Path, notes: Sequence[str] = ()) -> dict:
    """Merge the --out folders of a class's shards into `out`; the results (MergeError: nothing written).

    `notes`: more class notes (a shard that did not finish).
    """
    folders = [Path(f) for f in folders]
    parts = [scoreboard.read(f) for f in folders]
    manifests = [(course.read_manifest(f / course.FOLDER), f) for f in folders]
    kept = [(m, f) for m, f in manifests if m]
    for m, f in kept[1:]:
        if m != kept[0][0]:
            where = f / course.FOLDER / course.MANIFEST
            raise MergeError(
                f"{where}, line 1: the course's inputs differ from those of {kept[0][1]} "
                f"({', '.join(_differing(kept[0][0], m))}): grade every shard with the same "
                "inputs; nothing was merged"
            )
    results = merge(parts, [str(f / "scoreboard.json") for f in folders])
    results["notes"] = results["notes"] + [n for n in notes if n not in results["notes"]]
    out = Path(out)
    scoreboard.write(results, out)
    for folder, part in zip(folders, parts):
        for student in part.get("students", {}):
            mine = folder / "history" / student
            if mine.is_dir() and mine.resolve() != (out / "history" / student).resolve():
                shutil.copytree(mine, out / "history" / student, dirs_exist_ok=True)
    if kept:
        course.copy(
            min(kept, key=lambda mf: str(sorted(mf[0].items())))[1] / course.FOLDER, out / course.FOLDER
        )
    return results


def _differing(a: dict, b: dict) -> list[str]:
    ia, ib = a.get("inputs", {}), b.get("inputs", {})
    return sorted(n for n in set(ia) | set(ib) if ia.get(n) != ib.get(n)) or ["format"]
