"""A TA's overrides, applied after grading: they survive every regrade, and the scoreboard marks them.

    student,lab,points,test,status,comment
    alice,3,5,,,"regraded by hand: the mesh was right, the test too strict"
    bob,3,,test_is_split_across_devices,passed,"accepted after the dispute of 3 March"

A line sets a lab's points (`points`), or changes one test's outcome on every configuration
(`test` and `status`: passed or failed) before the policy combines them. The file is read at every
grading run and carried in the results, so the scoreboard and the LMS exports always include it.

It is read with the schema every TA's file shares (labkit/grading/state/table.py): every field on every
line, ids in NFC, a student of the class, a lab graded, a test the lab has, and points within 0 and the
lab's points (more only where the policy names the lab's extra credit: `[labs.3] extra_credit = 2`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from labkit.grading.state import table

COLUMNS = tuple(
    table.Column(name, required=name in ("student", "lab"))
    for name in ("student", "lab", "points", "test", "status", "comment")
)


class OverrideError(ValueError):
    """An overrides file that cannot be used: the message names the file and the line."""


def parse(
    text: str,
    source: str,
    students: set[str],
    lab_tests: Mapping[int, set[str]],
    lab_points: Mapping[int, float] | None = None,
    extra_credit: Mapping[int, float] | None = None,
    inactive: list[str] | None = None,
) -> list[dict]:
    """The overrides, each checked against the class (students) and the labs graded (lab -> its tests).

    A points override lies within 0 and the lab's points (`lab_points`: lab -> what its tests are worth),
    plus what the policy's `[labs.N] extra_credit` allows for that lab by name. `inactive`: see
    `table.Line.in_class` (a kept file's line of a student dropped from the roster)."""
    out, seen = [], {}
    for line in table.read(text, source, COLUMNS, OverrideError):
        n = line.number
        if not line.in_class(students, inactive):
            continue
        lab = line.lab(lab_tests)
        entry = {"student": line["student"], "lab": lab, "comment": line["comment"], "line": n}
        if line["points"]:
            if line["test"] or line["status"]:
                raise line.fail(
                    "either points, or test and status, not both",
                    "points",
                    "one line for the lab's points, another for a test's outcome",
                )
            entry["points"] = _points(line, lab, lab_points, extra_credit)
            key = (entry["student"], entry["lab"], "")
        elif line["test"]:
            test = line["test"] if line["test"].startswith("test_") else f"test_{line['test']}"
            if test not in lab_tests[int(lab)]:
                names = sorted(lab_tests[int(lab)])
                raise line.fail(
                    f"lab {lab} has no test {line['test']!r}",
                    "test",
                    f"name one of its tests ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})",
                )
            if line["status"] not in ("passed", "failed"):
                raise line.fail(
                    f"status must be passed or failed, got {line['status']!r}",
                    "status",
                    "write passed or failed",
                )
            entry.update(test=test, status=line["status"])
            key = (entry["student"], entry["lab"], test)
        else:
            raise line.fail(
                "give points, or a test and its status", "points", "fill points, or test and status"
            )
        if key in seen:
            raise line.fail(
                f"overrides the same as line {seen[key]}", "student", f"keep one of lines {seen[key]} and {n}"
            )
        seen[key] = n
        out.append(entry)
    return out


def _points(
    line: table.Line, lab: int, lab_points: Mapping[int, float] | None, extra: Mapping[int, float] | None
) -> float:
    """A points override's points: within 0 and the lab's points, and the extra credit the policy allows."""
    if lab_points is None or lab not in lab_points:
        return line.number_in("points", 0)
    most, more = lab_points[lab], (extra or {}).get(lab, 0)
    fix = (
        f"lab {lab} is worth {most:g} points"
        + (f" and the policy allows {more:g} of extra credit" if more else "")
        + ("" if more else f"; to give more, name it in the policy: [labs.{lab}] extra_credit = <points>")
    )
    return line.number_in("points", 0, most + more, fix)


def load(path: Path, students: set[str], lab_tests: dict[int, set[str]]) -> list[dict]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise OverrideError(f"{path}: cannot be read ({e.strerror or e})") from None
    return parse(text, str(path), students, lab_tests)
