"""The class leaderboard: for a lab the catalog gives one, the students whose code passes, fastest design first.

A lab's leaderboard (`catalog.LEADERBOARDS`) names an examined call, the configuration whose run
examined it and a chip of chips.toml. A student is ranked when their row for that lab on that
configuration passes every public and hidden test (status `ok`); their time is the modelled step
time of that call on that chip, from their own cost card (labkit/cost.py). Fastest first; equal
times in the order of the student ids. A row that does not pass is not ranked.

A student whose roster line says `leaderboard = hide` (labkit/grading/state/roster.py) is shown as
"anonymous", with their rank and time, never their id. On the board in a student's own feedback the
student's line is "you" and every classmate is "classmate N" (N their rank), unless the course's
policy says `[leaderboard] names = true` (labkit/grading/state/policy.py); the class page is the TA's.

Like the scoreboard, everything here is a pure function of the results: the lab's entry carries
its leaderboard and the reference's cards, each row its own cards, each student the roster's columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit import cost
from labkit.course.catalog import Leaderboard

ANONYMOUS = "anonymous"
YOU = "you"  # the student's own line on the board in their own feedback
HIDE = "hide"  # the roster's `leaderboard` column: this student's id is never shown on a leaderboard


@dataclass(frozen=True)
class Place:
    rank: int
    name: str  # the student id, or ANONYMOUS
    seconds: float
    student: str  # for the student's own feedback only: never written where others read it

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "name": self.name,
            "seconds": self.seconds,
            "time": cost.format_seconds(self.seconds),
        }


def ranked_on(spec: Leaderboard, results: dict | None = None) -> Leaderboard:
    """The board as it ranks this class: on its compile-only TPU configuration at a production size where the
    class was graded there (`Leaderboard.at_size`), else on its own configuration (`spec` itself)."""
    graded = {c["name"] for c in (results or {}).get("configs", [])}
    if spec.at_size and spec.at_size in graded:
        return Leaderboard(spec.function, spec.at_size, spec.chip, spec.at_size)
    return Leaderboard(spec.function, spec.config, spec.chip)


def step_time(costs: dict | None, spec: Leaderboard) -> float | None:
    """The modelled step time (seconds) of `spec`'s call on its chip, from cards as `cost.to_json` writes them
    (`spec` as `ranked_on` gives it: with `at_size`, the card of the call at a production size)."""
    chip = cost.chips()[spec.chip]
    try:  # a row's cards that cannot be read, or give no finite time, rank nobody (that row is not ranked)
        found = cost.from_json(costs or {})
        for entry in found.values():
            if (
                entry.function == spec.function
                and entry.at_size == bool(spec.at_size)
                and spec.config in entry.runs
                and spec.config not in entry.reported  # a card the kit did not verify ranks nobody
            ):
                step = float(entry.runs[spec.config].timing(chip).step)
                return step if math.isfinite(step) else None
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError):
        return None
    return None


def spec_of(lab: dict) -> Leaderboard | None:
    """The leaderboard a lab's entry of the results carries, or None."""
    data = lab.get("leaderboard")
    return Leaderboard.from_json(data) if data else None


def opted_out(results: dict, student: str) -> bool:
    return results.get("students", {}).get(student, {}).get("leaderboard", "") == HIDE


def places(results: dict, lab: dict) -> list[Place]:
    """The ranked students of one lab: every passing row with a card for the call, fastest first."""
    spec = spec_of(lab)
    if spec is None:
        return []
    spec = ranked_on(spec, results)
    timed = []
    for row in results.get("rows", []):
        if row["lab"] != lab["number"] or row["config"] != spec.config or row["status"] != "ok":
            continue
        seconds = step_time(row.get("costs"), spec)
        if seconds is not None:
            timed.append((seconds, row["student"]))
    timed.sort()
    return [
        Place(i, ANONYMOUS if opted_out(results, s) else s, t, s) for i, (t, s) in enumerate(timed, start=1)
    ]


NO_VERIFIED_CARD = "it passes, but gave no card of a program the kit verified for {what}"


def not_ranked(results: dict, lab: dict) -> int:
    """How many rows pass every test on the board's configuration and are still not ranked: their card is missing,
    or not one of a program the kit verified (`step_time`). The board says so beside its places."""
    spec = spec_of(lab)
    if spec is None:
        return 0
    spec = ranked_on(spec, results)
    ranked = {p.student for p in places(results, lab)}
    return sum(
        1
        for row in results.get("rows", [])
        if row["lab"] == lab["number"]
        and row["config"] == spec.config
        and row["status"] == "ok"
        and row["student"] not in ranked
    )


def _what(spec: Leaderboard) -> str:
    return f"{spec.function}{' at a production size' if spec.at_size else ''} on {spec.config}"


def title(spec: Leaderboard) -> str:
    return f"{_what(spec)}, modelled step time on a {cost.chips()[spec.chip].name}"


def names_shown(results: dict) -> bool:
    """Whether the course's policy shows students their classmates' ids (`[leaderboard] names = true`)."""
    data = results.get("policy") or {}
    return (
        isinstance(data, dict)
        and isinstance(data.get("leaderboard"), dict)
        and data["leaderboard"].get("names") is True
    )


def shown_as(results: dict, place: Place, viewer: str | None) -> str:
    """The name `place` has on the board `viewer` reads (None: the class page)."""
    if viewer is None:
        return place.name
    if place.student == viewer:
        return YOU
    return place.name if names_shown(results) else f"classmate {place.rank}"


def _ranking(results: dict, lab: dict) -> Leaderboard | None:
    """The board of `lab` as this class is ranked on it (`ranked_on`), or None: the lab has no board, or the
    class was not graded on the configuration that ranks it."""
    spec = spec_of(lab)
    if spec is None:
        return None
    spec = ranked_on(spec, results)
    return spec if spec.config in {c["name"] for c in results.get("configs", [])} else None


def board(results: dict, lab: dict, viewer: str | None = None) -> dict | None:
    """One lab's leaderboard as plain data (no student id but those shown by name), or None; with `viewer`,
    as that student reads it in their feedback (their line "you", classmates as the policy says)."""
    spec = _ranking(results, lab)
    if spec is None:
        return None
    reference = step_time(lab.get("reference_costs", {}).get(spec.config), spec)
    return {
        "lab": lab["number"],
        "name": lab["name"],
        **spec.to_json(),
        "title": title(spec),
        "reference": None
        if reference is None
        else {"seconds": reference, "time": cost.format_seconds(reference)},
        "places": [p.to_json() | {"name": shown_as(results, p, viewer)} for p in places(results, lab)],
        "not_ranked": not_ranked(results, lab),
        "not_ranked_why": NO_VERIFIED_CARD.format(what=_what(spec)),
    }


def boards(results: dict) -> list[dict]:
    """The leaderboard of every lab of the results that has one."""
    return [b for b in (board(results, lab) for lab in results.get("labs", [])) if b is not None]


def words(
    spec: Leaderboard,
    seconds: float | None,
    reference: float | None,
    place: Place | None = None,
    ranked: int = 0,
    why: str = "",
) -> str:
    """One line for a student: their time (or why they are not ranked), the reference's, and their rank."""
    chip = cost.chips()[spec.chip].name
    head = f"Leaderboard ({_what(spec)})"
    ref = f"the reference: {cost.format_seconds(reference)}" if reference is not None else "no reference time"
    if seconds is None:
        why = why or f"only code that passes every test on {spec.config} is ranked"
        return f"{head}: not ranked: {why} ({ref} on a {chip})."
    out = f"{head}: yours: {cost.format_seconds(seconds)} on a {chip}; {ref}"
    if place is not None:
        out += f"; rank {place.rank} of {ranked}" + (
            " (shown as anonymous)" if place.name == ANONYMOUS else ""
        )
    return out + "."


def yours(results: dict, lab: dict, student: str) -> str | None:
    """What one student is told about the leaderboard of `lab`: their time and rank, and the reference's time."""
    spec = _ranking(results, lab)
    if spec is None:
        return None
    ranked = places(results, lab)
    mine = next((p for p in ranked if p.student == student), None)
    reference = step_time(lab.get("reference_costs", {}).get(spec.config), spec)
    row = next(
        (
            r
            for r in results.get("rows", [])
            if (r["student"], r["lab"], r["config"]) == (student, lab["number"], spec.config)
        ),
        None,
    )
    why = NO_VERIFIED_CARD.format(what=_what(spec)) if row and row["status"] == "ok" and not mine else ""
    return words(spec, mine.seconds if mine else None, reference, mine, len(ranked), why)


# ----------------------------------------------------------------------------------------
# Gradescope: each submission reports its own value; Gradescope ranks them.
# ----------------------------------------------------------------------------------------


def gradescope_name(spec: Leaderboard) -> str:
    return f"{spec.function} on {spec.config}: modelled step time on a {cost.chips()[spec.chip].name} (µs)"


def gradescope(seconds: float | None, spec: Leaderboard) -> list[dict]:
    """results.json's `leaderboard`: one entry, lower first (`order: asc`); none for a run that does not pass."""
    if seconds is None:
        return []
    return [{"name": gradescope_name(spec), "value": float(f"{seconds * 1e6:.6g}"), "order": "asc"}]
