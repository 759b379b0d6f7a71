"""The points a TA gives on the review page, kept where grading reads them: OUT/course/adjustments.csv.

Each rubric item of an answer is one line of the adjustments (`student,lab,points,comment,item,max`: see
labkit/grading/state/adjustments.py); every other line of the file is kept as it was. A save happens under a
lock (the server's threads, and other servers on the same folder), checks the answer's version (a digest of
its lines: a page that shows older lines than the file's has its save refused, so that two TAs never
overwrite each other unseen), checks the whole new file as grading will, writes it atomically, and adds a
line saying who gave which points and when to OUT/course/review-log.jsonl.

The course state's manifest names the adjustments once a first point is given, so that a later `make grade`
without ADJUSTMENTS= reads them; its digest is left for grading to bring up to date. A grading run reads its
inputs once, as it starts, and keeps them under the same lock (labkit/grading/state/course.py's `locked`),
never writing back a kept copy: a save made while it runs is kept, and in the file for the next run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from labkit.course import catalog
from labkit.grading.review.rubric import Rubric
from labkit.grading.state import adjustments
from labkit.grading.state import course as course_mod
from labkit.grading.state.files import write_atomic

FILE = "adjustments.csv"
OVERRIDES = "overrides.csv"  # a regrade's test override: labkit/grading/review/regrades.py
LOG = "review-log.jsonl"
HEADER = ["student", "lab", "points", "comment", "item", "max"]
MAX_BYTES = 20_000_000
MAX_COMMENT = 1000

_threads = threading.Lock()


class StateError(ValueError):
    """The course state cannot be read or written as it is: the message says which file, and what to do."""


class Conflict(Exception):
    """The answer's points changed since the page that sent a save was drawn."""


@dataclass(frozen=True)
class Mark:
    points: float
    comment: str  # what the student reads; the item's `says` where the TA wrote none


def _refuse_links(course: Path) -> None:
    kept = (FILE, OVERRIDES, course_mod.MANIFEST, LOG)
    for path in (course.parent, course, *(course / name for name in kept)):
        if path.is_symlink():
            raise StateError(f"{path} is a link: the review writes only the course state's own files")


def read_text(course: Path, name: str = FILE) -> str:
    """A kept CSV file's text (the adjustments, unless named; '' where there is none), never through a link."""
    _refuse_links(course)
    path = course / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise StateError(f"{path}: cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise StateError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise StateError(f"{path}: not UTF-8 text (save it as CSV UTF-8)") from None


def rows(text: str) -> list[dict[str, str]]:
    if not text.strip():
        return []
    reader = csv.DictReader(io.StringIO(text))
    reader.fieldnames = [h.strip().lower() for h in reader.fieldnames or []]
    return [{k: (v or "").strip() for k, v in line.items() if k is not None} for line in reader]


def check(text: str, course: Path, students: set[str]) -> None:
    """The file as grading will read it; StateError with grading's own message (file and line) if it would
    refuse it."""
    if not text.strip():
        return
    labs = {lab.number for lab in catalog.labs()}
    named = {r.get("student", "") for r in rows(text)}
    try:
        adjustments.parse(text, str(course / FILE), students | named, labs)
    except ValueError as e:
        raise StateError(f"{e}. The page saves nothing until the file is put right.") from None


def of_answer(text: str, student: str, rubric: Rubric) -> dict[str, Mark]:
    """item -> the points it has, for one student's answer (items not graded are absent)."""
    says = {i.name: i.says for i in rubric.items}
    out = {}
    for r in rows(text):
        if r.get("student") == student and r.get("lab") == str(rubric.lab) and r.get("item") in says:
            comment = r.get("comment", "")
            out[r["item"]] = Mark(float(r.get("points") or 0), "" if comment == says[r["item"]] else comment)
    return out


def version(marks: dict[str, Mark]) -> str:
    """The answer's version: what the page that sends a save must have shown."""
    text = json.dumps(sorted((k, m.points, m.comment) for k, m in marks.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextmanager
def locked(course: Path) -> Iterator[None]:
    """One save at a time: this server's threads, every server on the same folder, and a grading run keeping
    its inputs (the course state's own lock)."""
    with _threads:
        course.mkdir(parents=True, exist_ok=True)
        _refuse_links(course)
        with course_mod.locked(course):
            yield


def _number(value: float) -> str:
    return f"{value:g}"


def replaced(text: str, student: str, rubric: Rubric, marks: dict[str, Mark]) -> str:
    """The file with one answer's item lines made `marks` (each in place where it was, new ones at the end)."""
    lines = rows(text)
    worth = {i.name: i for i in rubric.items}
    done: set[str] = set()
    out = []
    for r in lines:
        item = r.get("item", "")
        if r.get("student") == student and r.get("lab") == str(rubric.lab) and item in worth:
            if item in marks and item not in done:
                out.append(_line(student, rubric, worth[item], marks[item]))
                done.add(item)
            continue
        out.append(r)
    out += [_line(student, rubric, worth[i], m) for i, m in marks.items() if i not in done]
    return written(text, out)


def written(text: str, lines: list[dict[str, str]], columns: list[str] = HEADER) -> str:
    """`lines` as the file's text, under the file's own columns (the kit's `columns` first, in their order)."""
    header = list(columns)
    if text.strip():
        extra = [h.strip().lower() for h in next(csv.reader(io.StringIO(text)), [])]
        header += [h for h in extra if h and h not in header]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(lines)
    return buffer.getvalue()


def _line(student: str, rubric: Rubric, item, mark: Mark) -> dict[str, str]:
    return {
        "student": student,
        "lab": str(rubric.lab),
        "points": _number(mark.points),
        "comment": mark.comment or item.says,
        "item": item.name,
        "max": _number(item.max),
    }


def save(
    course: Path,
    student: str,
    rubric: Rubric,
    marks: dict[str, Mark],
    seen: str,
    who: str,
    students: set[str],
) -> str:
    """Give one answer `marks`, where its version is still `seen`; its new version. Conflict where another
    save came first; StateError where the file cannot be read or the result would not be graded."""
    with locked(course):
        text = read_text(course)
        check(text, course, students)
        before = of_answer(text, student, rubric)
        if version(before) != seen:
            raise Conflict(version(before))
        new = replaced(text, student, rubric, marks)
        check(new, course, students)
        write_atomic(course / FILE, new)
        name_in_manifest(course, "adjustments", FILE, new)
        entry = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "by": who,
            "student": student,
            "lab": rubric.lab,
            "items": {k: {"points": m.points, "comment": m.comment} for k, m in sorted(marks.items())},
            "before": {k: {"points": m.points, "comment": m.comment} for k, m in sorted(before.items())},
        }
        with open(course / LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry, sort_keys=True) + "\n")
        return version(of_answer(new, student, rubric))


def add_line(course: Path, line: dict[str, str], students: set[str]) -> None:
    """Add one adjustments line (a regrade's points, say) to the file, checked as grading reads it."""
    with locked(course):
        text = read_text(course)
        check(text, course, students)
        new = written(text, [*rows(text), line])
        check(new, course, students)
        write_atomic(course / FILE, new)
        name_in_manifest(course, "adjustments", FILE, new)


def name_in_manifest(course: Path, name: str, file: str, text: str) -> None:
    """Where the manifest does not yet name input `name` (kept as `file`), name it, so that grading reads the
    kept copy. Called under `locked`."""
    manifest = course_mod.read_manifest(course)
    inputs = manifest.get("inputs", {})
    if name in inputs:
        return
    if (course / course_mod.MANIFEST).exists() and not manifest:
        raise StateError(f"{course / course_mod.MANIFEST}: not the course state's manifest; fix or remove it")
    inputs[name] = {
        "file": file,
        "from": "make review",
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    body = {"format": manifest.get("format", course_mod.FORMAT), "inputs": inputs}
    write_atomic(course / course_mod.MANIFEST, json.dumps(body, indent=1, sort_keys=True) + "\n")
