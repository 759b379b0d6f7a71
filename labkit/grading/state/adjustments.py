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

from collections.abc import Mapping
from pathlib import Path

from labkit.grading.state import table

COLUMNS = tuple(
    table.Column(name, required=name in ("student", "lab", "points", "comment"))
    for name in ("student", "lab", "points", "comment", "item", "max")
)


class AdjustmentError(ValueError):
    """An adjustments file that cannot be used: the message names the file and the line."""


def parse(
    text: str,
    source: str,
    students: set[str],
    labs: set[int],
    lab_points: Mapping[int, float] | None = None,
    inactive: list[str] | None = None,
) -> list[dict]:
    """The adjustments, each checked against the class (students) and the labs graded.

    An adjustment without an item takes away or adds at most the lab's points (`lab_points`, where known)."""
    out: list[dict] = []
    items: dict[tuple[int, str], tuple[float, int]] = {}  # (lab, item) -> (its max, the line that said so)
    seen: dict[tuple, int] = {}  # (student, lab, item) -> the line that graded it
    for line in table.read(text, source, COLUMNS, AdjustmentError):
        if not line.in_class(students, inactive):  # a kept line of a student dropped from the roster
            continue
        entry = _entry(line, students, labs)
        if line["item"]:
            _rubric_item(entry, line, items, seen)
            out.append(entry)
            continue
        if line["max"]:
            raise line.fail("max is for a rubric item", "max", "name the item, or leave max empty")
        most = (lab_points or {}).get(entry["lab"])
        if most is not None:
            entry["points"] = line.number_in(
                "points",
                -most,
                most,
                f"lab {entry['lab']} is worth {most:g} points: an adjustment adds or takes at most that",
            )
        if entry["points"] == 0:
            raise line.fail(
                "an adjustment of 0 points changes nothing",
                "points",
                "give the points it adds or takes away",
            )
        out.append(entry)
    return out


def _entry(line: table.Line, students: set[str], labs: set[int]) -> dict:
    """One line's student, lab, points and comment, each checked."""
    line.student(students)
    lab = line.lab(labs)
    if not line["comment"]:
        raise line.fail(
            "a comment is required: it is what the student reads about these points",
            "comment",
            "write why, in double quotes where it has a comma",
        )
    return {
        "student": line["student"],
        "lab": lab,
        "points": line.number_in("points"),
        "comment": line["comment"],
        "line": line.number,
    }


def _rubric_item(entry: dict, line: table.Line, items: dict, seen: dict) -> None:
    """Make `entry` a rubric item's grade: its max the same on every line that names the item, its points
    within it, and one grade per student and item (`items` and `seen` hold what earlier lines said)."""
    item, n = line["item"], line.number
    if not line["max"]:
        raise line.fail(
            f"the rubric item {item!r} needs its max (the points it is worth)", "max", "write the item's max"
        )
    most = line.number_in("max")
    if most <= 0:
        raise line.fail(f"max must be more than 0, got {line['max']!r}", "max", "write the item's max")
    key = (entry["lab"], item)
    if key in items and items[key][0] != most:
        raise line.fail(
            f"the rubric item {item!r} of lab {entry['lab']} is worth {most:g} here "
            f"but {items[key][0]:g} on line {items[key][1]}",
            "max",
            "give the item one max on every line",
        )
    items.setdefault(key, (most, n))
    if not 0 <= entry["points"] <= most:
        raise line.fail(
            f"points must be between 0 and the item's max {most:g}, got {line['points']!r}",
            "points",
            f"give at most {most:g}",
        )
    mark = (entry["student"], *key)
    if mark in seen:
        raise line.fail(
            f"grades the same rubric item as line {seen[mark]}",
            "item",
            f"keep one of lines {seen[mark]} and {n}",
        )
    seen[mark] = n
    entry.update(item=item, max=most)


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
