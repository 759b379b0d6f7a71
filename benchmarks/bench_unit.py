"""Benchmark: where one graded unit's time goes, started cold and warm.

One unit is one notebook on one configuration (default: lab 3's reference on cpu-8, with its
hidden tests' calls). It is run `--repeat` times each way, alternately:

* cold: a fresh kernel per run (`sandbox.launch`: bubblewrap, a new Python interpreter that
  imports JAX, numpy and IPython, then ipykernel's start);
* warm: a kernel forked by a warm server (`labkit.run.warm`) that imported all that once;
* warm + cache: the same, reading JAX's compilation cache (`labkit.run.jaxcache`) read-only, as a
  student's run does once the reference solution's run filled it (here: one run, not counted).

For each run it reads the executed notebook's own timings (papermill's per-cell start and end)
and splits the run's wall time into: the kernel's start (from the run's start to its first
cell), the student's cells, of which JAX's compiles (summed from `jax.monitoring`'s compile
events by a cell added first), the kit's harness cell (calling the exercises, examining
compiled programs, exporting them), the kit's own run of the exported programs in a fresh
sandbox (`labkit.judge.verify`), and the end (stopping the kernel, reading results). Then the judge (the
lab's tests on the recorded results) is timed once per way, and, for scale, a bare interpreter
and one that imports what a run imports. It prints medians.

Usage: python benchmarks/bench_unit.py [--lab 3] [--config cpu-8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.course import catalog, configs
from labkit.judge import judge
from labkit.run import allowance, execute, jaxcache, modes, warm

COMPILES_FIRST = """\
import jax.monitoring as _m
_labkit_bench = {"compile": 0.0}
def _labkit_bench_listen(event, duration, **kw):
    if "compile" in event and event.endswith("duration"):
        _labkit_bench["compile"] += duration
_m.register_event_duration_secs_listener(_labkit_bench_listen)
"""
COMPILES_LAST = "open('compile_seconds', 'w').write(str(_labkit_bench['compile']))"
WAYS = ("cold", "warm", "warm + cache")
IMPORTS = "import jax, jax.numpy, numpy, flax.nnx, IPython, ipykernel.kernelapp"


def instrumented(notebook: Path, folder: Path) -> Path:
    nb = json.loads(notebook.read_text())
    cell = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "id": "labkit-bench"}
    nb["cells"] = [
        dict(cell, source=COMPILES_FIRST, id="bench-first"),
        *nb["cells"],
        dict(cell, source=COMPILES_LAST, id="bench-last"),
    ]
    path = folder / notebook.name
    path.write_text(json.dumps(nb))
    return path


def stages(record: execute.RunRecord, wall: float) -> dict[str, float]:
    """The run's wall time split by the executed notebook's own per-cell timings."""
    work = Path(record.workdir)
    nb = json.loads((work / "executed.ipynb").read_text())
    times = []
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("papermill", {})
        if cell["cell_type"] == "code" and meta.get("start_time") and meta.get("end_time"):
            times.append(
                (
                    datetime.fromisoformat(meta["start_time"].rstrip("Z")),
                    datetime.fromisoformat(meta["end_time"].rstrip("Z")),
                    cell,
                )
            )
    started = datetime.fromisoformat(nb["metadata"]["papermill"]["start_time"].rstrip("Z"))
    harness = [t for t in times if "labkit.judge.harness" in "".join(t[2]["source"])]
    student = [t for t in times if t not in harness]
    cells = sum((end - start).total_seconds() for start, end, _ in student)
    harness_s = sum((end - start).total_seconds() for start, end, _ in harness)
    kernel_start = (times[0][0] - started).total_seconds() if times else 0.0
    compile_s = float((work / "compile_seconds").read_text()) if (work / "compile_seconds").exists() else 0.0
    verify_s = record.verify_seconds
    return {
        "run": wall,
        "kernel start": kernel_start,
        "cells": cells,
        "of which compiles": compile_s,
        "harness": harness_s,
        "kit runs programs": verify_s,
        "end": wall - kernel_start - cells - harness_s - verify_s,
    }


def timed(cmd: list[str], repeat: int) -> float:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True)
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", type=int, default=3)
    ap.add_argument("--config", default="cpu-8")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    lab, config = catalog.lab(args.lab), configs.by_name(args.config)
    limits = allowance.Limits(isolation=modes.SANDBOX)
    calls = judge.collect_calls(lab.test_dirs(hidden=True))
    (ROOT / "build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "build", prefix="bench-unit-") as tmp:
        folder = Path(tmp)
        notebook = instrumented(lab.reference, folder)
        base = {k: v for k, v in config.environment().items() if k != "JAX_NUM_CPU_DEVICES"}
        cache = jaxcache.prepare(folder / "cache")
        server = warm.Server([folder / "runs"], base, folder / "server", shared=[cache.folder])
        began = time.perf_counter()
        if not server.start(limits):
            raise SystemExit(f"no warm server here: {server.why}")
        server_start = time.perf_counter() - began
        found: dict[str, list[dict]] = {way: [] for way in WAYS}
        last: dict[str, execute.RunRecord] = {}
        try:
            filled = execute.run_notebook(
                notebook, config, calls, folder / "runs" / "fill", limits=limits, warm=server, cache=cache
            )  # as the reference run does; not counted
            if filled.status != "ok":
                raise SystemExit(f"the run that fills the cache: {filled.status} {filled.message}")
            for i in range(args.repeat):
                for way, with_server, with_cache in (
                    ("cold", None, None),
                    ("warm", server, None),
                    ("warm + cache", server, cache.read_only()),
                ):
                    start = time.perf_counter()
                    record = execute.run_notebook(
                        notebook,
                        config,
                        calls,
                        folder / "runs" / f"{way[:4]}{i}-{len(way)}",
                        limits=limits,
                        warm=with_server,
                        cache=with_cache,
                    )
                    wall = time.perf_counter() - start
                    if record.status != "ok" or record.start != way.split()[0]:
                        raise SystemExit(f"{way} run {i}: {record.status} {record.start} {record.message}")
                    found[way].append(stages(record, wall))
                    last[way] = record
        finally:
            server.stop()
        judged = {}
        for way, record in last.items():
            spec = judge.RunSpec(way, notebook, config, Path(record.workdir), record=record)
            start = time.perf_counter()
            judgement = judge.judge(
                lab.test_dirs(hidden=True), [spec], hidden_dirs=[lab.hidden_tests], jobs=1
            )
            judged[way] = time.perf_counter() - start
            assert all(o.status == "passed" for o in judgement.outcomes), [
                (o.test, o.status) for o in judgement.outcomes
            ]
    bare = timed([sys.executable, "-c", "pass"], args.repeat)
    imports = timed([sys.executable, "-c", IMPORTS], args.repeat)
    print(f"lab {args.lab}'s reference on {args.config}, {args.repeat} runs each way, medians in seconds")
    print(f"{'stage':<22}" + "".join(f"{way:>14}" for way in WAYS))
    for key in found["cold"][0]:
        print(
            f"{key:<22}" + "".join(f"{statistics.median(r[key] for r in found[way]):14.2f}" for way in WAYS)
        )
    print(f"{'judge (one session)':<22}" + "".join(f"{judged[way]:14.2f}" for way in WAYS))
    print(
        f"for scale: a bare interpreter {bare:.2f} s; one that imports what a run imports {imports:.2f} s; "
        f"the warm server's start (paid once per grading run) {server_start:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
