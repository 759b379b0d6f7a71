"""Every lab's reference on some configurations, through the kit, as a markdown table.

For each lab it runs `python -m labkit lab N --notebook reference/lab-N.ipynb --configs C --hidden`
(one call per lab runs every configuration named) and prints one row per lab and configuration:
the tests passed, the notebook run's own seconds, the device it ran on and the JAX version the
run reported. A configuration that cannot run here shows `skipped` and the reason.

Usage: python benchmarks/bench_references.py --configs gpu [--labs 1,2,3] [--memory 4G]
(the table BENCHMARKS.md asks for on a machine with an NVIDIA GPU: `--configs gpu`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.course import catalog, configs


def rows_of(report: dict, lab: int, names: list[str]) -> list[str]:
    rows = []
    for name in names:
        run = report.get("runs", {}).get(name, {})
        mine = [o for o in report.get("outcomes", []) if o.get("config") == name]
        passed = sum(o["status"] == "passed" for o in mine)
        env = run.get("environment") or {}
        if not env and run.get("processes"):
            env = run["processes"][0].get("environment") or {}
        if run.get("status") == "skipped":
            status = f"skipped ({run.get('message', '')})"
        else:
            errors = len(run.get("cell_errors") or [])
            status = f"{passed}/{len(mine)}" + (f", {errors} cell error(s)" if errors else "")
            if run.get("status") not in ("ok", None):
                status += f", {run['status']}: {run.get('message', '')[:120]}"
        seconds = run.get("seconds")
        rows.append(
            f"| {lab} | {name} | {status} | {seconds if seconds is not None else '–'} | "
            f"{env.get('device_kind', '–')} x {env.get('device_count', '–')} | {env.get('jax_version', '–')} |"
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", required=True, help="comma-separated configurations, e.g. gpu")
    parser.add_argument("--labs", default=None, help="comma-separated lab numbers (default: every lab)")
    parser.add_argument("--timeout", default="600", help="seconds one notebook may run")
    parser.add_argument("--memory", default=None, help="passed to `python -m labkit lab --memory`")
    args = parser.parse_args(argv)
    names = [c.name for c in configs.parse(args.configs)]
    labs = [catalog.lab(n) for n in args.labs.split(",")] if args.labs else catalog.labs()
    print("| lab | configuration | tests passed | seconds | device | JAX |")
    print("| --- | --- | --- | ---: | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="labkit-bench-") as build:
        for lab in labs:
            cmd = [
                sys.executable,
                "-m",
                "labkit",
                "lab",
                str(lab.number),
                "--notebook",
                str(lab.reference),
                "--configs",
                ",".join(names),
                "--hidden",
                "--timeout",
                args.timeout,
            ]
            if args.memory:
                cmd += ["--memory", args.memory]
            subprocess.run(
                cmd, cwd=ROOT, env=dict(os.environ, LABKIT_BUILD=build), capture_output=True, text=True
            )
            report_path = Path(build) / f"lab-{lab.number}" / "report.json"
            report = json.loads(report_path.read_text()) if report_path.exists() else {}
            for row in rows_of(report, lab.number, names):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
