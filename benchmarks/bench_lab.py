"""Benchmark: the student loop against plain python.

For one lab (default 3) it measures, in the same run, alternating so that load on the
machine falls on both alike:

* kit: `python -m labkit lab N --notebook reference/lab-N.ipynb --configs cpu-1,cpu-8`,
  the command behind `make lab-N` (a warm server that imports JAX once and forks one kernel per
  configuration, papermill, the judge);
* kit, cold starts: the same with `LABKIT_WARM=off` (a fresh kernel per configuration);
* baseline: the same lab code as a plain python script, once per configuration, one after
  the other: the reference notebook's code cells, then the exercise functions called on the
  tests' inputs.

It prints the medians and their ratio. Usage: python benchmarks/bench_lab.py [--lab 3] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
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
from labkit.judge import judge

CONFIGS = ("cpu-1", "cpu-8")


def baseline_script(lab: catalog.Lab, folder: Path) -> Path:
    nb = json.loads(lab.reference.read_text())
    code = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    (folder / "calls.json").write_text(json.dumps({"calls": judge.collect_calls(lab.test_dirs())}))
    script = folder / "lab.py"
    script.write_text(
        code
        + "\n\nimport labkit.judge.harness as _h\n"
        + f"_h.run(globals(), {str(folder / 'calls.json')!r}, {str(folder / 'results.json')!r})\n"
    )
    return script


def timed(cmd: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    lab = catalog.lab(args.lab)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = baseline_script(lab, tmp)
        kit_cmd = [
            sys.executable,
            "-m",
            "labkit",
            "lab",
            str(lab.number),
            "--notebook",
            str(lab.reference),
            "--configs",
            ",".join(CONFIGS),
        ]
        kit_env = dict(os.environ, LABKIT_BUILD=str(tmp / "build"))
        kit, cold, base = [], [], []
        timed(kit_cmd, kit_env)  # warm the file cache once; not counted
        for _ in range(args.repeat):
            kit.append(timed(kit_cmd, kit_env))
            cold.append(timed(kit_cmd, kit_env | {"LABKIT_WARM": "off"}))
            base.append(
                sum(
                    timed([sys.executable, str(script)], configs.CONFIGS[c].environment() | {"LABKIT_RUN": c})
                    for c in CONFIGS
                )
            )
    k, c, b = statistics.median(kit), statistics.median(cold), statistics.median(base)
    print(
        f"lab {lab.number} on {', '.join(CONFIGS)}, {args.repeat} repeats, medians; load average now "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}:"
    )
    print(
        f"  kit (python -m labkit lab {lab.number}):        {k:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in kit)})"
    )
    print(
        f"  kit, cold starts (LABKIT_WARM=off):   {c:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in cold)})"
    )
    print(
        f"  plain python, once per configuration: {b:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in base)})"
    )
    print(f"  ratio kit / plain python: {k / b:.2f}x   (target: at most 1.2x); cold starts: {c / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
