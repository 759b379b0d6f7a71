"""Grades out to a learning management system: gradebook files drawn from graded results, with no regrade.

`export(results, "canvas" | "wide", missing="blank" | "excused")`, for `labkit scoreboard export`:

- canvas: Canvas's gradebook CSV: Student, ID, SIS User ID, SIS Login ID, Section, one column per
  lab, and a "Points Possible" row. ID is the roster's `lms_id` (Canvas's user id), SIS User ID the
  student id, SIS Login ID the email. A lab with `canvas_id` in the policy is headed `Title (id)`,
  which Canvas matches to that assignment; without one, Canvas makes a new assignment. Each lab's
  points and points possible are multiplied by the policy's weight (the sum of the columns is the
  total of grades.csv); work not handed in is blank (Canvas keeps what it has) or `EX` (excused),
  never a 0 that would overwrite a grade entered in Canvas.
- wide: one row per student: the roster's columns, each lab's points, possible points and status,
  the total, and the rule that produced it.
"""

from __future__ import annotations

import csv
import io

from labkit.grading.intake.lms import LmsError
from labkit.grading.publish.scoreboard import _cell
from labkit.grading.state import policy


def _roster_of(results: dict, student: str) -> dict:
    return results.get("students", {}).get(student, {})


MISSING = {"blank": "", "excused": "EX"}  # what the Canvas export writes for work not handed in


def to_canvas(results: dict, missing: str = "blank") -> str:
    """Canvas's gradebook CSV: each lab's points times its weight, so Canvas's sum is the kit's total.

    Work not handed in is left blank (Canvas keeps what it has) or `EX` (excused), never 0; a lab a
    TA overrode is exported with the override's points.
    """
    if missing not in MISSING:
        raise LmsError(f"unknown choice for missing work {missing!r} ({', '.join(MISSING)})")
    grades = policy.grades(results)
    labs = results.get("labs", [])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    pol = policy.Policy.from_json(results.get("policy"))
    ids = pol.canvas
    w.writerow(
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
        + [_lab_column(lab) + (f" ({ids[lab['number']]})" if lab["number"] in ids else "") for lab in labs]
    )
    possible = [
        next(
            (_weighted(g["labs"][str(lab["number"])], "max_points") for g in grades["students"].values()),
            lab.get("max_points", ""),
        )
        for lab in labs
    ]
    w.writerow(["    Points Possible", "", "", "", ""] + possible)
    for student, mine in grades["students"].items():
        info = _roster_of(results, student)
        cells = []
        for lab in labs:
            p = mine["labs"][str(lab["number"])]
            cells.append(
                MISSING[missing]
                if p["status"] == "missing" and "overridden" not in p
                else _weighted(p, "points")
            )
        w.writerow(
            [
                _cell(info.get("name") or student),
                _cell(info.get("lms_id", "")),
                _cell(student),
                _cell(info.get("email", "")),
                _cell(info.get("section", "")),
            ]
            + cells
        )
    return buf.getvalue()


def _weighted(lab: dict, key: str) -> float | int:
    """A lab's points (or points possible) times its weight: what the lab adds to the kit's total."""
    value = lab[key] * lab.get("weight", 1)
    return int(value) if float(value).is_integer() else round(float(value), 4)


def _lab_column(lab: dict) -> str:
    title = lab.get("title") or lab["name"]
    return title if title.lower().replace(" ", "-").startswith(lab["name"]) else f"{lab['name']}: {title}"


def to_wide(results: dict) -> str:
    grades = policy.grades(results)
    labs = results.get("labs", [])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = ["student", "name", "email", "lms_id", "section"]
    for lab in labs:
        header += [lab["name"], f"{lab['name']} max", f"{lab['name']} status"]
    w.writerow(header + ["total", "total max", "rule"])
    for student, mine in grades["students"].items():
        info = _roster_of(results, student)
        line = [_cell(student)] + [_cell(info.get(c, "")) for c in ("name", "email", "lms_id", "section")]
        for lab in labs:
            p = mine["labs"][str(lab["number"])]
            line += [p["points"], p["max_points"], p["status"]]
        w.writerow(line + [mine["points"], mine["max_points"], grades["rule"]])
    return buf.getvalue()


def export(results: dict, fmt: str, missing: str = "blank") -> str:
    if not results.get("students"):
        raise LmsError("the results have no students: nothing to export")
    if results.get("provisional"):
        raise LmsError(
            f"these grades are {results['provisional']}: grade again with every required "
            "configuration before exporting to an LMS"
        )
    if fmt == "canvas":
        return to_canvas(results, missing)
    if fmt == "wide":
        return to_wide(results)
    raise LmsError(f"unknown export format {fmt!r} (canvas, wide)")
