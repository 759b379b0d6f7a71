"""Regrade requests: entered by a TA, answered on the review page, every request and answer kept.

    OUT/course/regrades.jsonl   one event a line: {"event": "request", "id", "at", "by", "student", "lab",
                                "about", "words"} and {"event": "answer", "id", "at", "by", "reply", "points"}

A request is answered with a reply and, where the points change, an adjustment of the lab's points whose
comment is the reply: one more line of OUT/course/adjustments.csv, so the next `make grade` puts both in
grades.csv and the student's feedback. A change to a rubric item is made on the answer's own page. A reply
without a change of points is kept here only. The unit the request is about is shown from the results the
class was last graded with (OUT/scoreboard.json): each configuration's status and each test's message.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from labkit.grading.review import marks

FILE = "regrades.jsonl"
RESULTS = "scoreboard.json"
MAX_BYTES = 50_000_000
MAX_WORDS = 5000


@dataclass
class Request:
    id: int
    at: str
    by: str
    student: str
    lab: int
    about: str
    words: str
    answers: list[dict] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return bool(self.answers)


def _read(path: Path, limit: int) -> str:
    """A file's text, never through a link ('' where there is none); StateError where it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise marks.StateError(f"{path}: cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise marks.StateError(f"{path}: larger than {limit} bytes")
    return data.decode("utf-8", errors="replace")


def load(course: Path) -> list[Request]:
    """Every request, with its answers, in the order entered; StateError naming the line of a bad event."""
    found: dict[int, Request] = {}
    for n, line in enumerate(_read(course / FILE, MAX_BYTES).splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            if event["event"] == "request":
                keys = ("id", "at", "by", "student", "lab", "about", "words")
                found[int(event["id"])] = Request(*(event[k] for k in keys))
            else:
                found[int(event["id"])].answers.append(event)
        except (ValueError, KeyError, TypeError):
            raise marks.StateError(
                f"{course / FILE}, line {n}: not a regrade event; fix or remove it"
            ) from None
    return list(found.values())


def _append(course: Path, event: dict) -> None:
    with open(course / FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(event, sort_keys=True) + "\n")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def add(course: Path, who: str, student: str, lab: int, about: str, words: str) -> int:
    """Keep a new request; its id."""
    with marks.locked(course):
        number = max((r.id for r in load(course)), default=0) + 1
        event = {"event": "request", "id": number, "at": _now(), "by": who, "student": student, "lab": lab}
        _append(course, event | {"about": about.strip()[:200], "words": words.strip()[:MAX_WORDS]})
    return number


def answer(
    course: Path, who: str, request: Request, reply: str, points: float | None, students: set[str]
) -> None:
    """Answer `request` with `reply`, and where `points` is given, adjust the lab's points by it with the reply
    as the comment the student reads."""
    if points is not None:
        if not math.isfinite(points) or points == 0:
            raise marks.StateError(
                "give the points the answer adds or takes away (not 0), or leave the box empty"
            )
        line = {
            "student": request.student,
            "lab": str(request.lab),
            "points": f"{points:g}",
            "comment": reply,
        }
        marks.add_line(course, line, students)
    with marks.locked(course):
        _append(
            course,
            {"event": "answer", "id": request.id, "at": _now(), "by": who, "reply": reply, "points": points},
        )


def unit_rows(out: Path, student: str, lab: int) -> list[dict]:
    """The student's rows of the lab in the results the class was last graded with (one per configuration)."""
    try:
        results = json.loads(_read(out / RESULTS, MAX_BYTES) or "{}")
    except ValueError:
        raise marks.StateError(f"{out / RESULTS}: not JSON; grade the class again") from None
    rows = results.get("rows", []) if isinstance(results, dict) else []
    return [
        r
        for r in rows
        if isinstance(r, dict)
        and r.get("student") == student
        and r.get("lab") == lab
        and isinstance(r.get("tests", []), list)
    ]
