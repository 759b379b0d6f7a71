"""Regrade requests: entered by a TA, answered on the review page, every request and answer kept.

    OUT/course/regrades.jsonl   one event a line: {"event": "request", "id", "at", "by", "student", "lab",
                                "about", "words"} and {"event": "answer", "id", "at", "by", "reply", "points",
                                "test", "status"}
    OUT/course/adjustments.csv  a regrade's points (read and written through labkit/grading/review/marks.py)
    OUT/course/overrides.csv    a regrade's test override (student,lab,points,test,status,comment)

A request is answered with a reply and, where the points change, an adjustment of the lab's points whose
comment is the reply: one more line of OUT/course/adjustments.csv; where a test's outcome changes, an override
of that test (passed or failed, on every configuration) whose comment is the reply: a line of
OUT/course/overrides.csv, checked by grading's own check of the overrides (labkit/grading/state/overrides.py)
with the lab's tests as the last results name them. The next `make grade` puts either in grades.csv and the
student's feedback. A change to a rubric item is made on the answer's own page. A reply without a change is kept
here only. The unit the request is about is shown from the results the class was last graded with
(OUT/scoreboard.json): each configuration's status and each test's message.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from labkit.course import catalog
from labkit.grading.review import marks
from labkit.grading.state import course as course_mod
from labkit.grading.state.files import write_atomic

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
    course: Path,
    who: str,
    request: Request,
    reply: str,
    points: float | None,
    students: set[str],
    test: tuple[str, str] | None = None,
) -> None:
    """Answer `request` with `reply`: where `points` is given, adjust the lab's points by it, and where `test`
    (name, passed or failed) is given, override that test's outcome; either with the reply as the comment the
    student reads."""
    if points is not None and (not math.isfinite(points) or points == 0):
        raise marks.StateError(
            "give the points the answer adds or takes away (not 0), or leave the box empty"
        )
    if test is not None:
        override(course, request.student, request.lab, test, reply, students)
    if points is not None:
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
            {"event": "answer", "id": request.id, "at": _now(), "by": who, "reply": reply, "points": points}
            | ({"test": test[0], "status": test[1]} if test else {}),
        )


def override(
    course: Path, student: str, lab: int, test: tuple[str, str], comment: str, students: set[str]
) -> None:
    """Set one test of a student's lab passed or failed on every configuration: the student's line for that
    test in OUT/course/overrides.csv (replaced where there is one), the file checked as grading reads it."""
    name, status = test
    with marks.locked(course):
        text = marks.read_text(course, marks.OVERRIDES)
        _check_overrides(text, course, students)
        same = (student, str(lab), name)
        lines = [r for r in marks.rows(text) if (r.get("student"), r.get("lab"), _test(r)) != same]
        line = {"student": student, "lab": str(lab), "points": "", "test": name, "status": status}
        new = marks.written(text, [*lines, line | {"comment": comment}], OVERRIDE_COLUMNS)
        _check_overrides(new, course, students)
        write_atomic(course / marks.OVERRIDES, new)
        marks.name_in_manifest(course, "overrides", marks.OVERRIDES, new)


OVERRIDE_COLUMNS = ["student", "lab", "points", "test", "status", "comment"]


def _test(line: dict[str, str]) -> str:
    """A line's test as grading names it (`sums` and `test_sums` are one test)."""
    name = line.get("test", "")
    return name if not name or name.startswith("test_") else f"test_{name}"


def _check_overrides(text: str, course: Path, students: set[str]) -> None:
    """The overrides as grading checks them (the registry's own check), each lab's tests as the last results
    name them; StateError with grading's message where it would refuse them."""
    if not text.strip():
        return
    context = course_mod.Context(labs=[lab.number for lab in catalog.labs()], students=students)
    context.tests, context.points = _tests_graded(course.parent)
    context.students = students | {r.get("student", "") for r in marks.rows(text)}
    try:
        course_mod.INPUTS["overrides"].check(text, str(course / marks.OVERRIDES), context)
    except ValueError as e:
        raise marks.StateError(f"{e}. The page saves nothing until the file is put right.") from None


def _tests_graded(out: Path) -> tuple[dict[int, set[str]], dict[int, float]]:
    """lab -> its tests' names, and lab -> their points, as the results the class was last graded with say."""
    tests, points = {}, {}
    for lab in _results(out).get("labs", []):
        named = lab.get("tests") if isinstance(lab, dict) else None
        if not isinstance(named, dict) or not isinstance(lab.get("number"), int):
            continue
        try:
            points[lab["number"]] = float(sum(float(t["points"]) for t in named.values()))
        except (TypeError, KeyError, ValueError):
            continue  # then collected from the lab's files, as grading does
        tests[lab["number"]] = set(named)
    return tests, points


def _results(out: Path) -> dict:
    """The results the class was last graded with ({} where there are none)."""
    try:
        results = json.loads(_read(out / RESULTS, MAX_BYTES) or "{}")
    except ValueError:
        raise marks.StateError(f"{out / RESULTS}: not JSON; grade the class again") from None
    return results if isinstance(results, dict) else {}


def unit_rows(out: Path, student: str, lab: int) -> list[dict]:
    """The student's rows of the lab in the results the class was last graded with (one per configuration)."""
    rows = _results(out).get("rows", [])
    return [
        r
        for r in rows
        if isinstance(r, dict)
        and r.get("student") == student
        and r.get("lab") == lab
        and isinstance(r.get("tests", []), list)
    ]


def unit_tests(rows: list[dict]) -> list[str]:
    """The tests of a unit's rows, each once, in the order graded: those a request's answer may override."""
    names = [t.get("test") for r in rows for t in r.get("tests", []) if isinstance(t, dict)]
    return list(dict.fromkeys(n for n in names if isinstance(n, str) and n))
