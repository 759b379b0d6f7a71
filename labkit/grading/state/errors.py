"""Why grading stops: the refusals every stage may raise, kept in the lowest stage so that every stage can."""

from __future__ import annotations


class GradeError(RuntimeError):
    """The kit could not grade (bad arguments, a reference failing its own tests): exit non-zero."""


class ReferenceBroken(GradeError):
    pass
