"""What the budget checks measured, and which budget of a call is nearest its limit.

Each budget check of `labkit.judge.compiled` (work per device, bytes each device sends, memory each device holds,
steps one after another, the chip's memory) notes what it measured, when it passes and when it fails: the
budget in its words, the figure, the limit (the largest figure that passes) and the examined call it is about.
The notes are taken in the judge, from the kit's tests and the compiled facts the verdict reads, never from
what the student's notebook prints. `labkit.checks.check` opens a ledger for each test (`measuring`); the judge
carries its notes out on the test's `Outcome.budgets`; the cost card's headline ends with the nearest (`said`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

# The budgets' words, as a student reads them on the card's headline.
WORK = "work per device"
SENT = "bytes each device sends"
HELD = "memory each device holds"
STEPS = "collective steps one after another"
CHIP_MEMORY = "memory each chip holds (its HBM)"


@dataclass
class Ledger:
    """One test's notes: the run it judges, whose values are which calls, and what each budget check measured."""

    run: str
    # id of a value the test got -> (its call's function, whether it is at a production size)
    calls: dict[int, tuple[str, bool]]
    notes: list[dict] = field(default_factory=list)


_LEDGER: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("labkit_budgets", default=None)


@contextlib.contextmanager
def measuring(run: str, calls: dict[int, tuple[str, bool]], notes: list[dict]) -> Iterator[None]:
    """A ledger for one test on run `run` (`calls`: see `Ledger.calls`), its notes put in `notes`."""
    token = _LEDGER.set(Ledger(run, calls, notes))
    try:
        yield
    finally:
        _LEDGER.reset(token)


def note(got, budget: str, figure: float, limit: float, passed: bool) -> None:
    """Note what a budget check measured of the value `got` (nothing outside a test, or for a value that is
    not one of the test's calls' own)."""
    ledger = _LEDGER.get()
    whose = ledger.calls.get(id(got)) if ledger is not None else None
    if ledger is None or whose is None:
        return
    ledger.notes.append(
        {
            "budget": budget,
            "figure": float(figure),
            "limit": float(limit),
            "passed": bool(passed),
            "function": whose[0],
            "at_size": whose[1],
            "run": ledger.run,
        }
    )


def share(n: dict) -> float:
    """The figure as a share of its limit (1.0: at the limit); a limit of nothing is exceeded by anything."""
    figure, limit = float(n.get("figure", 0.0)), float(n.get("limit", 0.0))
    if limit > 0:
        return figure / limit
    return 0.0 if figure <= 0 else math.inf


def of(notes: list[dict], function: str, at_size: bool, run: str) -> list[dict]:
    """The notes about one examined call (its function, at a production size or not) on run `run`."""
    return [
        n
        for n in notes
        if n.get("function") == function and bool(n.get("at_size")) == at_size and n.get("run") == run
    ]


def nearest(notes: list[dict]) -> dict | None:
    """The note nearest its limit (a failed one first), or None where there is none."""
    return max(notes, key=lambda n: (not n.get("passed", True), share(n)), default=None)


def said(notes: list[dict]) -> str:
    """'; nearest budget: <its words>, 92% of its limit' (or 'over its limit by 1.4x'); '' with no budget."""
    found = nearest(notes)
    if found is None:
        return ""
    part = share(found)
    if found.get("passed", True) and part <= 1:
        how = f"{round(100 * part)}% of its limit"
    elif math.isinf(part):
        how = "over its limit of zero"
    else:
        how = f"over its limit by {part:.3g}x" if part >= 1.005 else "at its limit, which fails"
    return f"; nearest budget: {found['budget']}, {how}"
