"""Due dates, the late policy and extensions: how much of a lab's points a late submission keeps.

Due dates and the late policy are in the course's policy file::

    [labs.3]
    due = 2026-03-01T23:59:00-08:00

    [late]
    per_day = 0.1        # a tenth of the lab's points per day (or part of a day) late
    cap = 0.5            # never more than half
    grace_minutes = 15   # up to 15 minutes late is on time

An extensions file (CSV: student, lab, days) moves one student's due date for one lab. The
submission time comes from the LMS's metadata, or else from the time the kit collected the file
(labkit/history.py).
"""

from __future__ import annotations

import csv
import io
import math
import re
from datetime import datetime, timedelta
from pathlib import Path


class DeadlineError(ValueError):
    """An extensions file or a time that cannot be used: the message names the file and line."""


_NANOS = re.compile(r"^(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.\d+)?\s*(Z|[+-]\d\d:?\d\d)?$")


def parse_time(text: str) -> datetime:
    """ISO 8601, or Gradescope's `2026-03-01 10:00:00.000000000 -08:00`; always with an offset."""
    m = _NANOS.match(str(text).strip())
    if not m:
        raise DeadlineError(f"{text!r} is not a date and time")
    zone = m.group(3)
    if not zone:
        raise DeadlineError(f"{text!r} has no time zone offset")
    zone = "+00:00" if zone == "Z" else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
    return datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}{zone}")


def penalty(submitted: str | None, due: str | None, late: dict, extension_days: float = 0) -> tuple[float, float]:
    """(the fraction of points taken, the days late counted) for one submission."""
    if not submitted or not due:
        return 0.0, 0.0
    deadline = parse_time(due) + timedelta(days=extension_days)
    over = parse_time(submitted) - deadline
    if over <= timedelta(minutes=late.get("grace_minutes", 0)):
        return 0.0, 0.0
    days = math.ceil(over / timedelta(days=1))
    taken = min(late.get("per_day", 0) * days, late.get("cap", 1))
    return round(taken, 4), days


def parse_extensions(text: str, source: str, students: set[str], labs: set[int]) -> dict[str, dict[str, float]]:
    """student -> lab (as text) -> days; every line's student and lab must be in the class."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    missing = {"student", "lab", "days"} - set(reader.fieldnames or [])
    if missing:
        raise DeadlineError(f"{source}, line 1: missing column{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(sorted(missing))} (expected student,lab,days)")
    out: dict[str, dict[str, float]] = {}
    for line in reader:
        n = reader.line_num
        student, lab = (line["student"] or "").strip(), (line["lab"] or "").strip().removeprefix("lab-")
        if student not in students:
            raise DeadlineError(f"{source}, line {n}: no student {student!r} in this class")
        if not lab.isdigit() or int(lab) not in labs:
            raise DeadlineError(f"{source}, line {n}: no lab {line['lab']!r} graded here")
        try:
            days = float(line["days"])
        except (TypeError, ValueError):
            raise DeadlineError(f"{source}, line {n}: days must be a number, got {line['days']!r}") from None
        if days < 0:
            raise DeadlineError(f"{source}, line {n}: days must not be negative")
        out.setdefault(student, {})[str(int(lab))] = days
    return out


def load_extensions(path: Path, students: set[str], labs: set[int]) -> dict[str, dict[str, float]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise DeadlineError(f"{path}: cannot be read ({e.strerror or e})") from None
    return parse_extensions(text, str(path), students, labs)
