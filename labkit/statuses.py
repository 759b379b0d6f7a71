"""The fixed words of a verdict, each set a `StrEnum`: how a run ended, a test's verdict, a row's status, how
a call was judged and how a process started.

A member is its string (`Run.OK == "ok"`, and `json.dumps` writes `"ok"`), so the records, rows and
scoreboards on disk hold the same words as before and older files read the same. What the kit writes is
spelled through these names, never as a literal, so that a typo is an AttributeError, not a new status.
This module imports nothing of the kit.
"""

from __future__ import annotations

from enum import StrEnum


class Run(StrEnum):
    """How a notebook's run on one configuration ended (`execute.RunRecord.status`)."""

    OK = "ok"  # the notebook ran to its end
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"  # not run here: the configuration is not available, or the lab's tests declare it


class Verdict(StrEnum):
    """One test's outcome on one configuration (`judge.Outcome.status`)."""

    PASSED = "passed"
    FAILED = "failed"
    TODO = "todo"  # the exercise is not written yet (NotImplementedError)
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"


class Row(StrEnum):
    """A graded unit's row on the scoreboard (`grading.running.rows.make_row`)."""

    OK = "ok"  # every counted test passed
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    MISSING = "missing"  # nothing handed in
    SKIPPED = "skipped"


class JudgedBy(StrEnum):
    """Where a call's value came from (a result's, a run's and a row's `judged_by`; `judge.verify`)."""

    VERIFIED = "verified"  # the kit's own run of the call's program
    PARTLY = "partly verified"  # a run with calls of both kinds
    REPORTED = "reported"  # the student's process (a call no test examines, or host data the tests give)
    UNVERIFIED = "unverified"  # a call the kit must run and could not: an error that says why


class Start(StrEnum):
    """How a kernel or the verifier started (`RunRecord.start`, `RunRecord.verify_start`)."""

    WARM = "warm"  # forked by a warm server, JAX already imported (`labkit.run.warm`)
    COLD = "cold"  # a process of its own


# How a test's verdict is marked in a table: `make lab-N`'s (labkit/student/report.py, with its colours), check()'s
# in Jupyter (labkit/notebook.py) and the scoreboard's (labkit/grading/classwide/results.py).
TEST_MARKS = {
    "passed": "✓",
    "failed": "✗",
    "todo": "todo",
    "error": "error",
    "timeout": "timeout",
    "skipped": "skip",
}
