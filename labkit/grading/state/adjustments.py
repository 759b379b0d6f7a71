"""A TA's point adjustments and rubric items, each with a comment the student reads in their feedback.

    student,lab,points,comment,item,max
    alice,3,-1,"the mesh axis names are swapped in the write-up",,
    bob,3,0.5,"a clear explanation of the all-gather",,
    alice,14,4,"the design explains the pipeline's bubble; the cost estimate is missing",design write-up,5

A line without `item` adjusts the lab's points by `points` (a signed number: a bonus or a
deduction) and says why in `comment`. A line with `item` grades one rubric item of a written
answer (the capstone's design write-up, say): `points` of the item's `max`, which are added to the
lab's possible points for every student (a student without a line for the item has 0 of it, "not
graded"). An item's `max` is the same on every line that names it.

They are applied after everything else a grade is made of (labkit/grading/state/policy.py's `grades`):
the policy's rule, the late penalty (which takes its share of the tests' points only), a TA's
points override; a lab's points never go below 0. The file is read at every grading run and
carried in the results (`adjustments`), so grades.csv, the feedback and the exports include it.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from labkit.grading.state.overrides import student_and_lab

COLUMNS = ("student", "lab", "points", "comment", "item", "max")


class AdjustmentError(ValueError):
    """An adjustments file that cannot be used: the message names the file and the line."""


def _number(text: str, what: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise AdjustmentError(f"{where}: {what} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise AdjustmentError(f"{where}: {what} must be a finite number, got {text!r}")
    return int(value) if value.is_integer() else round(value, 4)


def parse(text: str, source: str, students: set[str], labs: set[int]) -> list[dict]:
    """The adjustments, each checked against the class (students) and the labs graded."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    reader.fieldnames = _header(reader.fieldnames or [], source)
    out: list[dict] = []
    items: dict[tuple[int, str], tuple[float, int]] = {}  # (lab, item) -> (its max, the line that said so)
    seen: dict[tuple, int] = {}  # (student, lab, item) -> the line that graded it
    for line in reader:
        n = reader.line_num
        where = f"{source}, line {n}"
        if None in line:
            raise AdjustmentError(
                f"{where}: more cells than the header has columns (put a comment with a comma "
                "in double quotes)"
            )
        get = {c: (line.get(c) or "").strip() for c in COLUMNS}
        if not any(get.values()):
            continue
        entry = _entry(get, where, n, students, labs)
        if get["item"]:
            _rubric_item(entry, get, where, n, items, seen)
        elif get["max"]:
            raise AdjustmentError(f"{where}: max is for a rubric item: name the item, or leave max empty")
        elif entry["points"] == 0:
            raise AdjustmentError(
                f"{where}: an adjustment of 0 points changes nothing; give the points it adds or takes away"
            )
        out.append(entry)
    return out


def _header(fieldnames: Sequence[str], source: str) -> list[str]:
    """The file's columns, lower case: every required one there, none unknown."""
    header = [h.strip().lower() for h in fieldnames]
    missing = {"student", "lab", "points", "comment"} - set(header)
    if missing:
        raise AdjustmentError(
            f"{source}, line 1: missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(sorted(missing))} (expected {','.join(COLUMNS)})"
        )
    unknown = sorted(set(header) - set(COLUMNS))
    if unknown:
        raise AdjustmentError(
            f"{source}, line 1: unknown column{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} (expected {','.join(COLUMNS)})"
        )
    return header


def _entry(get: dict[str, str], where: str, n: int, students: set[str], labs: set[int]) -> dict:
    """One line's student, lab, points and comment, each checked."""
    lab = student_and_lab(get, where, students, labs, AdjustmentError)
    if not get["comment"]:
        raise AdjustmentError(
            f"{where}: a comment is required: it is what the student reads about these points"
        )
    return {
        "student": get["student"],
        "lab": lab,
        "points": _number(get["points"], "points", where),
        "comment": get["comment"],
        "line": n,
    }


def _rubric_item(entry: dict, get: dict[str, str], where: str, n: int, items: dict, seen: dict) -> None:
    """Make `entry` a rubric item's grade: its max the same on every line that names the item, its points
    within it, and one grade per student and item (`items` and `seen` hold what earlier lines said)."""
    if not get["max"]:
        raise AdjustmentError(
            f"{where}: the rubric item {get['item']!r} needs its max (the points it is worth)"
        )
    most = _number(get["max"], "max", where)
    if most <= 0:
        raise AdjustmentError(f"{where}: max must be more than 0, got {get['max']!r}")
    key = (entry["lab"], get["item"])
    if key in items and items[key][0] != most:
        raise AdjustmentError(
            f"{where}: the rubric item {get['item']!r} of lab {entry['lab']} is worth {most:g} here "
            f"but {items[key][0]:g} on line {items[key][1]}"
        )
    items.setdefault(key, (most, n))
    if not 0 <= entry["points"] <= most:
        raise AdjustmentError(
            f"{where}: points must be between 0 and the item's max {most:g}, got {get['points']!r}"
        )
    mark = (entry["student"], *key)
    if mark in seen:
        raise AdjustmentError(f"{where}: grades the same rubric item as line {seen[mark]}")
    seen[mark] = n
    entry.update(item=get["item"], max=most)


def load(path: Path, students: set[str], labs: set[int]) -> list[dict]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise AdjustmentError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise AdjustmentError(f"{path}: not UTF-8 text (save it as CSV UTF-8)") from None
    return parse(text, str(path), students, labs)


def items_of(adjustments: list[dict]) -> dict[int, dict[str, float]]:
    """lab -> rubric item -> its max: what every student's lab is worth beyond its tests."""
    out: dict[int, dict[str, float]] = {}
    for a in adjustments:
        if "item" in a:
            out.setdefault(a["lab"], {})[a["item"]] = a["max"]
    return out


def applied(points: float, most: float, mine: list[dict], items: dict[str, float]) -> dict:
    """One student's lab after their adjustments and rubric items: points (never below 0), max_points, and what
    the student is shown (`adjustments`: each line's points, comment and, for an item, its name and max)."""
    shown, graded = [], set()
    for a in mine:
        shown.append({k: a[k] for k in ("points", "comment", "item", "max") if k in a})
        points += a["points"]
        graded.add(a.get("item"))
    for item, worth in sorted(items.items()):
        if item not in graded:
            shown.append({"points": 0, "comment": "not graded", "item": item, "max": worth})
    most += sum(items.values())
    return {"points": max(0, points), "max_points": most, "adjustments": shown}


def words(a: dict) -> str:
    """One adjustment as a student reads it."""
    if "item" in a:
        return f"{a['item']}: {a['points']:g}/{a['max']:g} ({a['comment']})"
    return f"{a['points']:+g} ({a['comment']})"
