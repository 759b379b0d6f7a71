"""Benchmark: grading a synthetic class against the same code run as plain python scripts.

The class: `--students` students (default 20), each handing in every lab from 3 to 6 that
exists with a reference solution, made in turn of the reference, the unmodified student
notebook, and a buggy version (the reference with its meshes built over `jax.devices()[:1]`);
each notebook's first code cell starts with a comment naming the student, so no two units hold the same
code (a class's copies of one solution differ at least in a comment; identical code is graded once).

It measures, on `cpu-1` and `cpu-8`, with `--jobs` (default: the cores) at a time:

* first: `python -m labkit grade` on the class into an empty folder (the reference solutions
  graded first, then every unit: papermill, a kernel per run, the judge with hidden tests), with
  warm starts (the default: one server imports JAX once and forks every kernel) and, with
  `--starts warm,cold`, also with a fresh kernel per run (`--start cold`), each into its own folder;
* baselines: the same notebooks (students' and references) as plain python scripts, each cell
  run in turn (a cell that raises does not stop the script, as in a graded run; the check cells
  stay quiet, as in a kit run), `--jobs` at a time, each in its configuration's environment, then
  - "every call": the exercises called through the harness on every test's inputs, as the kit's
    run calls them (the heavier baseline);
  - "each exercise once": each exercise called once, on its first test's inputs (the lighter one,
    closer to what a student's own script would do);
* the floor: the same scripts, each exercise called once, in one warm interpreter that has imported JAX
  and the kit's harness once and forks a child per unit (`--jobs` at a time), the child choosing its
  device count before JAX's backends start. No grader that runs the student's code can be faster: the
  plain baselines import JAX again for every unit, which is not a grader's work;
* regrade: the same `grade` command again at once, on the unchanged class;
* with `--tpu v5e-8` (where libtpu is installed): the class graded again into a fresh folder with that
  compile-only TPU configuration added to cpu-1 and cpu-8, against the first warm run (target: at most
  2x: the TPU compiles must not double a class's grading). `--no-baselines` leaves the plain python out.

It prints seconds per graded unit, the ratio of the first run to each baseline and to the floor (target,
with warm starts: at most 1.5x the floor), and regrade / first (target: under 5%).

Usage: python benchmarks/bench_grade.py [--students 20] [--labs 3,4,5,6] [--jobs N] [--starts warm,cold] [--keep DIR]
       [--tpu v5e-8] [--no-baselines]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.course import catalog, configs
from labkit.grading.running import engine
from labkit.judge import judge

CONFIGS = ("cpu-1", "cpu-8")
KINDS = ("reference", "student", "buggy")


def labs_to_grade(wanted: str | None) -> list[catalog.Lab]:
    numbers = [int(n) for n in wanted.split(",")] if wanted else list(range(3, 7))
    have = {lab.number: lab for lab in catalog.labs()}
    return [
        have[n] for n in numbers if n in have and have[n].reference.exists() and have[n].public_tests.is_dir()
    ]


def notebook_of(lab: catalog.Lab, kind: str, student: str) -> dict:
    source = lab.student if kind == "student" else lab.reference
    nb = json.loads(source.read_text())
    if kind == "buggy":
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                cell["source"] = "".join(cell["source"]).replace("jax.devices()", "jax.devices()[:1]")
    # the same code with another comment, as a real class's copies differ: no unit is a duplicate of another
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    first["source"] = f"# handed in by {student}\n" + "".join(first["source"])
    return nb


def make_class(folder: Path, labs: list[catalog.Lab], students: int) -> dict[str, dict[int, str]]:
    kinds = {}
    for i in range(students):
        sid = f"s{i:03d}"
        for j, lab in enumerate(labs):
            kind = KINDS[(i + j) % len(KINDS)]
            path = folder / sid / f"{lab.name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(notebook_of(lab, kind, sid)))
            kinds.setdefault(sid, {})[lab.number] = kind
    return kinds


def script_of(notebook: Path, calls: list[dict], folder: Path) -> Path:
    """The notebook's code cells as one python script: each cell in turn, errors printed, then the harness."""
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    calls_path, results_path = folder / "calls.json", folder / "results.json"
    calls_path.write_text(json.dumps({"calls": calls}))
    lines = [
        "import traceback as _tb",
        "_cells = " + repr(["".join(c["source"]) for c in cells]),
        "for _i, _src in enumerate(_cells):",
        "    try:",
        "        exec(compile(_src, f'<cell {_i}>', 'exec'), globals())",
        "    except Exception:",
        "        _tb.print_exc()",
        "import labkit.judge.harness as _h",
        f"_h.run(globals(), {str(calls_path)!r}, {str(results_path)!r})",
    ]
    script = folder / "run.py"
    script.write_text("\n".join(lines) + "\n")
    return script


def once_each(calls: list[dict]) -> list[dict]:
    """The first call of each exercise: a student's own script calls each function once."""
    seen: dict[str, dict] = {}
    for call in calls:
        seen.setdefault(call["function"], call)
    return list(seen.values())


def baseline(
    units: list[tuple[Path, catalog.Lab, str]], jobs: int, folder: Path, once: bool = False
) -> float:
    calls = {lab.number: judge.collect_calls(lab.test_dirs(hidden=True)) for _, lab, _ in units}
    if once:
        calls = {n: once_each(c) for n, c in calls.items()}
    scripts = []
    for i, (notebook, lab, config) in enumerate(units):
        work = folder / f"u{i:04d}"
        work.mkdir(parents=True)
        scripts.append((script_of(notebook, calls[lab.number], work), config, work))

    def run(item):
        script, config, work = item
        env = configs.CONFIGS[config].environment() | {"LABKIT_RUN": config}
        subprocess.run(
            [sys.executable, str(script)],
            cwd=work,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(run, scripts))
    return time.perf_counter() - start


# The floor's one interpreter: JAX and the harness imported once, then a forked child per unit.
FLOOR_SERVER = r"""
import json, os, runpy, sys
import jax, labkit.judge.harness
units, jobs = json.load(open(sys.argv[1])), int(sys.argv[2])
running = set()
def reap():
    pid, _ = os.wait()
    running.discard(pid)
for script, env, work in units:
    while len(running) >= jobs:
        reap()
    pid = os.fork()
    if pid == 0:
        try:
            os.environ.update(env)
            jax.config.update("jax_platforms", env["JAX_PLATFORMS"])
            jax.config.update("jax_num_cpu_devices", int(env["JAX_NUM_CPU_DEVICES"]))
            os.chdir(work)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            runpy.run_path(script, run_name="__main__")
        finally:
            os._exit(0)
    running.add(pid)
while running:
    reap()
"""


def floor(units: list[tuple[Path, catalog.Lab, str]], jobs: int, folder: Path) -> float:
    """The same code as the lighter baseline, in one warm interpreter forked per unit (see FLOOR_SERVER)."""
    calls = {lab.number: once_each(judge.collect_calls(lab.test_dirs(hidden=True))) for _, lab, _ in units}
    plan = []
    for i, (notebook, lab, config) in enumerate(units):
        work = folder / f"u{i:04d}"
        work.mkdir(parents=True)
        env = configs.CONFIGS[config].env | {"LABKIT_RUN": config}
        plan.append((str(script_of(notebook, calls[lab.number], work)), env, str(work)))
    (folder / "plan.json").write_text(json.dumps(plan))
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", FLOOR_SERVER, str(folder / "plan.json"), str(jobs)],
        cwd=ROOT,
        env=configs.CONFIGS[CONFIGS[0]].environment(),
        check=True,
    )
    return time.perf_counter() - start


def timed_grade(
    subs: Path,
    out: Path,
    labs: list[catalog.Lab],
    jobs: int,
    timeout: float,
    start: str,
    graded_on: tuple[str, ...] = CONFIGS,
) -> float:
    cmd = [
        sys.executable,
        "-m",
        "labkit",
        "grade",
        "--submissions",
        str(subs),
        "--out",
        str(out),
        "--timeout",
        str(timeout),
        "--labs",
        ",".join(str(lab.number) for lab in labs),
        "--configs",
        ",".join(graded_on),
        "--jobs",
        str(jobs),
        "--start",
        start,
    ]
    start = time.perf_counter()
    done = subprocess.run(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"grading failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def load() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine skews every figure."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=20)
    ap.add_argument("--labs", default=None, help="comma-separated (default: those of 3, 4, 5, 6 that exist)")
    ap.add_argument("--jobs", type=int, default=engine.default_jobs())
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per notebook (default %(default)s)")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    ap.add_argument("--starts", default="warm", help="comma-separated: warm, cold (default %(default)s)")
    ap.add_argument(
        "--tpu", default=None, help="a compile-only TPU configuration to grade with too, e.g. v5e-8"
    )
    ap.add_argument(
        "--no-baselines", action="store_true", help="leave out the plain python baselines and the floor"
    )
    args = ap.parse_args()
    labs = labs_to_grade(args.labs)
    if not labs:
        raise SystemExit("no lab to grade among the ones asked for")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        subs = work / "submissions"
        starts = [s.strip() for s in args.starts.split(",") if s.strip()]
        kinds = make_class(subs, labs, args.students)
        units = [(lab.reference, lab, c) for lab in labs for c in CONFIGS]  # the sanity pass
        units += [
            (subs / s / f"{lab.name}.ipynb", lab, c) for s in sorted(kinds) for lab in labs for c in CONFIGS
        ]
        # Warm the file cache (python, jax, the kit) once; not counted.
        subprocess.run([sys.executable, "-c", "import jax, papermill, labkit.judge.judge"], check=True)
        n = len(units)
        print(f"{n} units; load average before: {load()}", flush=True)
        firsts, agains = {}, {}
        for start in starts:
            out = work / f"scoreboard-{start}"
            firsts[start] = timed_grade(subs, out, labs, args.jobs, args.timeout, start)
            print(
                f"  grade ({start} starts), first run: {firsts[start]:.1f} s; load average: {load()}",
                flush=True,
            )
            # At once: a change to the kit's grading code in between would, rightly, regrade everything.
            agains[start] = timed_grade(subs, out, labs, args.jobs, args.timeout, start)
            print(f"  regrade: {agains[start]:.1f} s; load average: {load()}", flush=True)
        with_tpu = None
        if args.tpu:
            with_tpu = timed_grade(
                subs, work / "scoreboard-tpu", labs, args.jobs, args.timeout, "warm", (*CONFIGS, args.tpu)
            )
            print(
                f"  grade with {args.tpu} too, first run: {with_tpu:.1f} s; load average: {load()}",
                flush=True,
            )
        plain = light = floor_s = None
        if not args.no_baselines:
            floor_s = floor(units, args.jobs, work / "floor")
            print(
                f"  the floor (one warm interpreter, forked): {floor_s:.1f} s; load average: {load()}",
                flush=True,
            )
            plain = baseline(units, args.jobs, work / "plain")
            print(f"  plain python, every call: {plain:.1f} s; load average: {load()}", flush=True)
            light = baseline(units, args.jobs, work / "plain-once", once=True)
            print(f"  plain python, each exercise once: {light:.1f} s; load average: {load()}", flush=True)
    print(
        f"class: {args.students} students x labs {', '.join(str(lab.number) for lab in labs)} x "
        f"{', '.join(CONFIGS)} = {n - len(labs) * len(CONFIGS)} units, plus {len(labs) * len(CONFIGS)} for the "
        f"reference solutions; {args.jobs} jobs on {os.cpu_count()} cores"
    )
    if plain is not None and light is not None and floor_s is not None:
        print(f"  plain python, every call:         {plain:8.1f} s  ({plain / n:.2f} s per unit)")
        print(f"  plain python, each exercise once: {light:8.1f} s  ({light / n:.2f} s per unit)")
        print(
            f"  the floor, forked from one warm interpreter: {floor_s:8.1f} s  ({floor_s / n:.2f} s per unit)"
        )
    for start, first in firsts.items():
        again = agains[start]
        target = "   (target: at most 1.5x)" if start == "warm" else ""
        print(f"  grade, {start} starts, first run: {first:8.1f} s  ({first / n:.2f} s per unit)")
        if plain is not None and light is not None and floor_s is not None:
            print(f"    / plain python, every call:         {first / plain:.2f}x")
            print(f"    / plain python, each exercise once: {first / light:.2f}x")
            print(f"    / the floor:                        {first / floor_s:.2f}x{target}")
        print(
            f"    regrade, unchanged: {again:8.1f} s  = {100 * again / first:.1f}% of the first run   (target: under 5%)"
        )
    if with_tpu is not None and "warm" in firsts:
        print(
            f"  grade with {args.tpu} too: {with_tpu:8.1f} s  = {with_tpu / firsts['warm']:.2f}x the warm first run "
            "without it   (target: at most 2x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
