"""Feedback without leaving Jupyter: an exercise's public tests on one device and on eight.

A lab notebook starts with ``check = Checker(3)`` and, after each exercise, has a cell
``check("shard_map_double")``. The check replays the cells this kernel has run, in a fresh Python
process per device configuration (`cpu-1` and `cpu-8`, with each configuration's environment, as
`make lab-N` sets it), calls the function there on the public tests' inputs, and judges what came
back here, in one table: the student sees without leaving Jupyter what one device hides.
It is a convenience, not a verdict: `make lab-N` (and grading) judge in another process, in a
sandbox. Inside those runs the check cells only say so, to keep runs fast.

Each replay goes through the kit's sandbox (`labkit.run.sandbox.launch`), as a `make lab-N` run does:
a scratch folder of its own (its only writable folder, removed afterwards), no network, the run's
default limits (memory, processes, output). What it reads besides the kit's Python environment is
the notebook's own folder (the kernel's working folder), read-only, and the replay starts there, so
that a cell that reads a data file next to the notebook, or imports a module from there, does so in
the replay too; a cell that writes there raises in the replay and is skipped. When that folder is, or holds, the kit's own
repository (its reference notebooks and hidden tests), the replay sees only its scratch folder and
starts there. Where no sandbox can be made, the replay runs with the limits only (nothing else is
hidden from it), and check() says so in one line.

Importing this module also gives an interactive kernel eight simulated CPU devices (see
`default_devices`), so that the worked examples show what the course is about. What a kit run's
configuration sets always wins: it sets the device count in the environment before JAX starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from labkit import envnames, statuses
from labkit.course import catalog
from labkit.run import allowance, modes, sandbox

# Set in the environment of every run the kit makes; the check cells then stay quiet.
RUN_MARKER = envnames.RUN
# as `make lab-N`'s table marks them (labkit/student/report.py)
MARKS = statuses.TEST_MARKS
# How many CPU devices an interactive kernel gets when nothing else says.
INTERACTIVE_DEVICES = 8
CHECK_CONFIGS = ("cpu-1", "cpu-8")


def default_devices(count: int = INTERACTIVE_DEVICES, environ=None, kernel: bool | None = None) -> str:
    """Give a Jupyter kernel `count` CPU devices, unless something already decided; say what happened.

    Nothing changes outside a Jupyter kernel (a script or a test that imports this module), when the
    environment names a device count (`JAX_NUM_CPU_DEVICES`, as every kit run and any student's own
    setting does) or when JAX's backends have already started (the count is fixed then: restart the
    kernel).
    """
    environ = os.environ if environ is None else environ
    if environ.get("JAX_NUM_CPU_DEVICES") or environ.get(RUN_MARKER):
        return "kept: the environment sets the device count"
    if not (("ipykernel" in sys.modules) if kernel is None else kernel):
        return "kept: not a Jupyter kernel"
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", int(count))
    except RuntimeError:  # JAX refuses once its backends have started
        return "kept: JAX had already started (restart the kernel for eight CPU devices)"
    environ["JAX_NUM_CPU_DEVICES"] = str(count)  # and processes this kernel starts
    return f"set: {count} CPU devices"


def _tests_of(lab: catalog.Lab, exercise: str) -> list:
    found = []
    for path in sorted(lab.public_tests.glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"_labkit_check_{lab.number}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, fn in vars(module).items():
            calls = getattr(fn, "__labkit_calls__", None)
            if name.startswith("test_") and calls and any(c.function == exercise for c in calls.values()):
                found.append(fn)
    return found


def _without_checks(source: str) -> str:
    """A cell less its top-level `check(...)` lines: replaying them would check again, in every replay."""
    return "\n".join(line for line in source.splitlines() if not line.startswith("check("))


def replay_sources(history: list[str]) -> list[str]:
    """The cells to run again in a fresh process: what this kernel ran, in order, less the check calls."""
    cells = [_without_checks(s or "") for s in history]
    return [c for c in cells if c.strip()]


# The program of one replay: run the cells in an IPython shell of its own (magics work), then call
# the exercise on each input and write the plain data back. Cells that raise are skipped.
_REPLAY = r"""
import contextlib, io, json, os, sys
spec = json.load(open(sys.argv[1]))
os.chdir(spec["start"])
sys.path.append(spec["start"])  # a module next to the notebook imports, as in the kernel; it never shadows the kit's
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for source in spec["cells"]:
        shell.run_cell(source, silent=True)
from labkit.judge import harness
results = {c["id"]: harness.call_one(shell.user_ns, c) for c in spec["calls"]}
json.dump({"environment": harness.environment(), "results": results}, open(sys.argv[2], "w"))
"""


def replay_folder(folder: str | os.PathLike | None = None) -> Path | None:
    """The folder a replay may read and starts in: the notebook's own (default: this process's working
    folder), or None when it is, or holds, the kit's repository (a replay then sees only its scratch)."""
    here = Path(folder if folder is not None else os.getcwd()).resolve()
    kit = catalog.ROOT.resolve()
    if here == Path("/") or kit == here or kit.is_relative_to(here):
        return None
    return here


def replay_limits(warn=None) -> allowance.Limits:
    """The limits of a replay: `make lab-N`'s (`auto`); where no sandbox can be made, limits only, said in one line."""
    program, reason = modes.bubblewrap()
    if program:
        return allowance.Limits(isolation=modes.AUTO)
    why = next((line.strip() for line in reason.splitlines() if line.strip()), "no bwrap works here")
    print(
        f"labkit: warning: check() replays with resource limits only, not in a sandbox ({why}); "
        "`make doctor` says why",
        file=warn or sys.stderr,
        flush=True,
    )
    return allowance.Limits(isolation=modes.LIMITS_ONLY)


def run_elsewhere(
    config_name: str,
    cells: list[str],
    calls: list[dict],
    timeout: float = 300,
    *,
    limits: allowance.Limits | None = None,
    folder: str | os.PathLike | None = None,
) -> dict:
    """Replay `cells` in a fresh, sandboxed process with the configuration's environment; the harness's plain data.

    `folder` is the notebook's folder (default: this process's working folder; see `replay_folder`).
    The answer's `isolation` says whether the replay ran in a sandbox ("bubblewrap") or not ("limits-only").
    """
    from labkit.course import configs

    config = configs.CONFIGS[config_name]
    env = config.environment() | {envnames.CHECK_REPLAY: config.name}
    limits = limits or allowance.Limits(isolation=modes.AUTO)
    start = replay_folder(folder)
    scratch = Path(tempfile.mkdtemp(prefix="labkit-check-"))
    try:
        spec, out = scratch / "spec.json", scratch / "out.json"
        spec.write_text(json.dumps({"cells": cells, "calls": calls, "start": str(start or scratch)}))
        with open(scratch / "replay.log", "wb") as log:
            proc = sandbox.launch(
                [sys.executable, "-c", _REPLAY, str(spec), str(out)],
                sandbox.RunContext(
                    scratch, env, log, limits, reach=sandbox.Reach(read=(start,) if start else ())
                ),
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
                return {
                    "status": "timeout",
                    "message": f"did not finish within {timeout:g} s",
                    "isolation": proc.isolation,
                }
        if proc.returncode != 0 or not out.exists():
            printed = (scratch / "replay.log").read_text(errors="replace")
            from labkit.run.runreport import whole_message

            last = printed.strip().splitlines()[-1:] or ["no output"]
            return {"status": "error", "message": whole_message(last[0]), "isolation": proc.isolation}
        return {"status": "ok", "isolation": proc.isolation, **json.loads(out.read_text())}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _judge(
    tests: list, label: str, config, env: dict, results: dict, measured: list | None = None
) -> list[tuple[str, str, str]]:
    """Each test on one replay's results: (test, status, message); what its budget checks measured into `measured`."""
    from labkit.checks import LabRun
    from labkit.judge.judge import classify
    from labkit.run.execute import RunRecord

    record = RunRecord(label, "ok", environment=env, results=results)
    run = LabRun(label, config, record)
    out = []
    for test in tests:
        try:
            test(run)
            status, message = "passed", ""
        except BaseException as e:  # noqa: BLE001 - report whatever the check raised
            status, message = classify(type("Info", (), {"value": e})())
        out.append((test.__name__, status, message))
    if measured is not None:
        measured.extend(run.budgets)
    return out


class Checked:
    """What `check(...)` returns: whether every public test passed or was skipped (`bool(check("f"))`).

    Jupyter shows nothing for it: the table printed above is the answer, and a bare `True` echoed after
    it would read as one more verdict. Printed, it is `True` or `False`."""

    def __init__(self, passed: bool):
        self.passed = bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __eq__(self, other) -> bool:
        return self.passed == (other.passed if isinstance(other, Checked) else other)

    def __hash__(self) -> int:
        return hash(self.passed)

    def __repr__(self) -> str:
        return repr(self.passed)

    def _ipython_display_(self) -> None:
        """Displayed by Jupyter as nothing (IPython asks this before any other form)."""


class Checker:
    def __init__(self, lab: int):
        self.lab = catalog.Lab(int(lab))

    def __call__(self, exercise: str, namespace: dict | None = None, configs=CHECK_CONFIGS):
        """Run `exercise`'s public tests on each of `configs` (None: in this kernel, on its devices)."""
        if os.environ.get(RUN_MARKER) or os.environ.get(envnames.CHECK_REPLAY):
            print(f"(`make {self.lab.name}` checks {exercise} on every device configuration)")
            return None
        from labkit.course.configs import DeviceConfig
        from labkit.judge import harness

        namespace = namespace if namespace is not None else sys._getframe(1).f_globals
        from labkit.student import loop, stamp

        stamp.write(loop.BUILD / self.lab.name)  # `make lab-N` notes a notebook saved before this check
        tests = _tests_of(self.lab, exercise)
        if not tests:
            print(f"no public tests of {exercise!r} in {self.lab.public_tests}")
            return None
        from labkit.checks import planned

        # a call several tests make runs once, as `judge` runs it
        calls = planned(c for test in tests for c in test.__labkit_calls__.values())
        columns, results_by, measured = {}, {}, []
        if configs is None:
            env = harness.environment()
            results = {i: harness.call_one(namespace, c) for i, c in calls.items()}
            devices = int(env.get("device_count") or 1)
            config = DeviceConfig("this kernel", "", env.get("backend", "cpu"), devices=devices)
            columns["this kernel"] = _judge(tests, "this kernel", config, env, results, measured)
            results_by["this kernel"] = results
        else:
            from labkit.course import configs as known

            cells = replay_sources(list(namespace.get("In") or namespace.get("_ih") or []))
            limits = replay_limits()
            for name in configs:
                done = run_elsewhere(name, cells, list(calls.values()), limits=limits)
                if done["status"] != "ok":
                    columns[name] = [(t.__name__, "error", done["message"]) for t in tests]
                    continue
                found = done["environment"], done["results"]
                columns[name] = _judge(tests, name, known.CONFIGS[name], *found, measured)
                results_by[name] = done["results"]
        passed = self._report(exercise, tests, columns)
        self._show_cards(list(calls.values()), results_by, measured)
        return Checked(passed)

    def _show_cards(self, calls: list, results_by: dict, measured: list | None = None) -> None:
        """The cost cards of the runs: in a running Jupyter kernel a table of bars, else the text card (each
        headline with the budget nearest its limit of those `measured`); one line saying why where there is none."""
        from labkit import cost
        from labkit.student import report

        found = cost.cards(calls, results_by)
        ranked = self.lab.ranked_call
        reference = cost.read_reference(self.lab.public_tests)
        if found and _in_a_running_kernel():  # a small table with bars, not wrapped text
            from IPython.display import HTML, display

            display(HTML(cost.html(found, reference, ranked, measured)))
        else:
            for line in cost.text(found, reference, ranked, measured):
                print(line)
        if not found and (why := report.why_no_card(calls, results_by)):
            print(why)

    def _report(self, exercise: str, tests: list, columns: dict) -> bool:
        from labkit.student import report

        names = list(columns)
        width = max(len(t.__name__) for t in tests) - len("test_") + 2
        print(f"{exercise}: public tests")
        print(f"  {'':<{width}}" + "  ".join(f"{n:^7}" for n in names))
        notes: dict[
            tuple[str, str], list[tuple[str, str]]
        ] = {}  # (status, message) -> [(test, configuration)]
        passed = True
        for i, test in enumerate(tests):
            label = test.__name__.removeprefix("test_").replace("_", " ")
            marks = []
            for n in names:
                _, status, message = columns[n][i]
                passed &= status in ("passed", "skipped")
                marks.append(f"{MARKS.get(status, '?'):^7}")
                if message:
                    notes.setdefault((status, report.without_run(message, n)), []).append((label, n))
            print(f"  {label:<{width}}" + "  ".join(marks))
        for (_, message), where in notes.items():
            labels = list(dict.fromkeys(label for label, _ in where))
            runs = list(dict.fromkeys(n for _, n in where))
            which = (
                labels[0]
                if len(labels) == 1
                else "every test above"
                if len(labels) == len(tests)
                else f"{labels[0]} and {len(labels) - 1} more above"
            )
            print(f"  • {which} [{', '.join(runs)}]: {report.with_runs(message, runs)}")
        print(
            f"(`make {self.lab.name}` runs them in the kit's sandbox on every configuration, and grading adds "
            "hidden tests)"
        )
        return passed


def start_log() -> Path:
    """Where a Jupyter kernel's JAX start-up messages go (`quiet_start`): the kit's build folder."""
    from labkit.student import loop

    return loop.BUILD / "jupyter-start.log"


def _in_a_running_kernel() -> bool:
    """Whether this is a Jupyter kernel that runs cells now: not a process that only imported ipykernel (the
    kit's warm server imports this module in advance, and a JAX backend started there would be every
    kernel it forks)."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    return type(get_ipython()).__name__ == "ZMQInteractiveShell"


def quiet_start(environ=None, kernel: bool | None = None, log: Path | None = None) -> str:
    """Start JAX's backends now, in a Jupyter kernel where libtpu is installed, with the process's standard
    error (file descriptor 2, where libtpu and absl write from C++) sent to `log`; say what happened.

    With libtpu installed, JAX's first look for devices starts libtpu, which writes its start-up errors to
    standard error on a machine without a TPU ("Failed to find host bounds for accelerator type",
    "TPU_WORKER_HOSTNAMES", a source-location trace): in Jupyter they would show under the first cell, red,
    as if the student's code had failed. Nothing changes in a kit run (its kernel's standard error is the
    run's log already), outside a Jupyter kernel, without libtpu, or when JAX's backends have started."""
    environ = os.environ if environ is None else environ
    if environ.get(RUN_MARKER) or environ.get(envnames.CHECK_REPLAY):
        return "kept: a kit run logs its kernel's standard error"
    if not (_in_a_running_kernel() if kernel is None else kernel):
        return "kept: not a running Jupyter kernel"
    if importlib.util.find_spec("libtpu") is None:
        return "kept: no libtpu"
    import jax  # a backend started already starts again as nothing: its messages were printed then

    log = Path(log) if log is not None else start_log()
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        sink = open(log, "wb")  # noqa: SIM115 - closed below, once standard error is back
    except OSError:
        sink = open(os.devnull, "wb")  # noqa: SIM115
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(sink.fileno(), 2)
        try:
            jax.devices()
        except Exception:  # noqa: BLE001 - the student's own first look at the devices says it again, in full
            return "kept: JAX could not start (the first cell that asks for devices says why)"
        finally:
            os.dup2(saved, 2)
    finally:
        os.close(saved)
        sink.close()
    return f"started: libtpu's start-up messages are in {log}"


DEVICES = default_devices()
if DEVICES.startswith("kept: JAX"):
    print(f"labkit: {DEVICES.removeprefix('kept: ')}", file=sys.stderr)
quiet_start()
