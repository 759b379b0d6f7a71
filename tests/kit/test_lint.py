"""The kit's static checks, as `make lint` runs them: ruff (with pyproject.toml's rules), mypy over labkit/
(strict for the readers of student data, the rest held by the ratchet list) and vulture (dead code).
Each fails with the checker's own findings; each skips, saying so, where its tool is not installed."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
from conftest import ROOT


def _lint_paths() -> list[str]:
    """What `make lint` gives ruff: the Makefile's LINT_PATHS line, so the two never drift apart."""
    found = re.search(r"^LINT_PATHS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile has no `LINT_PATHS := ...` line for `make lint`"
    return found.group(1).split()


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed here (the `dev` group: make setup FOR=test)")
    return subprocess.run(
        [sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing():
    result = _run("ruff", "check", "--no-cache", "--output-format", "concise", *_lint_paths())
    assert result.returncode == 0, (
        f"ruff check found (fix them, or say why in pyproject.toml):\n{result.stdout}{result.stderr}"
    )


def test_ruff_format_would_change_nothing():
    result = _run("ruff", "format", "--check", "--no-cache", *_lint_paths())
    assert result.returncode == 0, (
        f"ruff format would change these files (run it):\n{result.stdout}{result.stderr}"
    )


def test_mypy_finds_nothing():
    result = _run("mypy")
    assert result.returncode == 0, (
        f"mypy found (a module on the ratchet list only comes off it):\n{result.stdout}{result.stderr}"
    )


def test_vulture_finds_no_dead_code():
    result = _run("vulture")
    assert result.returncode == 0, (
        "vulture found unused code: delete it, or add the name to "
        f"tools/vulture_whitelist.py with who uses it:\n{result.stdout}{result.stderr}"
    )


def test_strict_modules_are_not_on_the_ratchet_list():
    """The readers of student data stay strict: none of them may hide in the ignore_errors list."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = {m for o in config if o.get("disallow_untyped_defs") for m in o["module"]}
    ignored = {m for o in config if o.get("ignore_errors") for m in o["module"]}
    assert {"labkit.judge.records", "labkit.run.scratch", "labkit.judge.program"} <= strict
    assert not strict & ignored, f"strict and ignored at once: {sorted(strict & ignored)}"
