"""From a run and the judge's outcomes to one row of the scoreboard: a status, points per test, notes."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from labkit.grading.intake.collect import LARGE_BYTES, MAX_BYTES, Unit
from labkit.judge import judge
from labkit.run import execute
from labkit.statuses import Row, Run, Verdict

ROW_STATUSES = tuple(Row)


class TestResult(TypedDict):
    """One test's outcome in a row, as the judge gave it (`judge.Outcome`)."""

    test: str
    exercise: str
    file: str
    hidden: bool
    status: str  # a statuses.Verdict
    message: str
    points: float


class ScoreRow(TypedDict):
    """One row of the scoreboard: a student's lab on one configuration (the JSON of OUT/scoreboard.json's rows
    and of each unit's record, unchanged)."""

    student: str
    lab: int
    config: str
    status: str  # a statuses.Row
    passed: int
    total: int
    message: str
    tests: list[TestResult]
    cell_errors: list[dict[str, Any]]
    notes: list[str]
    points: float
    max_points: float
    isolation: NotRequired[str]  # "bubblewrap", or "limits-only" where no sandbox could be made
    start: NotRequired[str]  # a statuses.Start
    judged_by: NotRequired[str]  # a statuses.JudgedBy (see judge.verify)
    digest: NotRequired[str]  # the graded notebook's, as the engine keeps it
    costs: NotRequired[dict[str, Any]]  # the cost cards of its examined calls (labkit.cost)
    timelines: NotRequired[dict[str, Any]]  # their schedules, for the pictures (labkit.judge.timeline.gather)


_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


# ----------------------------------------------------------------------------------------
# From a run and the judge's outcomes to one row of the scoreboard.
# ----------------------------------------------------------------------------------------


def submission_notes(path: Path | None) -> list[str]:
    """What is worth saying about a file that can still be graded: its size, an old nbformat."""
    if path is None or not path.is_file():
        return []
    notes: list[str] = []
    size = path.stat().st_size
    if size > MAX_BYTES:
        return notes
    if size > LARGE_BYTES:
        notes.append(
            f"the notebook is {size / 1e6:.0f} MB, mostly saved outputs: they are cleared before "
            "grading; clear them before handing in (Kernel > Restart & Clear Output)"
        )
    try:
        with open(path, "rb") as f:
            version = json.load(f).get("nbformat")
    except (OSError, ValueError, AttributeError):
        return notes
    if isinstance(version, int) and version < 4:
        notes.append(
            f"the notebook is in the old nbformat {version}; it was converted to nbformat 4 to be "
            "graded: save it from a current Jupyter"
        )
    return notes


def clean_message(text: str, unit: Unit, out: Path) -> str:
    """Messages name files relative to the class, never by this machine's paths."""
    if unit.path is not None:
        text = text.replace(str(unit.path), f"{unit.student}/{unit.path.name}")
    text = text.replace(str(out) + os.sep, "").replace(str(out), ".")
    return _ADDRESS.sub("0x…", text)  # "<object at 0x7f3e...>" differs on every run


def make_row(
    student: str,
    lab: int,
    config: str,
    record: execute.RunRecord | None,
    outcomes: list[judge.Outcome],
    notes: Sequence[str] = (),
    expected_total: int = 0,
    expected_points: float = 0,
) -> ScoreRow:
    """One row: the run's status and the judge's per-test outcomes folded into one of ROW_STATUSES.

    `points` are those of the tests passed on this configuration alone, `max_points` those of the
    tests that ran here; how configurations combine into a lab's points is the policy's (labkit/grading/state/policy.py).
    """
    tests = [_test_result(o) for o in outcomes]
    # A test worth no points whose exercise is not written (a stretch not tried) is left out, as make lab-N does.
    counted = [
        t
        for t in tests
        if t["status"] != Verdict.SKIPPED and not (t["status"] == Verdict.TODO and not t["points"])
    ]
    passed = sum(t["status"] == Verdict.PASSED for t in counted)
    row: ScoreRow = {
        "student": student,
        "lab": lab,
        "config": config,
        "status": Row.OK,
        "passed": passed,
        "total": len(counted),
        "message": "",
        "tests": tests,
        "cell_errors": [],
        "notes": list(notes),
        "points": _number(sum(t["points"] for t in counted if t["status"] == Verdict.PASSED)),
        "max_points": _number(sum(t["points"] for t in counted)),
    }
    if record is None:
        row.update(
            {
                "status": Row.MISSING,
                "total": expected_total,
                "tests": [],
                "points": 0,
                "max_points": _number(expected_points),
                "message": f"lab-{lab}.ipynb was not handed in",
            }
        )
        return row
    row["cell_errors"] = [dict(e) for e in record.cell_errors if e.get("type") != "NotImplementedError"]
    row["isolation"] = record.isolation  # "bubblewrap", or "limits-only" where no sandbox could be made
    row["start"] = record.start  # "warm" (forked by the warm server) or "cold" (a kernel of its own)
    row["judged_by"] = record.judged_by  # a statuses.JudgedBy (see judge.verify)
    row.update(_verdict(record, counted, passed))
    return row


def _test_result(o: judge.Outcome) -> TestResult:
    return {
        "test": o.test,
        "exercise": o.exercise,
        "file": o.file,
        "hidden": bool(o.hidden),
        "status": o.status,
        "message": o.message,
        "points": o.points,
    }


class _Verdict(TypedDict, total=False):
    """What `_verdict` changes in a row."""

    status: str
    message: str
    total: int
    passed: int
    points: float
    max_points: float


def _verdict(record: execute.RunRecord, counted: list[TestResult], passed: int) -> _Verdict:
    """What a run's status and its counted tests change in its row: the status, the message, and the counts
    and points of a run that was skipped or did not end. Nothing for a row whose every test passed."""
    if record.status == Run.SKIPPED:
        return {
            "status": Row.SKIPPED,
            "total": 0,
            "passed": 0,
            "points": 0,
            "max_points": 0,
            "message": record.message,
        }
    if record.status in (Run.TIMEOUT, Run.ERROR):
        return {
            "status": Row(record.status),
            "passed": 0,
            "points": 0,
            "message": record.message or f"the run ended with {record.status}",
        }
    if not counted:
        return {"status": Row.ERROR, "message": "no test ran on this configuration"}
    bad = next((t for t in counted if t["status"] in (Verdict.ERROR, Verdict.TIMEOUT)), None)
    if bad is not None:
        return {
            "status": Row.TIMEOUT if bad["status"] == Verdict.TIMEOUT else Row.ERROR,
            "message": bad["message"],
        }
    if passed < len(counted):
        failing = [t for t in counted if t["status"] != Verdict.PASSED]
        first = next((t for t in failing if not t["hidden"]), failing[0])
        what = "not implemented yet" if first["status"] == Verdict.TODO else first["message"]
        return {
            "status": Row.FAILED,
            "message": f"{len(failing)} of {len(counted)} tests did not pass; "
            f"first: {first['test'].removeprefix('test_').replace('_', ' ')}: {what}",
        }
    return {}


def unjudged_row(
    student: str, lab: int, config: str, why: str, expected_total: int = 0, expected_points: float = 0
) -> ScoreRow:
    """The `error` row of a unit the kit could not judge, made from nothing of the unit's run (so that
    what made its judging raise cannot make this raise too)."""
    row = make_row(student, lab, config, None, [], [], expected_total, expected_points)
    row.update(
        {
            "status": Row.ERROR,
            "message": f"the kit could not judge this run ({why}); tell your course staff: it is "
            "judged again at the next grading run",
        }
    )
    return row


def _number(x: float) -> float | int:
    """2.0 -> 2: points read as the integers they mostly are, in the csv and the json."""
    return int(x) if float(x).is_integer() else round(float(x), 4)
