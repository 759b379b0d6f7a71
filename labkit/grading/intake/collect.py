"""What there is to grade: a submissions folder read (links refused, never followed), the labs and
configurations asked for, and the units (student, lab, configuration) a grading run is made of.
"""

from __future__ import annotations

import hashlib
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labkit.course import catalog, configs
from labkit.course.configs import DeviceConfig
from labkit.grading.state import table
from labkit.grading.state.errors import GradeError

LARGE_BYTES = 10_000_000  # a notebook this large is graded, with a note (its outputs are not run)
MAX_BYTES = 200_000_000  # a file larger than this is not read at all
REFERENCE = "reference"  # how the reference solution's runs are labelled


_LOOSE_NAME = re.compile(r"lab[\s_.-]*0*([1-9][0-9]*)", re.IGNORECASE)


# ----------------------------------------------------------------------------------------
# What there is to grade.
# ----------------------------------------------------------------------------------------


@dataclass
class Submissions:
    students: dict[str, dict[int, Path]] = field(default_factory=dict)  # student -> lab -> path
    notes: dict[str, list[str]] = field(default_factory=dict)  # student -> what was ignored, and why
    class_notes: list[str] = field(default_factory=list)  # entries of the folder that are not students
    refused: dict[tuple[str, int], str] = field(
        default_factory=dict
    )  # (student, lab) -> why it is not graded


LINKED = (
    "symlink: {what} is a symbolic link, and a link is never followed into the grader (it could name "
    "another student's notebook or a file of the machine); hand in the notebook itself"
)


TWICE = (
    "two folders of this student, their names the same letters in two Unicode forms (one written by macOS): "
    "put the notebooks in one of them"
)


def discover(folder: Path, known_labs: list[int]) -> Submissions:
    """Read the submissions folder: DIR/<student_id>/lab-<N>.ipynb. Anything else is noted and ignored.

    Links are never followed: a student folder or a notebook that is a symbolic link (as `git clone`,
    `tar` or `cp -a` keep them), or a notebook that is not a regular file, is refused, and its rows say why."""
    subs = Submissions()
    for entry in sorted(Path(folder).iterdir()):
        if entry.name.startswith("."):
            continue  # .DS_Store, .ipynb_checkpoints, .git
        student = table.nfc(entry.name)  # the roster's id, however this machine composed the folder's name
        if student in subs.students:  # `josé` twice, once composed and once not: which one counts is the TA's
            subs.notes[student] = [f"refused: {TWICE}"]
            for number in known_labs:
                subs.refused[(student, number)] = TWICE
            continue
        if entry.is_symlink():
            subs.students[student] = {}
            subs.notes[student] = [f"refused: {LINKED.format(what='this student folder')}"]
            for number in known_labs:
                subs.refused[(student, number)] = LINKED.format(what="the student folder")
            continue
        if not entry.is_dir():
            subs.class_notes.append(
                f"{entry.name}: ignored, not a student folder (submissions go in <student_id>/lab-<N>.ipynb)"
            )
            continue
        found: dict[int, Path] = {}
        notes: list[str] = []
        for item in sorted(entry.iterdir()):
            if item.name.startswith("."):
                continue
            m = catalog.NOTEBOOK_NAME.match(item.name)
            if m:
                number = int(m.group(1))
                if number in known_labs and item.is_symlink():
                    subs.refused[(student, number)] = LINKED.format(what=item.name)
                    notes.append(f"{item.name}: refused, it is a symbolic link")
                elif (
                    number in known_labs
                    and not stat.S_ISREG(mode := item.lstat().st_mode)
                    and not stat.S_ISDIR(mode)
                ):
                    subs.refused[(student, number)] = f"{item.name} is not a regular file"
                    notes.append(f"{item.name}: refused, it is not a regular file")
                elif number in known_labs:
                    found[number] = item
                else:
                    notes.append(f"{item.name}: ignored, there is no lab {number}")
                continue
            loose = _LOOSE_NAME.search(item.name)
            hint = ""
            if loose and item.name.lower().endswith(".ipynb") and int(loose.group(1)) in known_labs:
                hint = f" (rename it lab-{int(loose.group(1))}.ipynb to have it graded)"
            kind = "folder" if item.is_dir() else "file"
            notes.append(f"{item.name}: {kind} ignored, its name is not lab-<N>.ipynb{hint}")
        if not found:
            notes.insert(0, "no notebook named lab-<N>.ipynb in this folder")
        subs.students[student] = found
        subs.notes[student] = notes
    return subs


def shard_of(student: str, count: int) -> int:
    """Which of `count` shards grades `student` (1-based): fixed by the id alone, on every machine."""
    return int(hashlib.sha256(student.encode()).hexdigest()[:12], 16) % count + 1


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    m = re.fullmatch(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise GradeError(f"--shard takes i/N with 1 <= i <= N, e.g. 1/4; got {text!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Unit:
    student: str
    lab: int
    config: str
    path: Path | None  # the submission; None when it was not handed in (or refused)
    refused: str = ""  # why a submission handed in is not graded (a symbolic link...)
    kit: bool = False  # the kit's own unit (a reference solution's), never a student's of the same name

    @property
    def label(self) -> str:
        return f"{self.student}/{self.config}"

    @property
    def where(self) -> Path:
        return Path(self.student) / f"lab-{self.lab}" / self.config


def choose_labs(text: str | None) -> list[catalog.Lab]:
    if text:
        try:
            chosen = [catalog.lab(t.strip()) for t in str(text).split(",") if t.strip()]
        except catalog.UnknownLab as e:
            raise GradeError(str(e)) from None
    else:
        chosen = catalog.labs()
    chosen = list(dict.fromkeys(chosen))
    without = [lab.name for lab in chosen if not lab.reference.exists()]
    if without:
        raise GradeError(
            f"no reference solution for {', '.join(without)}: grading needs reference/lab-N.ipynb"
        )
    if not chosen:
        raise GradeError("there are no labs to grade")
    return chosen


def choose_configs(text: str | None) -> list[DeviceConfig]:
    if text:
        try:
            return configs.parse(text)
        except configs.UnknownConfig as e:
            raise GradeError(str(e)) from None
    return configs.graded_by_default()
