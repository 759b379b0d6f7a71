"""The class list: who is in the course, so that a student who handed in nothing still gets a grade.

    student,name,email,lms_id,section,leaderboard,group
    alice,Alice Liddell,alice@uni.edu,4411,A,,team-1
    bob,Bob Katz,bob@uni.edu,4412,A,hide,team-1

`student` is required: the id used as the submission folder name (or matched from an LMS file
name through `lms_id`, `email` or `student`). The other columns are optional and carried into
the results, where the LMS exports read them. `leaderboard`: `hide` for a student who asked to
be shown as "anonymous" on the class leaderboards (labkit/grading/classwide/leaderboard.py); empty or `show` shows
their id. `group`: students who hand in one submission together (for a course that collects group
work outside Gradescope, whose export names every member itself): where one member of a group
handed in a lab, every member without a submission of their own is credited with it, with a note
(`credit_groups`); where two members handed in different ones, none is credited and each is told.

A Canvas gradebook export (Grades > Export) is read as one: its header `Student, ID, SIS User ID,
SIS Login ID, Section, <assignments>...` gives name, lms_id (ID), the student id (SIS User ID, or
the SIS Login ID where there is none), email (the SIS Login ID when it is an address) and section;
its `Points Possible` row (and a `Manual Posting` or `Muted` row above it) and Canvas's
`Test Student` are not students and are skipped.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading.state import table

COLUMNS = ("student", "name", "email", "lms_id", "section", "leaderboard", "group")
LEADERBOARD_CHOICES = (
    "",
    "show",
    "hide",
)  # the `leaderboard` column (labkit/grading/classwide/leaderboard.py)
CANVAS_HEADER = ("student", "id", "sis user id", "sis login id")  # a Canvas gradebook's first columns
CANVAS_TEST_STUDENT = {"test student", "student, test"}  # the student view's account, in either name order


class RosterError(ValueError):
    """The roster cannot be used: the message names the file and the line."""


@dataclass
class Roster:
    # id -> {name, email, lms_id, section}, and leaderboard and group where the line gives them
    students: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str = ""

    def ids(self) -> list[str]:
        return sorted(self.students)

    def groups(self) -> dict[str, list[str]]:
        """group -> its members, for the students whose line names a group."""
        out: dict[str, list[str]] = {}
        for student in sorted(self.students):
            group = self.students[student].get("group")
            if group:
                out.setdefault(group, []).append(student)
        return out

    def by(self, column: str) -> dict[str, str]:
        """value of `column` -> student id, for the rows that have one."""
        return {info[column]: s for s, info in self.students.items() if info.get(column)}


def parse(text: str, source: str = "roster.csv") -> Roster:
    text = text.removeprefix("\ufeff")  # a spreadsheet's byte order mark
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise RosterError(f"{source}: empty; it needs a header line with a `student` column") from None
    except csv.Error as e:
        raise RosterError(f"{source}, line 1: not CSV ({e})") from None
    header, canvas = _header(header, source)
    roster = Roster(source=source)
    seen = _Seen()
    try:
        for values in reader:
            line = reader.line_num
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise RosterError(table.field_count(source, line, values, header))
            if canvas:
                info = _canvas_line(dict(zip(header, values)), source, line)
                if info is None:
                    continue
            else:
                info = {h: v.strip() for h, v in zip(header, values) if h}
            sid, entry = _student(info, f"{source}, line {line}", line, seen)
            roster.students[sid] = entry
    except csv.Error as e:
        raise RosterError(f"{source}, line {reader.line_num}: not CSV ({e})") from None
    if not roster.students:
        raise RosterError(f"{source}: no students (only a header line)")
    return roster


def _header(header: list[str], source: str) -> tuple[list[str], bool]:
    """The roster's columns, lower case, and whether they are a Canvas gradebook export's."""
    header = [h.strip().lower() for h in header]
    canvas = all(h in header for h in CANVAS_HEADER)
    if "student" not in header:
        raise RosterError(
            f"{source}, line 1: the header has no `student` column (it has: {', '.join(header)}); "
            f"expected columns {', '.join(COLUMNS)} (only `student` is required)"
        )
    dupes = sorted({h for h in header if header.count(h) > 1 and h})
    if dupes and not canvas:  # two Canvas assignments may share a title; only the first columns are read
        raise RosterError(
            f"{source}, line 1: the column{'s' if len(dupes) > 1 else ''} "
            f"{', '.join(dupes)} appear{'' if len(dupes) > 1 else 's'} twice"
        )
    return header, canvas


@dataclass
class _Seen:
    """What earlier lines of the roster named: each student id's line, and each (lms_id or email, value)'s."""

    ids: dict[str, int] = field(default_factory=dict)
    taken: dict[tuple[str, str], int] = field(default_factory=dict)


def _student(info: dict[str, str], where: str, line: int, seen: _Seen) -> tuple[str, dict[str, str]]:
    """One roster line's student id and entry, each checked against the lines before it (`seen`)."""
    sid = table.nfc(info.pop("student"))  # one id however the machine that typed it composed its letters
    if not sid:
        raise RosterError(f"{where}: the student id is empty (field student; fix: give every line its id)")
    if sid in (".", "..") or "/" in sid or "\\" in sid or sid.startswith("."):
        raise RosterError(f"{where}: {sid!r} cannot be a student id (it is used as a folder name)")
    if sid in seen.ids:
        raise RosterError(
            f"{where}: the student id {sid!r} is already on line {seen.ids[sid]} "
            f"(field student; fix: one line per student, ids compared in Unicode NFC)"
        )
    for column in ("lms_id", "email"):
        value = info.get(column, "")
        if value and (column, value) in seen.taken:
            raise RosterError(
                f"{where}: {column} {value!r} is already on line {seen.taken[column, value]} "
                f"(field {column}; fix: each student's own {column}, or leave it empty)"
            )
        if value:
            seen.taken[column, value] = line
    if info.get("leaderboard", "").lower() not in LEADERBOARD_CHOICES:
        raise RosterError(
            f"{where}: leaderboard {info['leaderboard']!r} is neither `hide` "
            "(shown as anonymous on the class leaderboards) nor `show` (or empty: shown by id)"
        )
    seen.ids[sid] = line
    entry = {c: info.get(c, "") for c in COLUMNS[1:5]}
    leaderboard = info.get("leaderboard", "").lower()
    if leaderboard:  # only where the line says, so that a roster without the column reads as before
        entry["leaderboard"] = leaderboard
    if info.get("group"):
        entry["group"] = info["group"]
    return sid, entry


def _canvas_line(cells: dict[str, str], source: str, line: int) -> dict[str, str] | None:
    """One line of a Canvas gradebook export as a roster line; None for a line that is not a student."""
    cells = {k: v.strip() for k, v in cells.items()}
    name, canvas_id = cells["student"], cells["id"]
    if (
        name.lower() in ("points possible", "muted", "manual posting", "")
        or name.lower() in CANVAS_TEST_STUDENT
    ):
        return None  # the Points Possible row, the Manual Posting / Muted row, Canvas's test student
    if not canvas_id.isdigit():
        raise RosterError(
            f"{source}, line {line}: a Canvas gradebook line whose ID is {canvas_id!r}, not Canvas's "
            "user number; export the gradebook from Canvas again, or make a roster with a "
            "`student` column"
        )
    sid = cells["sis user id"] or cells["sis login id"]
    if not sid:
        raise RosterError(
            f"{source}, line {line}: Canvas gives {name} (ID {canvas_id}) neither a SIS User ID nor "
            "a SIS Login ID, one of which is the kit's student id; make a roster with a `student` "
            "column (and lms_id for the Canvas ID)"
        )
    login = cells["sis login id"]
    return {
        "student": sid,
        "name": name,
        "lms_id": canvas_id,
        "email": login if "@" in login else "",
        "section": cells.get("section", ""),
    }


NO_SUBMISSION = (
    "no submission: nothing was handed in for this student"  # grade.py's note for a missing student
)


def credit_groups(
    people: Roster,
    students: dict[str, dict[int, Path]],
    notes: dict[str, list[str]],
    times: dict[tuple[str, int], dict],
) -> None:
    """Credit each group member without a submission of a lab with the one their group handed in.

    `students` (student -> lab -> notebook), `notes` (student -> notes) and `times` ((student, lab) ->
    what the LMS said of the submission) are the class read for grading, changed in place. A group
    where two or more members handed in the lab credits nobody else: which one counts is the TA's to say.
    """
    for group, members in sorted(people.groups().items()):
        labs = sorted({lab for m in members for lab in students.get(m, {})})
        for lab in labs:
            handed = [m for m in members if lab in students.get(m, {})]
            others = [m for m in members if m not in handed and m in students]
            if not others:
                continue
            if len(handed) > 1:
                for m in others:
                    notes.setdefault(m, []).append(
                        f"lab-{lab}: not credited: {' and '.join(handed)} both handed in lab-{lab} for group {group}, "
                        "so which one counts for you is not known; ask a TA (an override can give you the points)"
                    )
                continue
            (source,) = handed
            for m in others:
                students[m][lab] = students[source][lab]
                if (source, lab) in times:
                    times[m, lab] = times[source, lab]
                mine = notes.setdefault(m, [])
                if NO_SUBMISSION in mine:
                    mine.remove(NO_SUBMISSION)
                mine.append(
                    f"lab-{lab}: credited with the submission of {source}, in group {group} on the roster"
                )


def load(path: Path) -> Roster:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RosterError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise RosterError(f"{path}: not UTF-8 text (save the roster as CSV UTF-8)") from None
    return parse(text, str(path))
