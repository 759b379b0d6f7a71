"""A grading run's units: the grader made (its sandbox checked first), the references graded and checked,
then every student's units, each row naming the notebook it graded. `grade` calls these in that order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from labkit.course import catalog
from labkit.course.configs import DeviceConfig
from labkit.grading.intake.collect import REFERENCE, Submissions, Unit
from labkit.grading.running.engine import Grader, default_jobs
from labkit.grading.running.store import Store
from labkit.grading.state.errors import GradeError, ReferenceBroken
from labkit.run import modes
from labkit.run.allowance import DEFAULT_LIMITS, Limits

RETRIED = (
    "error",
    "timeout",
)  # the kept rows `--retry` grades again (a run that may go otherwise under less load)


def check_reference(rows: list[dict], labs: dict[int, catalog.Lab]) -> None:
    """Every reference must pass every test on every configuration that ran; else say which test is broken."""
    broken = []
    for row in rows:
        if row["status"] in ("ok", "skipped"):
            continue
        lab = labs[row["lab"]]
        bad = [t for t in row["tests"] if t["status"] not in ("passed", "skipped")]
        if not bad or row["status"] in ("error", "timeout"):  # the run itself: one line, not one per test
            broken.append(
                f"{lab.reference.relative_to(lab.root)} on {row['config']}: {row['status']}: {row['message']}"
            )
            continue
        for t in bad:
            where = "hidden" if t["hidden"] else "public"
            broken.append(
                f"{lab.reference.relative_to(lab.root)} on {row['config']}: {t['test']} "
                f"({where}, {t['file']}) {t['status']}: {t['message']}"
            )
    if broken:
        raise ReferenceBroken(
            "the reference solution does not pass its own tests, so grading stops here:\n  "
            + "\n  ".join(broken)
        )


def check_isolation(limits: Limits, stream) -> None:
    """Before anything runs: the sandbox every run will get, or `modes.SandboxUnavailable` (fail closed).

    Only `--isolation limits-only`, asked for by name, grades without one; every row then says so.
    """
    if limits.isolation == modes.LIMITS_ONLY:
        print(
            "isolation: resource limits only, asked for by name (--isolation limits-only): a notebook can read "
            "what this user can read and use the network; every row says limits-only",
            file=stream,
            flush=True,
        )
        return
    if limits.isolation == modes.POD:
        modes.isolation(modes.POD)  # raises, with the reason, where this is no pod of the kit's design
        print(
            "isolation: no bubblewrap, the pod is the sandbox, asked for by name (--isolation pod); every row "
            "says pod",
            file=stream,
            flush=True,
        )
        return
    if limits.isolation != modes.SANDBOX:
        return
    found = modes.require_sandbox("nothing was graded")
    print(f"isolation: every notebook runs in a sandbox: {found.summary()}", file=stream, flush=True)
    for problem in found.problems:
        print(f"  not used: {problem.lines()[0]}", file=stream, flush=True)


def grader(
    out: Path,
    labs: list[catalog.Lab],
    configs: list[DeviceConfig],
    *,
    jobs: int | None,
    timeout: float,
    limits: Limits | None,
    start: str,
    runs_from: Path | None,
    plan: Path | None,
    stream,
    terminal: bool | None,
) -> Grader:
    """The grader of a run's units, its sandbox checked (`check_isolation` says what it is, or refuses)."""
    limits = limits or replace(DEFAULT_LIMITS, isolation=modes.SANDBOX)
    check_isolation(limits, stream)
    return Grader(
        out,
        labs,
        configs,
        jobs=jobs or default_jobs(),
        timeout=timeout,
        limits=limits,
        stream=stream,
        terminal=terminal,
        warm=start != "cold",
        pods=pods_of(runs_from, plan),
    )


def pods_of(runs_from: Path | None, plan: Path | None) -> tuple[Path, Path] | None:
    """(RUNS, PLAN) where the notebooks ran in pods of their own (labkit.grading.running.pods), else None."""
    if (runs_from is None) != (plan is None):
        raise GradeError(
            "--runs-from and --plan go together: the pods' outputs and the plan that made their inputs"
        )
    return (
        (Path(runs_from).absolute(), Path(plan).absolute())
        if runs_from is not None and plan is not None
        else None
    )


def again(named: set[str], retry: bool):
    """Which kept units to grade again: the named students' every unit; with retry, errors and timeouts."""

    def again(unit: Unit, row: dict) -> bool:
        return unit.student in named or (retry and row.get("status") in RETRIED)

    return again


def grade_references(
    grader: Grader, out: Path, labs: list[catalog.Lab], chosen: list[DeviceConfig]
) -> list[dict]:
    """The reference solutions graded first: they must pass everything, or nothing else is worth grading."""
    units = [Unit(REFERENCE, lab.number, c.name, lab.reference, kit=True) for lab in labs for c in chosen]
    rows = grader.run(units, Store(out / "reference"), "reference solutions", fills_cache=True)
    check_reference(rows, grader.labs)
    return rows


def grade_students(
    grader: Grader,
    out: Path,
    subs: Submissions,
    students: list[str],
    labs: list[catalog.Lab],
    chosen: list[DeviceConfig],
    ref_rows: list[dict],
    handed: dict[tuple[str, int], dict],
    only: Callable[[str, int, str], bool] | None = None,
) -> list[dict]:
    """Every (student, lab, configuration) graded (with `only`, those it takes: a narrower run's), each row
    scored against what the reference scored there and naming the digest of the notebook graded."""
    expected = {(r["lab"], r["config"]): (r["total"], r["max_points"]) for r in ref_rows}
    units = [
        Unit(s, lab.number, c.name, subs.students[s].get(lab.number), subs.refused.get((s, lab.number), ""))
        for s in students
        for lab in labs
        for c in chosen
        if only is None or only(s, lab.number, c.name)
    ]
    rows = grader.run(units, Store(out), f"grading {len(students)} students", expected)
    for row in rows:
        row["digest"] = handed.get((row["student"], row["lab"]), {}).get("digest", "")
    return rows
