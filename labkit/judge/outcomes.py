"""What a lab test raises when it does not simply pass, and how its messages to students are written."""

from __future__ import annotations

import numpy as np


class Mismatch(AssertionError):
    """The student's value is not what the test expects."""


class NotDone(Exception):
    """The exercise still raises NotImplementedError."""


class CallFailed(Exception):
    """The student's function raised, or is missing."""


class RunProblem(Exception):
    """The notebook run itself did not finish (timeout, crash, unreadable notebook)."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


def fmt(x) -> str:
    arr = np.asarray(x)
    if arr.ndim == 0:
        return np.format_float_positional(arr.item(), trim="-") if arr.dtype.kind == "f" else repr(arr.item())
    return np.array2string(arr, precision=4, threshold=12, edgeitems=3, separator=", ").replace("\n", "")


def with_hint(message: str, hint: str | None) -> str:
    return f"{message}. {hint}" if hint else message
