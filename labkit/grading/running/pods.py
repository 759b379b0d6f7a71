"""Grading with one pod per unit: the pod is the sandbox, and a judge that runs no student code reads what it wrote.

Where bubblewrap cannot make the kit's sandbox (GKE Sandbox's gVisor: tests/kit/test_gvisor.py), the
sandbox is the pod itself, one per graded unit (a student's lab on one configuration): gVisor, no
network, a read-only root, its inputs read-only, one output folder of its own, the configuration's
CPU and memory as its limits and a deadline. Three steps, each a command of `python -m labkit pods`:

* `plan` (trusted: it reads the hidden tests): one input folder per unit, `PLAN/units/<i>/`, with the
  notebook, the calls as the student's process may see them (`callplan.for_the_student`: a call whose
  program the kit runs itself gets shapes only) and which unit it is; and `PLAN/units.json`, the list.
  The reference solutions are units too (student `reference`, marked `"kit": true`), as in `grade`: the kit's
  own units are a namespace of their own, and a student folder named `reference` is a unit of that student.
* `run` (in the unit's pod, named `--isolation pod`): the notebook runs as a local run does, papermill
  and the kernel in the same container, without bubblewrap, and everything the run leaves goes to
  the output folder: `run/` (the harness's results, the executed notebook, the log) and `pod-run.json`
  (how the kernel ended). Nothing in that folder is trusted: the student's code could have written
  all of it, the key that signs the results included, as it runs in the same container.
* `grade --runs-from RUNS --plan PLAN` (the judge, in a pod that runs no notebook): each unit's
  output is read only through `labkit.run.scratch` (a regular file, never through a link, size-capped,
  never blocking), as plain JSON; every call whose program a test reads is run again by the kit's
  verifier (`labkit.judge.verify`), and its value and compiled facts are taken from that run; the judge's
  tests (`labkit.judge.judge`) and the scoreboard are the same as a local run's. Each row's `isolation`
  says `pod`. What still rests on the pod's word is what rests on the run's word in docs/sandbox.md
  (calls no test examines, host data), plus how the kernel ended (a pod can only make its own row worse).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

from labkit.course import configs
from labkit.exitcodes import ExitCode
from labkit.grading.intake import collect
from labkit.judge import callplan, records, verify
from labkit.run import allowance, execute, kernel, modes, runreport, scratch
from labkit.run.allowance import Limits
from labkit.statuses import Run

UNITS = "units"
UNIT_FILE = "unit.json"
NOTEBOOK = "notebook.ipynb"
CALLS = "calls.json"
RUN = "run"  # in a pod's output folder: the run's kit folder (its scratch folder inside)
ENDED = "pod-run.json"  # in a pod's output folder: how the kernel ended, as the pod's kit saw it
NOTEBOOK_MAX_BYTES = (
    records.MAX_BYTES
)  # an executed notebook larger than this is not read for its cell errors


class PodError(RuntimeError):
    """The plan or a unit's inputs are not what the kit made; the message says what."""


# ----------------------------------------------------------------------------------------
# plan: the trusted step that writes each unit's inputs.
# ----------------------------------------------------------------------------------------


def plan(
    submissions: Path, out: Path, *, labs: str | None = None, config_names: str | None = None
) -> list[dict]:
    """Write one input folder per unit (reference solutions first) under `out`; the units, as listed in units.json."""
    from labkit.judge import judge

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise PodError(f"{out} is not empty: give every plan a new folder")
    chosen_labs, chosen = collect.choose_labs(labs), collect.choose_configs(config_names)
    several = [c.name for c in chosen if c.processes > 1]
    if several:
        raise PodError(f"one pod per unit runs one-process configurations only, not {', '.join(several)}")
    subs = collect.discover(Path(submissions), [lab.number for lab in chosen_labs])
    units = []
    for lab in chosen_labs:
        calls = callplan.mark(judge.collect_calls(lab.test_dirs(hidden=True)))
        handed = [(collect.REFERENCE, lab.reference, True)] + [
            (s, found[lab.number], False) for s, found in sorted(subs.students.items()) if lab.number in found
        ]
        for student, notebook, kit in handed:
            for config in chosen:
                index = len(units)
                folder = out / UNITS / str(index)
                folder.mkdir(parents=True)
                shutil.copyfile(notebook, folder / NOTEBOOK, follow_symlinks=False)
                made = callplan.for_configuration(calls, bool(config.compile_for))  # the kit's own list
                (folder / CALLS).write_text(json.dumps({"calls": callplan.for_the_student(made)}))
                unit = {
                    "index": index,
                    "student": student,
                    "lab": lab.number,
                    "config": config.name,
                    "kit": kit,
                }
                (folder / UNIT_FILE).write_text(json.dumps(unit))
                units.append(unit)
    (out / "units.json").write_text(json.dumps({"units": units}, indent=1))
    return units


def units_of(plan_folder: Path) -> list[dict]:
    return json.loads((Path(plan_folder) / "units.json").read_text())["units"]


@functools.lru_cache(maxsize=4)
def _indexes(plan_folder: Path) -> dict[tuple[bool, str, int, str], int | None]:
    """The plan's unit indexes by (the kit's own?, student, lab, configuration), read once: a plan folder is
    written once. The kit's own units (the references) are a namespace of their own, so that a student
    named `reference` is never given the reference's pod; a key listed twice has no unit (None)."""
    found: dict[tuple[bool, str, int, str], int | None] = {}
    for u in units_of(plan_folder):
        key = (u.get("kit") is True, u["student"], u["lab"], u["config"])
        found[key] = None if key in found else u["index"]
    return found


def output_of(
    runs: Path, plan_folder: Path, student: str, lab: int, config: str, *, kit: bool = False
) -> Path | None:
    """The output folder of the pod that ran `student`'s lab on `config` (`kit`: the kit's own unit, a
    reference solution's), or None when the plan has no such unit."""
    index = _indexes(Path(plan_folder)).get((kit, student, lab, config))
    return None if index is None else Path(runs) / str(index)


# ----------------------------------------------------------------------------------------
# run: in the unit's pod.
# ----------------------------------------------------------------------------------------


def run_unit(
    unit_folder: Path, out: Path, *, timeout: float = execute.DEFAULT_TIMEOUT, limits: Limits | None = None
) -> int:
    """Run the unit in `unit_folder` (its pod's read-only inputs) with its output in `out`; 0 once it ran.

    Only with `--isolation pod` (a pod of the kit's design, `modes.pod_problem`): anything else is
    refused before the notebook starts, so this never runs a notebook without a sandbox by accident."""
    limits = limits or allowance.DEFAULT_LIMITS
    if limits.isolation != modes.POD:
        raise modes.SandboxUnavailable(
            "`pods run` runs a notebook with the pod as its only sandbox, so it asks "
            "for it by name: --isolation pod"
        )
    modes.isolation(modes.POD)  # raises, with the reason, where this is no pod of the kit's design
    unit = json.loads((Path(unit_folder) / UNIT_FILE).read_text())
    config = configs.by_name(unit["config"])
    if config is None or config.processes > 1:
        raise PodError(f"unit {unit.get('index')}: {unit['config']!r} is not a one-process configuration")
    limits = config.run_limits(limits)  # what a run on it needs to start, at the least, as a local run's
    timeout = config.run_timeout(timeout)  # and to finish
    calls = json.loads((Path(unit_folder) / CALLS).read_text())["calls"]
    ended = {"status": "ok", "isolation": modes.POD}
    available, reason = config.availability()
    try:
        nb = execute.read_notebook(Path(unit_folder) / NOTEBOOK)
    except execute.BadNotebook as e:
        ended = {"status": "error", "message": str(e).replace(str(unit_folder), "the unit's inputs")}
    else:
        if not available:
            ended = {"status": "skipped", "message": reason}
    if ended["status"] != "ok":
        (Path(out) / ENDED).write_text(json.dumps(ended))
        return 0
    work = Path(out).absolute() / RUN
    execute.fresh_workdir(work)
    input_path = execute.prepare(nb, work, calls)
    env = execute.environment_of(config)
    ran = kernel.papermill_run(
        input_path, work / "executed.ipynb", scratch.RunFolders(work), env, limits, execute.new_key(), timeout
    )
    ended |= {
        "timed_out": ran.timed_out,
        "died": ran.died,
        "disk": ran.disk,
        "failure": ran.failure,
        "returncode": ran.returncode,
        "seconds": round(ran.seconds, 2),
    }
    (Path(out) / ENDED).write_text(json.dumps(ended))
    return 0


# ----------------------------------------------------------------------------------------
# The judge's side: a unit's output read as untrusted data.
# ----------------------------------------------------------------------------------------


def _text(value, limit: int = 300) -> str:
    return str(value)[:limit] if isinstance(value, (str, int, float)) else ""


def record_of(
    output: Path | None, config, calls: list[dict], kit_folder: Path, timeout: float, limits: Limits
) -> execute.RunRecord:
    """The run's record from a pod's output folder, each value of the pod's taken as untrusted data.

    `kit_folder` is the judge's own folder for this unit (the verifier works there, never in the pod's
    output). The required calls are run again by the kit's verifier, with `limits` (the judge's own
    isolation), so their values and facts are the kit's, whatever the pod wrote."""
    limits = config.run_limits(limits)  # the verifier's too: what a run on the configuration needs to start
    timeout = config.run_timeout(timeout)
    record = execute.RunRecord(
        config.name,
        "error",
        workdir=str(kit_folder),
        isolation=modes.POD,
        limits=limits.to_json(),
        start="cold",
    )
    if output is None:
        record.message = (
            "the plan has no pod for this unit: plan and grade the same class, labs and configurations"
        )
        return record
    ended = _ended_of(Path(output))
    if isinstance(ended, str):
        record.message = ended
        return record
    status = ended.get("status")
    if status in ("error", "skipped"):
        record.status, record.message = status, _text(ended.get("message"))
        return record
    record.seconds = ended.get("seconds", 0.0)
    run = Path(output) / RUN
    try:
        executed = records.parse(scratch.read(run, "executed.ipynb", NOTEBOOK_MAX_BYTES))
        record.cell_errors = runreport.cell_errors_of(executed)[0]
    except (OSError, ValueError):
        record.cell_errors = []
    if ended.get("disk"):
        record.message = f"{_text(ended['disk'])}: nothing from this run is graded"
        return record
    if ended.get("timed_out"):
        record.status, record.message = "timeout", f"the notebook did not finish within {timeout:g} s"
        return record
    read = _results_of(run)
    if isinstance(read, str):
        record.message = read
        return record
    record.environment, record.results = read
    record.status = Run.OK
    env = execute.environment_of(config)
    Path(kit_folder).mkdir(parents=True, exist_ok=True)
    verify.verify(record, calls, Path(kit_folder), env, limits, timeout)
    record.judged_by = verify.judged_by(record.results)
    return record


def _ended_of(output: Path) -> dict | str:
    """How the pod's run ended, read against its schema (`records.ended`, bounded), or why nothing is graded."""
    try:
        return records.ended(scratch.read(output, ENDED, 1 << 16))
    except FileNotFoundError:
        return (
            "the unit's pod left no record of its run (it did not start, or was stopped at its "
            "deadline or for its memory): nothing from this run is graded"
        )
    except (OSError, ValueError, TypeError) as e:
        return (
            f"the unit's pod left a record the kit does not read ({_text(str(e))}): nothing from it is graded"
        )


def _results_of(run: Path) -> tuple[dict, dict] | str:
    """The environment and results the pod's harness wrote, or why they are not read: a file of another kind
    is never opened, and no key checks them (the pod's kit held it beside the student's code, so a signature
    there proves nothing)."""
    results = scratch.RunFolders(run).scratch
    found = (
        scratch.kind(results, "results.json") if scratch.kind(run, scratch.SCRATCH) == "folder" else "missing"
    )
    if found != "file":
        return (
            "the notebook stopped before its functions could be called"
            if found == "missing"
            else f"the run's results file was replaced by a {execute.NOT_A_FILE.get(found, 'special file')}, "
            "which the kit never opens: nothing from this run is graded"
        )
    try:
        return execute.read_results(results / "results.json", None)
    except scratch.Refused as e:
        return f"the run's results could not be read: {e}"
    except records.Malformed as e:
        return f"the run's results are not what the kit's harness writes ({e}): nothing from it is graded"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"the run's results could not be read ({type(e).__name__})"


# ----------------------------------------------------------------------------------------
# python -m labkit pods ...
# ----------------------------------------------------------------------------------------


def add_parser(sub) -> None:
    pods = sub.add_parser(
        "pods", help="grade with one pod per unit, the pod as the sandbox (see docs/grading.md)"
    )
    steps = pods.add_subparsers(dest="step", required=True)
    p = steps.add_parser("plan", help="the trusted first step: one input folder per unit, PLAN/units/<i>/")
    p.add_argument("--submissions", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--labs", default=None)
    p.add_argument("--configs", default=None)
    p.set_defaults(func=_plan)
    r = steps.add_parser("run", help="in the unit's pod: run its notebook, everything it leaves into OUT")
    r.add_argument("unit", type=Path, help="the unit's input folder (PLAN/units/<i>, read-only)")
    r.add_argument("out", type=Path, help="the pod's own output folder")
    r.add_argument("--timeout", type=float, default=execute.DEFAULT_TIMEOUT)
    allowance.add_arguments(r)
    modes.add_isolation_argument(r, modes.SANDBOX)
    r.set_defaults(func=_run)


def _plan(args) -> int:
    """`pods plan`; a refused input (PodError, GradeError) ends it in `cli.main`."""
    units = plan(args.submissions, args.out, labs=args.labs, config_names=args.configs)
    print(f"{len(units)} units planned in {args.out}/units (one pod each: indexes 0 to {len(units) - 1})")
    return ExitCode.OK


def _run(args) -> int:
    """`pods run`; no pod to be the sandbox (SandboxUnavailable) or a unit the plan did not make (PodError)
    ends it in `cli.main`."""
    return run_unit(args.unit, args.out, timeout=args.timeout, limits=allowance.limits_from_args(args))
