"""The suite's tiers: `make test-fast` runs the modules conftest.FAST_MODULES names, `make test` all of them."""

from __future__ import annotations

import re
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[2]
KIT_TESTS = ROOT / "tests" / "kit"


def test_every_fast_module_exists():
    missing = sorted(name for name in conftest.FAST_MODULES if not (KIT_TESTS / name).is_file())
    assert not missing, f"conftest.FAST_MODULES names modules that are not in tests/kit: {missing}"


def test_no_fast_module_starts_a_service_of_the_whole_machine():
    wide = sorted(name for name in conftest.FAST_MODULES if conftest._machine_wide(f"tests/kit/{name}"))
    assert not wide, f"machine-wide modules cannot be in the fast tier: {wide}"


def test_the_fast_tier_is_a_strict_part_of_the_suite():
    every = {p.name for p in KIT_TESTS.glob("test_*.py")}
    assert every > conftest.FAST_MODULES


def test_make_test_fast_selects_the_fast_marker_and_make_test_selects_none():
    makefile = (ROOT / "Makefile").read_text()
    fast = re.search(r"^test-fast:.*\n\t(.*)$", makefile, re.M).group(1)
    full = re.search(r"^test:.*\n\t(.*)$", makefile, re.M).group(1)
    assert "-m fast" in fast
    assert "-m " not in full.replace("-m pytest", "")
