"""A narrower run: the units it grades again, and every other unit of the term held as it was.

`make grade LABS=3 STUDENTS=s008` after a term of labs 3 and 5 grades s008's lab 3 again; every other
student's lab 3, everyone's lab 5 (and its override, adjustments and feedback, which are drawn from these
rows) are what the last run's results (OUT/scoreboard.json) said of them, row for row. A unit the last
run has no row for (a student new to the class, a lab new to the term) is graded whatever the run names:
there is nothing to hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading.intake.collect import Submissions


@dataclass
class Previous:
    """What the last run's results say: rows by (student, lab, config), labs by number, each submission."""

    rows: dict[tuple[str, int, str], dict] = field(default_factory=dict)
    labs: dict[int, dict] = field(default_factory=dict)
    submissions: dict[tuple[str, int], dict] = field(default_factory=dict)


def previous(out: Path) -> Previous:
    """The results already in OUT (none where there are none, or they cannot be read: then nothing is held)."""
    try:
        results = json.loads((Path(out) / "scoreboard.json").read_text())
        rows = {(r["student"], int(r["lab"]), r["config"]): r for r in results.get("rows", [])}
        labs = {int(lab["number"]): lab for lab in results.get("labs", [])}
        subs = {
            (student, int(lab)): info
            for student, entry in results.get("students", {}).items()
            for lab, info in (entry.get("submissions") or {}).items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Previous()
    return Previous(rows, labs, subs)


@dataclass
class Todo:
    """The part of the term a run grades: the labs with a unit to grade, and each (student, lab) of one."""

    labs: set[int]
    pairs: set[tuple[str, int]]

    def handed_in(self, subs: Submissions) -> Submissions:
        """The notebooks of the units graded (kept in OUT/history, fingerprinted); the others are held."""
        return Submissions(
            students={
                s: {lab: p for lab, p in by.items() if (s, lab) in self.pairs}
                for s, by in subs.students.items()
            }
        )


@dataclass
class Selection:
    """Which units of the term this run grades; the others are held from `previous`."""

    labs: set[int]
    configs: set[str]
    students: set[str]  # empty: every student
    previous: Previous

    def grades(self, student: str, lab: int, config: str) -> bool:
        if (student, lab, config) not in self.previous.rows:
            return True  # nothing to hold
        return lab in self.labs and config in self.configs and (not self.students or student in self.students)

    def units(self, students: list[str], labs: list, configs: list) -> Todo:
        pairs = {
            (s, lab.number)
            for s in students
            for lab in labs
            for c in configs
            if self.grades(s, lab.number, c.name)
        }
        return Todo({lab for _, lab in pairs}, pairs)

    def rows(self, graded: list[dict], students: list[str], labs: list, configs: list) -> list[dict]:
        """The term's rows in the order of a whole run: those graded now, and every other one held."""
        now = {(r["student"], r["lab"], r["config"]): r for r in graded}
        order = [(s, lab.number, c.name) for s in students for lab in labs for c in configs]
        return [now[k] if k in now else self.previous.rows[k] for k in order]

    def held_submissions(self, todo: Todo, students: list[str], labs: list) -> dict[tuple[str, int], dict]:
        """What the last results said of each submission whose units are all held (its digest, times, code)."""
        numbers, ids = {lab.number for lab in labs}, set(students)
        return {
            (s, lab): v
            for (s, lab), v in self.previous.submissions.items()
            if (s, lab) not in todo.pairs and s in ids and lab in numbers
        }

    def hold_labs(self, results: dict, graded: set[int]) -> None:
        """A lab none of whose units was graded keeps the last results' entry (its tests and points, drawn
        from references this run did not run)."""
        results["labs"] = [
            self.previous.labs.get(entry["number"], entry) if entry["number"] not in graded else entry
            for entry in results["labs"]
        ]
