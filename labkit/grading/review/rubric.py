"""The rubric a written answer is graded by: items, each worth some points, per lab.

    OUT/course/rubric.toml
    [labs.14]
    question = "the design note"
    [[labs.14.items]]
    name = "why this mesh"          # the item's name in adjustments.csv and in the student's feedback
    max = 1                         # the points it is worth
    says = "its shape and axes follow from the sizes and the budgets"   # what the TA looks for

Where the course keeps none, the kit's: lab 14's design note by the rubric docs/grading.md gives, and any
other lab's write-up as one item of DEFAULT_MAX points. At most nine items a lab: keys 1 to 9 apply them.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

FILE = "rubric.toml"  # in OUT/course/
DEFAULT_MAX = 5
MOST_ITEMS = 9


class RubricError(ValueError):
    """A rubric file that cannot be used: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Item:
    name: str
    max: float
    says: str


@dataclass(frozen=True)
class Rubric:
    lab: int
    question: str
    items: tuple[Item, ...]


KIT = {
    14: Rubric(
        14,
        "the design note",
        (
            Item("why this mesh", 1, "its shape and axes follow from the sizes and the budgets"),
            Item(
                "what each device holds",
                2,
                "each weight's, the momentum's and the batch's piece, and what is whole only for a while",
            ),
            Item(
                "what it sends",
                2,
                "each collective, over which axis, its bytes per device against the budget, matching the cost card",
            ),
        ),
    )
}


def default(lab: int) -> Rubric:
    return KIT.get(lab) or Rubric(lab, "the write-up", (Item("write-up", DEFAULT_MAX, "the written answer"),))


def load(course: Path) -> dict[int, Rubric]:
    """The course's rubrics by lab (none where it keeps no rubric file); RubricError for a bad file."""
    path = Path(course) / FILE
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise RubricError(f"{path}: cannot be read ({e})") from None
    labs = data.get("labs", {})
    if not isinstance(labs, dict):
        raise RubricError(f"{path}: [labs.N] tables expected")
    return {int(lab): _rubric(path, lab, table) for lab, table in labs.items() if _is_lab(path, lab)}


def _is_lab(path: Path, lab: str) -> bool:
    if not lab.isdigit():
        raise RubricError(f"{path}: [labs.{lab}]: a lab is a number")
    return True


def _rubric(path: Path, lab: str, table: object) -> Rubric:
    where = f"{path}: [labs.{lab}]"
    items = table.get("items") if isinstance(table, dict) else None
    if not isinstance(items, list) or not 1 <= len(items) <= MOST_ITEMS:
        raise RubricError(f"{where}: give 1 to {MOST_ITEMS} [[labs.{lab}.items]]")
    out = []
    for n, item in enumerate(items, 1):
        name = item.get("name") if isinstance(item, dict) else None
        most = item.get("max") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name.strip() or "," in name or len(name) > 80:
            raise RubricError(f"{where}, item {n}: a name of 1 to 80 characters, without a comma")
        if (
            isinstance(most, bool)
            or not isinstance(most, int | float)
            or not math.isfinite(most)
            or most <= 0
        ):
            raise RubricError(f"{where}, item {n}: max is a number of points above 0")
        out.append(Item(name.strip(), most, str(item.get("says", "")).strip() or name.strip()))
    if len({i.name for i in out}) != len(out):
        raise RubricError(f"{where}: two items have the same name")
    question = table.get("question", "the written answer") if isinstance(table, dict) else ""
    return Rubric(int(lab), str(question), tuple(out))
