"""A TA's overrides, applied after grading: they survive every regrade, and the scoreboard marks them.

    student,lab,points,test,status,comment
    alice,3,5,,,"regraded by hand: the mesh was right, the test too strict"
    bob,3,,test_is_split_across_devices,passed,"accepted after the dispute of 3 March"

A line sets a lab's points (`points`), or changes one test's outcome on every configuration
(`test` and `status`: passed or failed) before the policy combines them. The file is read at every
grading run and carried in the results, so the scoreboard and the LMS exports always include it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path

COLUMNS = ("student", "lab", "points", "test", "status", "comment")


class OverrideError(ValueError):
    """An overrides file that cannot be used: the message names the file and the line."""


def student_and_lab(
    get: Mapping[str, str], where: str, students: set[str], labs, error: type[ValueError]
) -> int:
    """A line of a TA's file (overrides, adjustments): its student is one of the class and its lab (`3` or
    `lab-3`) one of those graded; the lab's number, or `error` naming `where`."""
    if get["student"] not in students:
        raise error(f"{where}: no student {get['student']!r} in this class")
    lab = get["lab"].removeprefix("lab-")
    if not lab.isdigit() or int(lab) not in labs:
        raise error(f"{where}: no lab {get['lab']!r} graded here (labs: {', '.join(map(str, sorted(labs)))})")
    return int(lab)


def parse(text: str, source: str, students: set[str], lab_tests: Mapping[int, set[str]]) -> list[dict]:
    """The overrides, each checked against the class (students) and the labs graded (lab -> its tests)."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    missing = {"student", "lab"} - set(reader.fieldnames or [])
    if missing:
        raise OverrideError(
            f"{source}, line 1: missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(sorted(missing))} (expected {','.join(COLUMNS)})"
        )
    out, seen = [], {}
    for line in reader:
        n = reader.line_num
        get = {c: (line.get(c) or "").strip() for c in COLUMNS}
        lab = student_and_lab(get, f"{source}, line {n}", students, lab_tests, OverrideError)
        entry = {"student": get["student"], "lab": lab, "comment": get["comment"], "line": n}
        if get["points"]:
            if get["test"] or get["status"]:
                raise OverrideError(f"{source}, line {n}: either points, or test and status, not both")
            try:
                entry["points"] = float(get["points"])
            except ValueError:
                raise OverrideError(
                    f"{source}, line {n}: points must be a number, got {get['points']!r}"
                ) from None
            if entry["points"] < 0:
                raise OverrideError(f"{source}, line {n}: points must not be negative")
            key = (entry["student"], entry["lab"], "")
        elif get["test"]:
            test = get["test"] if get["test"].startswith("test_") else f"test_{get['test']}"
            if test not in lab_tests[int(lab)]:
                raise OverrideError(f"{source}, line {n}: lab {lab} has no test {get['test']!r}")
            if get["status"] not in ("passed", "failed"):
                raise OverrideError(
                    f"{source}, line {n}: status must be passed or failed, got {get['status']!r}"
                )
            entry.update(test=test, status=get["status"])
            key = (entry["student"], entry["lab"], test)
        else:
            raise OverrideError(f"{source}, line {n}: give points, or a test and its status")
        if key in seen:
            raise OverrideError(f"{source}, line {n}: overrides the same as line {seen[key]}")
        seen[key] = n
        out.append(entry)
    return out


def load(path: Path, students: set[str], lab_tests: dict[int, set[str]]) -> list[dict]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise OverrideError(f"{path}: cannot be read ({e.strerror or e})") from None
    return parse(text, str(path), students, lab_tests)
