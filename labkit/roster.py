"""The class list: who is in the course, so that a student who handed in nothing still gets a grade.

    student,name,email,lms_id,section
    alice,Alice Liddell,alice@uni.edu,4411,A

`student` is required: the id used as the submission folder name (or matched from an LMS file
name through `lms_id`, `email` or `student`). The other columns are optional and carried into
the results, where the LMS exports read them.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

COLUMNS = ("student", "name", "email", "lms_id", "section")


class RosterError(ValueError):
    """The roster cannot be used: the message names the file and the line."""


@dataclass
class Roster:
    students: dict[str, dict[str, str]] = field(default_factory=dict)  # id -> {name, email, lms_id, section}
    source: str = ""

    def ids(self) -> list[str]:
        return sorted(self.students)

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
    header = [h.strip().lower() for h in header]
    if "student" not in header:
        raise RosterError(f"{source}, line 1: the header has no `student` column (it has: {', '.join(header)}); "
                          f"expected columns {', '.join(COLUMNS)} (only `student` is required)")
    dupes = sorted({h for h in header if header.count(h) > 1 and h})
    if dupes:
        raise RosterError(f"{source}, line 1: the column{'s' if len(dupes) > 1 else ''} "
                          f"{', '.join(dupes)} appear{'' if len(dupes) > 1 else 's'} twice")
    roster = Roster(source=source)
    first_line: dict[str, int] = {}
    taken: dict[tuple[str, str], int] = {}
    try:
        for values in reader:
            line = reader.line_num
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise RosterError(f"{source}, line {line}: {len(values)} fields where the header has "
                                  f"{len(header)} ({', '.join(header)})")
            info = {h: v.strip() for h, v in zip(header, values) if h}
            sid = info.pop("student")
            if not sid:
                raise RosterError(f"{source}, line {line}: the student id is empty")
            if sid in (".", "..") or "/" in sid or "\\" in sid or sid.startswith("."):
                raise RosterError(f"{source}, line {line}: {sid!r} cannot be a student id (it is used as a folder name)")
            if sid in first_line:
                raise RosterError(f"{source}, line {line}: the student id {sid!r} is already on line "
                                  f"{first_line[sid]}")
            for column in ("lms_id", "email"):
                value = info.get(column, "")
                if value and (column, value) in taken:
                    raise RosterError(f"{source}, line {line}: {column} {value!r} is already on line "
                                      f"{taken[column, value]}")
                if value:
                    taken[column, value] = line
            first_line[sid] = line
            roster.students[sid] = {c: info.get(c, "") for c in COLUMNS[1:]}
    except csv.Error as e:
        raise RosterError(f"{source}, line {reader.line_num}: not CSV ({e})") from None
    if not roster.students:
        raise RosterError(f"{source}: no students (only a header line)")
    return roster


def load(path: Path) -> Roster:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RosterError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise RosterError(f"{path}: not UTF-8 text (save the roster as CSV UTF-8)") from None
    return parse(text, str(path))
