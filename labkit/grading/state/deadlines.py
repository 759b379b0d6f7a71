"""Due dates, the late policy and extensions: how much of a lab's points a late submission keeps.

Due dates and the late policy are in the course's policy file::

    [labs.3]
    due = 2026-03-01T23:59:00-08:00

    [late]
    per_day = 0.1        # a tenth of the lab's points per day (or part of a day) late
    cap = 0.5            # never more than half
    grace_minutes = 15   # up to 15 minutes late is on time
    accept = ["gradescope", "canvas"]   # the time sources a late penalty may count from (the default)

An extensions file (CSV: student, lab, days) moves one student's due date for one lab.

Each submission records every time the kit knows for it, by source (SOURCES): Gradescope's
submission time, Canvas's (through its API; a bulk download's `_LATE` flag in a file's name is a
flag, not a time, and counts as one day), the time of the
file's last git commit, the file's modification time, and the time the kit collected it. A late
penalty counts from the most trustworthy of them that `[late] accept` lists, and from nothing
else: a submission with no accepted source is never charged, and the collection time (when a TA
happened to gather the class) can never be accepted. Every lab says which source its time came from.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

from labkit.grading.state import table

# Most trustworthy first: a late penalty counts from the first of these that is known and accepted.
SOURCES = {
    "gradescope": "Gradescope's submission time",
    "canvas": "Canvas's late flag (_LATE in the file's name), or its submission time through its API",
    "git": "the time of the file's last git commit",
    "mtime": "the file's modification time",
    "collected": "the time the kit collected the file",
}
ACCEPT_DEFAULT = ("gradescope", "canvas")
NEVER_ACCEPTED = {"collected": "it is when the class was gathered, not when the student handed in"}


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


def penalty(
    submitted: str | None, due: str | None, late: dict, extension_days: float = 0
) -> tuple[float, float]:
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


def charge(handed: dict | None, due: str | None, late: dict, extension_days: float = 0) -> dict:
    """What one submission is charged: {time_source, late_days, late_penalty, late_note}, only the keys that apply.

    `handed` is what the results say of the submission: `times` (source -> ISO time, None for
    Canvas's flag) and `late` (Canvas's flag). The time counts from the first source in SOURCES
    order that `late["accept"]` lists; time_source names it (or, when none is accepted, the best
    one known, with a note that it was not used).
    """
    handed = handed or {}
    times = handed.get("times")
    if times is None:  # results from before time sources were recorded: the time's origin is unknown
        times = {"collected": handed["submitted_at"]} if handed.get("submitted_at") else {}
    accept = [s for s in late.get("accept", ACCEPT_DEFAULT) if s not in NEVER_ACCEPTED]
    usable = [s for s in SOURCES if s in times and s in accept]
    known = [s for s in SOURCES if s in times]
    if not known:
        return {}
    source = (usable or known)[0]
    out: dict = {"time_source": source}
    if not due:
        return out
    if not usable:
        if _would_be_late(source, times, handed, due, late, extension_days):
            out["late_note"] = (
                f"late by {SOURCES[source]}, which the policy does not accept for late penalties "
                f"([late] accept = {list(accept)}): not charged"
            )
        return out
    if source == "canvas" and not times.get("canvas"):  # a download's flag: late or not, never when
        if not handed.get("late"):
            return out
        if extension_days:
            out["late_note"] = (
                f"Canvas marked it late, but it has an extension of {extension_days:g} days and "
                "Canvas's flag carries no time to compare with the new due date: not charged"
            )
            return out
        taken, days = round(min(late.get("per_day", 0), late.get("cap", 1)), 4), 1
        out["late_note"] = (
            "Canvas marked it late (_LATE), which carries no time: charged as 1 day late (collect "
            "with `labkit canvas collect` for the real time)"
        )
    else:
        try:
            taken, days = penalty(times[source], due, late, extension_days)
        except DeadlineError as e:
            out["late_note"] = f"{SOURCES[source]} cannot be read ({e}): not charged"
            return out
    if days:
        out.update(late_days=days, late_penalty=taken)
        out.setdefault(
            "late_note", f"{days:g} day{'s' if days != 1 else ''} late by {SOURCES[source]} ({times[source]})"
        )
    return out


def _would_be_late(
    source: str, times: dict, handed: dict, due: str, late: dict, extension_days: float
) -> bool:
    if source == "canvas" and not times.get("canvas"):
        return bool(handed.get("late"))
    try:
        return bool(penalty(times[source], due, late, extension_days)[1])
    except DeadlineError:
        return False


EXTENSION_COLUMNS = tuple(table.Column(name, required=True) for name in ("student", "lab", "days"))
MAX_EXTENSION_DAYS = 365  # more than a term: a typo, not an extension


def parse_extensions(
    text: str, source: str, students: set[str], labs: set[int], inactive: list[str] | None = None
) -> dict[str, dict[str, float]]:
    """student -> lab (as text) -> days; every line's student and lab must be in the class, once each."""
    out: dict[str, dict[str, float]] = {}
    seen: dict[tuple[str, int], int] = {}
    for line in table.read(text, source, EXTENSION_COLUMNS, DeadlineError):
        if not line.in_class(students, inactive):  # a kept line of a student dropped from the roster
            continue
        student = line["student"]
        lab = line.lab(labs)
        days = line.number_in(
            "days", 0, MAX_EXTENSION_DAYS, f"the days the due date moves, 0 to {MAX_EXTENSION_DAYS}"
        )
        if (student, lab) in seen:
            raise line.fail(
                f"extends lab {lab} for {student} again (line {seen[student, lab]})",
                "student",
                f"keep one of lines {seen[student, lab]} and {line.number}",
            )
        seen[student, lab] = line.number
        out.setdefault(student, {})[str(lab)] = float(days)
    return out
