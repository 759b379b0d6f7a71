"""Benchmark: does one run that forks many busy processes slow the run beside it?

Two notebook runs on cpu-1 start side by side through `execute.run_notebook`, as grading with
two jobs starts them: a *hog*, whose cell forks 24 processes that each leave for a session of
their own and spin for 40 s, and a *timed* neighbour, whose cell times a fixed Python loop. The
loop's time is compared with the same notebook run alone, and measured two ways, alternately:

* `shares`: as the kit runs them (as root: every run in a `cpu` cgroup of its own with the same
  `cpu.shares`, so the hog's 24 processes weigh as one run);
* `no-cpu-group`: the same runs with their `cpu` cgroup removed (pids and memory kept): the hog's
  processes then compete one by one with the neighbour's one.

It prints the median loop time of each way and its ratio to the loop alone. Needs root (cgroups);
elsewhere it says so and stops. Usage: python benchmarks/bench_fair_share.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.course import configs
from labkit.run import allowance, cgroup, execute

HOG = """import os, time
for _ in range(24):
    if os.fork() == 0:
        os.setsid()
        end = time.time() + 40
        while time.time() < end:
            pass
        os._exit(0)
time.sleep(25)
"""
LOOP = """import time
t = time.perf_counter(); x = 0
for i in range(30_000_000):
    x += i
print("loop seconds", round(time.perf_counter() - t, 3))
"""


def _notebook(source: str, path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)
    return path


def _without_cpu_group(make):
    def make_cgroups(limits):
        groups = make(limits)
        for g in [g for g in groups if "/cpu/" in str(g)]:
            cgroup.remove_cgroup(g)
        return [g for g in groups if "/cpu/" not in str(g)]

    return make_cgroups


def _loop_seconds(folder: Path) -> float:
    return float(re.search(r"loop seconds ([0-9.]+)", (folder / "executed.ipynb").read_text()).group(1))


def _alone(folder: Path) -> float:
    """The loop's time in a run with nothing beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    execute.run_notebook(
        _notebook(LOOP, folder / "timed.ipynb"), configs.CONFIGS["cpu-1"], [], folder / "timed", timeout=300
    )
    return _loop_seconds(folder / "timed")


def _pair(folder: Path) -> float:
    cpu1 = configs.CONFIGS["cpu-1"]
    folder.mkdir(parents=True, exist_ok=True)

    def run(name: str, source: str):
        return execute.run_notebook(
            _notebook(source, folder / f"{name}.ipynb"), cpu1, [], folder / name, timeout=300
        )

    with ThreadPoolExecutor(2) as pool:
        hog = pool.submit(run, "hog", HOG)
        time.sleep(4)  # the hog's processes are spinning
        timed = pool.submit(run, "timed", LOOP)
        timed.result()
        hog.result()
    return _loop_seconds(folder / "timed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    probe = cgroup.make_cgroups(allowance.DEFAULT_LIMITS) if os.geteuid() == 0 else []
    for g in probe:
        cgroup.remove_cgroup(g)
    if not any("/cpu/" in str(g) for g in probe):
        print("needs root and a v1 cpu cgroup: the kit makes a run's cpu cgroup only there")
        return 1
    made = cgroup.make_cgroups
    times: dict[str, list[float]] = {"shares": [], "no-cpu-group": []}
    alone: list[float] = []
    with tempfile.TemporaryDirectory(prefix="labkit-fair-") as tmp:
        for i in range(args.repeat):
            alone.append(_alone(Path(tmp) / f"alone-{i}"))
            for way, values in times.items():
                cgroup.make_cgroups = made if way == "shares" else _without_cpu_group(made)
                try:
                    values.append(_pair(Path(tmp) / f"{way}-{i}"))
                finally:
                    cgroup.make_cgroups = made
    base = statistics.median(alone)
    print(f"the loop alone: {base:.2f} s (median of {args.repeat})")
    for way, values in times.items():
        m = statistics.median(values)
        print(f"beside a hog of 24 processes, {way:13s}: {m:.2f} s, {m / base:.1f}x alone  ({values})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
