"""The one schema every CSV file a TA gives is read with: roster, overrides, extensions, adjustments.

Each file declares its columns (`Column`: a name, whether the header must have it); `read` then checks,
for every file alike and before anything is graded:

* the header: every required column there, none unknown, none twice (a typo such as `comments` would
  otherwise drop what is under it without a word);
* every line: exactly as many fields as the header has columns. One short (a field left out) or one
  more (an unquoted comma in a comment, which would cut the comment) is refused; a line of only
  commas or spaces is skipped;
* each id (`student`): Unicode NFC, so that `josé` typed on one machine and `josé` written by another
  (a macOS folder name is NFD) are one student;
* values: numbers finite and within their range (`Line.number`), students of the class, labs graded.

Every refusal has one shape, whatever the file: `FILE, line N: what is wrong (field F; fix: what to do)`,
raised as the file's own error class (a ValueError), so `grade` exits 2 naming it.
"""

from __future__ import annotations

import csv
import io
import math
import unicodedata
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

ID_COLUMNS = ("student",)  # normalised to NFC wherever they are read


def nfc(text: str) -> str:
    """An id as the kit compares it: Unicode NFC (what a roster typed on most systems holds)."""
    return unicodedata.normalize("NFC", text)


def message(source: str, line: int | None, problem: str, field: str = "", fix: str = "") -> str:
    """The one shape of every refusal of a TA's file: where, what, which field, and the fix."""
    where = f"{source}, line {line}" if line else source
    tail = "; ".join(
        part for part in (f"field {field}" if field else "", f"fix: {fix}" if fix else "") if part
    )
    return f"{where}: {problem}" + (f" ({tail})" if tail else "")


@dataclass(frozen=True)
class Column:
    name: str
    required: bool = False


@dataclass
class Line:
    """One line of a TA's file: its number, its fields by column (stripped; '' where the header lacks one)."""

    source: str
    number: int
    fields: dict[str, str]
    error: type[ValueError]

    def __getitem__(self, column: str) -> str:
        return self.fields.get(column, "")

    def fail(self, problem: str, field: str = "", fix: str = "") -> ValueError:
        return self.error(message(self.source, self.number, problem, field, fix))

    def number_in(
        self, column: str, low: float | None = None, high: float | None = None, fix: str = ""
    ) -> float:
        """The column's value as a finite number within [low, high] (either bound may be left open)."""
        text = self[column]
        try:
            value = float(text)
        except ValueError:
            raise self.fail(
                f"{column} must be a number, got {text!r}", column, fix or "write a number such as 2 or 1.5"
            ) from None
        if not math.isfinite(value):
            raise self.fail(
                f"{column} must be a finite number, got {text!r}",
                column,
                fix or "write a number such as 2 or 1.5",
            )
        if low is not None and value < low:
            what = "must not be negative" if low == 0 else f"must be at least {low:g}"
            raise self.fail(f"{column} {what}, got {text!r}", column, fix)
        if high is not None and value > high:
            raise self.fail(f"{column} must be at most {high:g}, got {text!r}", column, fix)
        return int(value) if value.is_integer() else round(value, 4)

    def in_class(self, students: Collection[str], inactive: list[str] | None) -> bool:
        """Whether the line's student is in the class. Where `inactive` is a list (a kept file, checked again
        after the roster changed), a student no longer in it leaves the line kept but inactive, said there;
        else such a line is refused."""
        if self["student"] in students or inactive is None:
            self.student(students)
            return True
        inactive.append(
            message(
                self.source,
                self.number,
                f"{self['student']!r} is not in the class now (dropped from the roster?): this line is kept, "
                "inactive, and applies again if they return",
                "student",
                "nothing, to keep it so; to remove it, give the file again without the line",
            )
        )
        return False

    def student(self, students: Collection[str]) -> str:
        sid = self["student"]
        if sid not in students:
            known = sorted(students)
            example = f" (such as {known[0]!r})" if known else ""
            raise self.fail(
                f"no student {sid!r} in this class",
                "student",
                f"use an id of the roster{example}, or add the student to the roster",
            )
        return sid

    def lab(self, labs: Collection[int]) -> int:
        text = self["lab"].removeprefix("lab-")
        if not text.isdigit() or int(text) not in labs:
            raise self.fail(
                f"no lab {self['lab']!r} graded here (labs: {', '.join(map(str, sorted(labs)))})",
                "lab",
                "write the lab's number, such as 3",
            )
        return int(text)


def read(
    text: str, source: str, columns: Sequence[Column], error: type[ValueError], *, lower: bool = True
) -> Iterator[Line]:
    """The lines of a TA's CSV file, each checked for its field count, ids in NFC; `error` for any refusal."""
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))
    try:
        header = next(reader)
    except StopIteration:
        raise error(
            message(source, None, "empty", fix=f"start with the header {','.join(c.name for c in columns)}")
        ) from None
    except csv.Error as e:
        raise error(message(source, 1, f"not CSV ({e})")) from None
    header = [h.strip().lower() if lower else h.strip() for h in header]
    expected = ",".join(c.name for c in columns)
    missing = [c.name for c in columns if c.required and c.name not in header]
    if missing:
        raise error(
            message(
                source,
                1,
                f"missing column{'s' if len(missing) > 1 else ''} {', '.join(sorted(missing))}",
                ", ".join(sorted(missing)),
                fix=f"the header is {expected} (only {', '.join(c.name for c in columns if c.required)} required)",
            )
        )
    known = {c.name for c in columns}
    unknown = [h for h in header if h not in known]
    if unknown:
        raise error(
            message(
                source,
                1,
                f"unknown column{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                ", ".join(unknown),
                fix=f"the columns are {expected}",
            )
        )
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        raise error(
            message(source, 1, f"the column {', '.join(twice)} appears twice", ", ".join(twice), "keep one")
        )
    try:
        for values in reader:
            n = reader.line_num
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise error(field_count(source, n, values, header))
            fields = {h: v.strip() for h, v in zip(header, values)}
            for column in ID_COLUMNS:
                if column in fields:
                    fields[column] = nfc(fields[column])
            yield Line(source, n, fields, error)
    except csv.Error as e:
        raise error(
            message(source, reader.line_num, f"not CSV ({e})", fix="check the line's double quotes")
        ) from None


def field_count(source: str, n: int, values: list[str], header: list[str]) -> str:
    """Why a line with the wrong number of fields is refused, and what to do about it."""
    if len(values) > len(header):
        return message(
            source,
            n,
            f"{len(values)} fields where the header has {len(header)} ({','.join(header)}): an unquoted "
            "comma would cut the text after it",
            header[-1],
            'put a text with a comma in double quotes: "like, this"',
        )
    left = header[len(values)]
    return message(
        source,
        n,
        f"{len(values)} fields where the header has {len(header)} ({','.join(header)})",
        left,
        "give every field, an empty one as nothing between two commas (bob,3,,test_x,passed,)",
    )
