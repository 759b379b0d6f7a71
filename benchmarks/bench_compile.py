"""Benchmark: the CPU configurations' compile flags (configs.CPU_COMPILE_FLAGS) against XLA's defaults.

For each lab it runs, in the same run and alternating so that load on the machine falls on both alike,
`python -m labkit lab N --notebook reference/lab-N.ipynb --configs cpu-1,cpu-8 --hidden` with an empty
compile cache (a student's first run of the lab):

* kit: the configurations as they are (LLVM's optimisations off);
* baseline: the same run with the flag taken out of every CPU configuration (XLA's default level).

It prints, per lab and in all, the median wall seconds and the median CPU seconds, their ratios, and
whether both runs printed the same verdicts and cost cards. The CPU seconds are the whole machine's
(/proc/stat), since a sandbox's processes are not the benchmark's children: run it on a quiet machine.
Usage: python benchmarks/bench_compile.py [--labs 3,8,10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.course import catalog, configs

# The kit's command with every CPU configuration's compile flag taken out, before anything reads them.
WITHOUT_FLAGS = """
import dataclasses, runpy, sys
from labkit.course import configs
configs.CPU_COMPILE_FLAGS = ""
for name, config in list(configs.CONFIGS.items()):
    if "XLA_FLAGS" in config.env:
        env = {k: v for k, v in config.env.items() if k != "XLA_FLAGS"}
        configs.CONFIGS[name] = dataclasses.replace(config, env=env)
sys.argv = ["labkit", *sys.argv[1:]]
runpy.run_module("labkit", run_name="__main__", alter_sys=True)
"""


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent so far, outside the idle loop (Linux's /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(args: list[str], build: Path, flags: bool) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, what it printed with its build folder called BUILD) of one `labkit` call,
    its build folder and compile cache empty."""
    env = dict(os.environ, LABKIT_BUILD=str(build), LABKIT_COMPILE_CACHE_DIR=str(build / "jax-cache"))
    cmd = [sys.executable, "-m", "labkit", *args] if flags else [sys.executable, "-c", WITHOUT_FLAGS, *args]
    before, start = machine_cpu(), time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - start, machine_cpu() - before
    if done.returncode != 0:
        raise SystemExit(
            f"`{' '.join(args)}` ended with {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return wall, cpu, done.stdout.replace(str(build), "BUILD")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", default=None, help="comma-separated lab numbers (default: every lab)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    labs = [catalog.lab(int(n)) for n in args.labs.split(",")] if args.labs else catalog.labs()
    print(f"CPU configurations compile with XLA_FLAGS={configs.CPU_COMPILE_FLAGS}; baseline: XLA's defaults")
    print(
        "| lab | wall s, kit | wall s, baseline | ratio | CPU s, kit | CPU s, baseline | ratio | same output |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    totals = {True: [0.0, 0.0], False: [0.0, 0.0]}
    with tempfile.TemporaryDirectory(prefix="labkit-bench-") as tmp:
        for lab in labs:
            call = [
                "lab",
                str(lab.number),
                "--notebook",
                str(lab.reference),
                "--configs",
                "cpu-1,cpu-8",
                "--hidden",
            ]
            walls, cpus, said = {True: [], False: []}, {True: [], False: []}, {}
            for i in range(args.repeat):
                for flags in (True, False):
                    wall, cpu, out = run(call, Path(tmp) / f"{lab.number}-{flags}-{i}", flags)
                    walls[flags].append(wall)
                    cpus[flags].append(cpu)
                    said[flags] = out
            wall = {f: statistics.median(walls[f]) for f in walls}
            cpu = {f: statistics.median(cpus[f]) for f in cpus}
            for f in (True, False):
                totals[f][0] += wall[f]
                totals[f][1] += cpu[f]
            print(
                f"| {lab.number} | {wall[True]:.1f} | {wall[False]:.1f} | {wall[True] / wall[False]:.2f} "
                f"| {cpu[True]:.1f} | {cpu[False]:.1f} | {cpu[True] / cpu[False]:.2f} "
                f"| {'yes' if said[True] == said[False] else 'NO'} |",
                flush=True,
            )
    (kw, kc), (bw, bc) = totals[True], totals[False]
    print(f"| all | {kw:.1f} | {bw:.1f} | {kw / bw:.2f} | {kc:.1f} | {bc:.1f} | {kc / bc:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
