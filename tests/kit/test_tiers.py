"""The suite's tiers: `make test-fast` runs the modules conftest.FAST_MODULES names, `make test` all of them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

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


def test_each_test_records_the_cpu_its_kit_runs_used_and_the_run_ranks_the_modules_by_it(tmp_path):
    # A test whose child process spins for half a second of CPU: the child's time is the test's, as a kit run's is.
    (tmp_path / "test_spin.py").write_text(
        "import subprocess, sys\n"
        "def test_spins():\n"
        "    spin = 'import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass'\n"
        "    subprocess.run([sys.executable, '-c', spin], check=True)\n"
    )
    junit = tmp_path / "junit.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_spin.py"),
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=f"{KIT_TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    properties = ElementTree.parse(junit).getroot().iter("property")
    cpu = [float(p.get("value")) for p in properties if p.get("name") == "cpu_seconds"]
    assert len(cpu) == 1 and 0.5 <= cpu[0] < 30, cpu
    assert "CPU seconds by test module" in done.stdout and "test_spin.py" in done.stdout, done.stdout[-1000:]
    # and how busy the whole machine was, which says whether fewer tests or a better spread would shorten a run
    busy = re.search(
        r"the machine's (\d+) CPUs were busy ([\d.]+)% of the run: (\d+) CPU-s, (\d+) of them", done.stdout
    )
    assert busy is not None, done.stdout[-1000:]
    assert (
        int(busy[1]) == os.cpu_count() and 0 < float(busy[2]) <= 100 and int(busy[3]) + 1 >= int(busy[4])
    ), busy[0]
