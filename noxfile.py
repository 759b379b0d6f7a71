"""nox sessions: thin wrappers over `python -m labkit`, run in the locked environment `.venv`.

Every session reuses `.venv` (made by `make setup` from uv.lock); nothing is resolved again. Each one
first asks `make setup` for what it needs (a no-op when `.venv` has it): a `.venv` whose set-up did
not finish is never taken for a good one.
Run them as `.venv/bin/nox -s NAME -- ARGS` (or plain `nox` with the environment activated).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PY = str(ROOT / ".venv" / "bin" / "python")

nox.options.default_venv_backend = "none"
nox.options.sessions = ["tests"]


def _setup(*make_args: str) -> None:
    subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT), "setup", *make_args], check=True)


def _kit(session: nox.Session, *args: str) -> None:
    _setup()
    session.run(PY, "-m", "labkit", *args, external=True)


@nox.session
def lab(session: nox.Session) -> None:
    """Run one lab on each device configuration: nox -s lab -- 3 [--configs cpu-8] [--notebook PATH]
    [--timeout S] [--hidden] [--keep-scratch] [--record-costs] [--isolation sandbox|limits-only|auto|pod]
    [--memory SIZE] [--disk SIZE] [--max-processes N] [--max-output SIZE]."""
    _kit(session, "lab", *(session.posargs or ["3"]))


@nox.session
def grade(session: nox.Session) -> None:
    """Grade a class: nox -s grade -- [--submissions DIR|ZIP] [--out DIR] [--roster CSV] [--policy TOML]
    [--overrides CSV] [--extensions CSV] [--adjustments CSV] [--pins CSV] [--forget NAME] [--change-policy] [--students ID,ID] [--retry]
    [--course DIR] [--labs 3,5] [--configs ..] [--jobs N] [--timeout S] [--shard i/N] [--start warm|cold]
    [--runs-from DIR] [--plan FILE] [--isolation sandbox|limits-only|auto|pod] [--memory SIZE] [--disk SIZE]
    [--max-processes N] [--max-output SIZE].
    The TA's inputs are kept in OUT/course: one left out is the one kept (docs/grading.md)."""
    _kit(session, "grade", *session.posargs)


@nox.session
def slurm_grade(session: nox.Session) -> None:
    """Grade a class on a Slurm cluster: nox -s slurm_grade -- --shards N [--submissions DIR] [--out DIR]
    [--roster CSV] [--policy TOML] [--overrides CSV] [--extensions CSV] [--adjustments CSV] [--forget NAME]
    [--pins CSV] [--change-policy] [--course DIR] [--students ID,ID] [--retry] [--labs ..] [--configs ..] [--jobs N]
    [--timeout S] [--partition P] [--account A] [--no-wait] [--every S] [-- more grade arguments]."""
    _kit(session, "slurm-grade", *session.posargs)


@nox.session
def progress(session: nox.Session) -> None:
    """How far a grading run, or its shards on any engine, has got: nox -s progress -- OUT [--watch] [--every S]."""
    _kit(session, "progress", *session.posargs)


@nox.session
def scoreboard(session: nox.Session) -> None:
    """Your own results across labs (no arguments, or [--build DIR] [--out DIR]), or:
    nox -s scoreboard -- merge DIR... --out DIR, or:
    nox -s scoreboard -- export --format canvas|wide [--missing blank|excused] --out FILE SCOREBOARD_DIR."""
    _kit(session, "scoreboard", *session.posargs)


@nox.session
def student_notebooks(session: nox.Session) -> None:
    """Generate labs/ from reference/: nox -s student_notebooks [-- --check] [-- --force]."""
    _kit(session, "student-notebooks", *session.posargs)


@nox.session
def release(session: nox.Session) -> None:
    """The student release, without solutions or hidden tests: nox -s release [-- --out DIR]."""
    _kit(session, "release", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The kit's own test suite."""
    _setup("FOR=test")
    session.run(PY, "-m", "pytest", *session.posargs, external=True)


@nox.session
def other_jax(session: nox.Session) -> None:
    """Every reference and the student loop on the lock's other JAX (Python 3.11 against 3.12 and newer)."""
    session.run("make", "--no-print-directory", "-C", str(ROOT), "test-other-jax", external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: the student loop and grading, each against plain python (arguments go to bench_lab.py)."""
    session.run(PY, str(ROOT / "benchmarks" / "bench_lab.py"), *session.posargs, external=True)
    session.run(PY, str(ROOT / "benchmarks" / "bench_grade.py"), external=True)
