"""The TA's inputs as a registry (`INPUTS`): each input's name (its flag `--NAME`, the Makefile's `NAME=` in
capitals), the name of its kept copy in OUT/course/, and the check that parses its text against the class
(`Context`), raising InputError with the file and line. One whose parsed value goes into the results names the
key (`results_key`). Adding an input is one more `Input(...)` line in `INPUTS`; `course` keeps them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit.course import catalog
from labkit.grading.state import adjustments as adjustments_mod
from labkit.grading.state import deadlines, table
from labkit.grading.state import overrides as overrides_mod
from labkit.grading.state import pins as pins_mod
from labkit.grading.state import policy as policy_mod
from labkit.grading.state import roster as roster_mod


class InputError(ValueError):
    """A TA's input that cannot be used: the message names the file and the line, and what to do."""


@dataclass
class Context:
    """What the inputs are checked against: the course's labs, and the class once it is known."""

    labs: list[int]
    students: set[str] | None = None  # the roster's ids where there is one, else the submission folders
    tests: dict[int, set[str]] = field(
        default_factory=dict
    )  # lab -> its test names, collected when first asked
    points: dict[int, float] = field(
        default_factory=dict
    )  # lab -> what its tests are worth, collected with them
    extra_credit: dict[int, float] = field(default_factory=dict)  # the policy's [labs.N] extra_credit
    # while a kept copy is checked: its lines of students no longer in the class, kept but inactive
    inactive: list[str] | None = None

    def lab_tests(self) -> Mapping[int, set[str]]:
        """lab -> the names of its tests (public and hidden), each lab's collected only when asked for."""
        return _LabTests(self)

    def lab_points(self) -> Mapping[int, float]:
        """lab -> the points its tests are worth together (a points override's bound), collected when asked."""
        return _LabPoints(self)


class _LabTests(Mapping):
    def __init__(self, context: Context):
        self.context = context

    def __getitem__(self, lab: int) -> set[str]:
        if lab not in self.context.labs:
            raise KeyError(lab)
        if lab not in self.context.tests:
            points = test_points(catalog.lab(str(lab)))
            self.context.tests[lab], self.context.points[lab] = set(points), sum(points.values())
        return self.context.tests[lab]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.context.labs))

    def __len__(self) -> int:
        return len(self.context.labs)

    def __contains__(self, lab) -> bool:
        return lab in self.context.labs


class _LabPoints(_LabTests):
    def __getitem__(self, lab: int) -> float:  # type: ignore[override]
        super().__getitem__(lab)
        return self.context.points[lab]


class _Names:
    """A pytest plugin that notes the name of every lab test collected (what the judge reports as `test`)."""

    def __init__(self):
        self.names: set[str] = set()
        self.points: dict[str, float] = {}
        self.errors: list[str] = []

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(report.nodeid)

    def pytest_collection_finish(self, session):
        for item in session.items:
            if "lab_run" in getattr(item, "fixturenames", ()):
                self.points[item.originalname] = getattr(item.function, "__labkit_points__", 1)
        self.names = set(self.points)


def test_points(lab: catalog.Lab) -> dict[str, float]:
    """Each of a lab's public and hidden tests by name, with its points, collected without running anything."""
    import pytest

    from labkit.judge import judge

    plugin = _Names()
    status = pytest.main(judge._args(lab.test_dirs(hidden=True)) + ["--collect-only"], plugins=[plugin])
    if plugin.errors or status not in (0, 5):  # 5: none collected, which the names then say
        raise InputError(
            f"the tests of {lab.name} could not be collected ({', '.join(plugin.errors) or f'pytest exit {status}'})"
        )
    return plugin.points


@dataclass(frozen=True)
class Input:
    name: str  # the flag is --NAME, the Makefile's variable NAME in capitals
    file: str  # the kept copy: OUT/course/<file>
    help: str
    check: Callable[
        [str, str, Context], Any
    ]  # (text, source, class) -> parsed; ValueError naming source and line
    needs_class: bool = True  # checked once the class (roster or submission folders) is known
    results_key: str | None = None  # where the parsed value goes in the results; None: grade uses it itself


def _check_roster(text: str, source: str, context: Context) -> roster_mod.Roster:
    return roster_mod.parse(text, source)


def _check_policy(text: str, source: str, context: Context) -> policy_mod.Policy:
    try:
        return policy_mod.parse(text, source, context.labs)
    except policy_mod.PolicyError as e:
        said = str(e)
        if not said.startswith(f"{source}: "):
            raise
        what = said[len(source) + 2 :]  # in the one shape of every TA file's refusal: line, field, fix
        found = re.search(r"\[([\w.]+)\](?: (\w+))?", what)
        key = (
            f"[{found.group(1)}]" + (f" {found.group(2)}" if found and found.group(2) else "")
            if found
            else ""
        )
        raise policy_mod.PolicyError(
            table.message(source, _toml_line(text, said), what, key, POLICY_FIX)
        ) from None


POLICY_FIX = 'the keys of a policy and their values are in docs/grading.md, "Points and the policy"'


def _toml_line(text: str, message: str) -> int | None:
    """The line of the `[table] key` a policy message names (tomllib's own messages give theirs)."""
    found = re.search(r"\[([\w.]+)\](?: (\w+))?", message)
    if not found:
        return None
    table, key = found.groups()
    current = ""
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            current = stripped.strip("[]").strip()
            if current == table and key is None:
                return n
        elif current == table and key and re.match(rf"{re.escape(key)}\s*=", stripped):
            return n
    return None


def _check_overrides(text: str, source: str, context: Context) -> list[dict]:
    return overrides_mod.parse(
        text,
        source,
        context.students or set(),
        context.lab_tests(),
        context.lab_points(),
        context.extra_credit,
        context.inactive,
    )


def _check_extensions(text: str, source: str, context: Context) -> dict:
    return deadlines.parse_extensions(
        text, source, context.students or set(), set(context.labs), context.inactive
    )


def _check_adjustments(text: str, source: str, context: Context) -> list[dict]:
    return adjustments_mod.parse(
        text, source, context.students or set(), set(context.labs), context.lab_points(), context.inactive
    )


def _check_pins(text: str, source: str, context: Context) -> dict:
    return pins_mod.parse_pins(text, source, context.students or set(), set(context.labs), context.inactive)


# The registry, in the order the inputs are checked (the roster first: the others are checked against it).
INPUTS: dict[str, Input] = {
    i.name: i
    for i in [
        Input(
            "roster",
            "roster.csv",
            "CSV of the class (student, and optionally name, email, lms_id, section, leaderboard)",
            _check_roster,
            needs_class=False,
        ),
        Input(
            "policy",
            "policy.toml",
            "the grading policy (TOML; default tests/policy.toml)",
            _check_policy,
            needs_class=False,
        ),  # a change of policy is asked for by name: --change-policy
        Input(
            "overrides",
            "overrides.csv",
            "CSV of a TA's overrides (student,lab,points,test,status,comment)",
            _check_overrides,
            results_key="overrides",
        ),
        Input(
            "extensions",
            "extensions.csv",
            "CSV of extensions (student,lab,days)",
            _check_extensions,
            results_key="extensions",
        ),
        Input(
            "adjustments",
            "adjustments.csv",
            "CSV of a TA's point adjustments and rubric items (student,lab,points,comment[,item,max])",
            _check_adjustments,
            results_key="adjustments",
        ),
        Input(
            "pins",
            "pins.csv",
            "CSV of the kept versions a TA pins (student,lab,version,comment): the one that counts",
            _check_pins,
        ),  # used by labkit/grading/intake/counted.py, before anything is graded
    ]
}
