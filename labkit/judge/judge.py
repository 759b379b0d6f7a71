"""The judge: one pytest session that runs a lab's tests on plain data from notebook runs.

`judge()` collects the lab's tests, gathers the calls they declare, runs the notebooks
(each run in processes of its own, several at a time), then runs every test once per
run. It returns one `Outcome` per test and run. Pass or fail is decided here, in the
trusted process, never in the student's.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from labkit.checks import SINGLE_PROCESS_MARK, CallFailed, LabRun, Mismatch, NotDone, RunProblem, planned
from labkit.course.configs import DeviceConfig
from labkit.judge import callplan
from labkit.judge.callplan import CallSpec
from labkit.run import execute
from labkit.statuses import Run, Verdict

STATUSES = tuple(Verdict)


@dataclass
class RunSpec:
    """One notebook to run on one configuration, or an already finished run (`record`)."""

    label: str
    notebook: Path
    config: DeviceConfig
    workdir: Path
    record: execute.RunRecord | None = None
    keep_scratch: bool = False  # keep the run's scratch folder once its results are read (to look at it)


@dataclass
class Outcome:
    test: str
    exercise: str
    run: str
    config: str
    status: str  # a statuses.Verdict
    message: str = ""
    hidden: bool = False
    file: str = ""
    points: float = 1  # what the test is worth: @check(points=...)
    # what its budget checks measured (`labkit.judge.budgets`): the card's headline names the nearest its limit
    budgets: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        found = asdict(self)
        if not self.budgets:  # as before budgets were noted: a test without one reads the same
            del found["budgets"]
        return found


@dataclass
class Judgement:
    outcomes: list[Outcome] = field(default_factory=list)
    records: dict[str, execute.RunRecord] = field(default_factory=dict)
    calls: list[CallSpec] = field(default_factory=list)  # the calls the runs made, as the harness got them


class KitError(RuntimeError):
    """The kit itself could not judge (a lab's tests do not import, say): not the student's fault."""


def classify(excinfo) -> tuple[Verdict, str]:
    exc = excinfo.value if excinfo else None
    if isinstance(
        exc, pytest.skip.Exception
    ):  # a test that does not run here (a production size off the TPU)
        return Verdict.SKIPPED, str(exc.msg)
    if isinstance(exc, Mismatch):
        return Verdict.FAILED, str(exc)
    if isinstance(exc, NotDone):
        return Verdict.TODO, str(exc)
    if isinstance(exc, CallFailed):
        return Verdict.FAILED, str(exc)
    if isinstance(exc, RunProblem):
        return Verdict(exc.status) if exc.status in STATUSES else Verdict.ERROR, str(exc)
    if isinstance(exc, AssertionError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "assertion failed"
        return Verdict.FAILED, first
    if exc is None:
        return Verdict.FAILED, "failed"
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return (
        Verdict.FAILED,
        f"the result could not be checked ({type(exc).__name__}{': ' + first if first else ''})",
    )


class _Plugin:
    def __init__(
        self,
        runs: list[RunSpec],
        hidden_dirs: list[Path],
        jobs: int,
        timeout: float,
        limits=None,
        warm=None,
        cache=None,
    ):
        self.runs = {r.label: r for r in runs}
        self.hidden_dirs = [d.resolve() for d in hidden_dirs]
        self.jobs = jobs
        self.timeout = timeout
        self.limits = limits  # allowance.Limits for every run; None: the defaults
        self.warm = (
            warm  # a started warm.Server that forks the runs' kernels, or None: every kernel starts cold
        )
        self.cache = cache  # a jaxcache.CompileCache for the runs, or None
        self.judgement = Judgement()
        self.collect_errors: list[str] = []

    # -- collection: parametrise every lab test over the runs, then run the notebooks ----
    def pytest_generate_tests(self, metafunc):
        if "lab_run" in metafunc.fixturenames:
            metafunc.parametrize("lab_run", list(self.runs), indirect=True)

    def pytest_configure(self, config):
        config.addinivalue_line(
            "markers", f"{SINGLE_PROCESS_MARK}(reason): meaningless across several JAX processes"
        )
        # a verdict's words come from the exception itself (`classify`), not from pytest's report, whose long
        # form (each frame's source, parsed) was a fifth of the judge's time in a class's grading
        config.option.tbstyle = "line"

    @pytest.fixture
    def lab_run(self, request) -> LabRun:
        spec = self.runs[request.param]
        record = self.judgement.records[spec.label]
        if record.status == Run.SKIPPED:
            pytest.skip(record.message)
        single = request.node.get_closest_marker(SINGLE_PROCESS_MARK)
        if single and spec.config.processes > 1:
            pytest.skip(_single_process_message(single))
        return LabRun(spec.label, spec.config, record)

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(f"{report.nodeid}: {str(report.longrepr).strip().splitlines()[-1]}")

    def pytest_collection_finish(self, session):
        made = (
            c
            for item in session.items
            for c in getattr(getattr(item, "function", None), "__labkit_calls__", {}).values()
        )
        self.calls = callplan.mark(list(planned(made).values()))  # a call several tests make runs once
        self.single_process = single_process_reason(session.items)

        def run(spec: RunSpec) -> execute.RunRecord:
            if self.single_process and spec.config.processes > 1:
                return execute.RunRecord(
                    spec.config.name, Run.SKIPPED, self.single_process, workdir=str(spec.workdir)
                )
            if spec.record is not None:
                return spec.record
            return execute.run_notebook(
                spec.notebook,
                spec.config,
                self.calls,
                spec.workdir,
                timeout=self.timeout,
                limits=self.limits,
                warm=self.warm,
                cache=self.cache,
                keep_scratch=spec.keep_scratch,
            )

        with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
            for spec, record in zip(self.runs.values(), pool.map(run, self.runs.values())):
                self.judgement.records[spec.label] = record

    # -- reporting: one Outcome per test and run -------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        result = yield
        report = result.get_result()
        if not hasattr(item, "callspec") or "lab_run" not in item.callspec.params:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.passed:
                status, message = Verdict.PASSED, ""
            elif report.skipped:
                status = Verdict.SKIPPED
                message = (
                    report.longrepr[2].removeprefix("Skipped: ") if isinstance(report.longrepr, tuple) else ""
                )
            else:
                status, message = classify(call.excinfo)
            label = item.callspec.params["lab_run"]
            path = Path(item.path).resolve()
            self.judgement.outcomes.append(
                Outcome(
                    test=item.originalname,
                    exercise=getattr(item.function, "__labkit_exercise__", ""),
                    run=label,
                    config=self.runs[label].config.name,
                    status=status,
                    message=message,
                    hidden=any(path.is_relative_to(d) for d in self.hidden_dirs),
                    file=path.name,
                    points=getattr(item.function, "__labkit_points__", 1),
                    budgets=list(getattr(item.funcargs.get("lab_run"), "budgets", [])),
                )
            )


def _single_process_message(mark) -> str:
    reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
    return f"runs in one JAX process only: {reason}" if reason else "runs in one JAX process only"


def single_process_reason(items) -> str | None:
    """Why a lab is not run on multi-process configurations: set when every one of its tests says so."""
    marks = [
        item.get_closest_marker(SINGLE_PROCESS_MARK)
        for item in items
        if "lab_run" in getattr(item, "fixturenames", ())
    ]
    if marks and all(marks):
        return _single_process_message(marks[0])
    return None


def _args(test_dirs: list[Path]) -> list[str]:
    return [str(d) for d in test_dirs] + [
        # Only pytest's own plugins and the kit's: one installed beside the kit (xdist, anyio, a student's
        # own) could change how the lab's tests run, and importing them costs every run half a CPU-second.
        "--disable-plugin-autoload",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:terminal",
        "-p",
        "no:randomly",
        "-p",
        "no:unraisableexception",  # its garbage collections at the end, over a heap holding JAX: seconds a lab
        "--import-mode=importlib",
        "-o",
        "python_files=test_*.py",
        "-W",
        "ignore::DeprecationWarning",
    ]


def collect_calls(test_dirs: list[Path]) -> list[dict]:
    """The calls the tests in `test_dirs` declare, encoded for the harness, without running anything.

    Grading runs notebooks itself (to keep each run's record as soon as it ends) and then
    judges the finished runs; these are the calls those runs must make.
    """
    plugin = _Plugin([], [], 1, execute.DEFAULT_TIMEOUT)
    code = pytest.main(_args(test_dirs) + ["--collect-only"], plugins=[plugin])
    if plugin.collect_errors:
        raise KitError("the lab's tests could not be collected:\n" + "\n".join(plugin.collect_errors))
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        raise KitError(f"pytest stopped with {code!r}")
    return getattr(plugin, "calls", [])


def judge(
    test_dirs: list[Path],
    runs: list[RunSpec],
    *,
    hidden_dirs: list[Path] = (),
    jobs: int | None = None,
    timeout: float = execute.DEFAULT_TIMEOUT,
    limits=None,
    warm=None,
    cache=None,
) -> Judgement:
    """Run the notebooks of `runs` and the tests in `test_dirs` against them (`warm`: see `warm.Server`;
    `cache`: see `jaxcache`)."""
    plugin = _Plugin(runs, list(hidden_dirs), jobs or os.cpu_count() or 1, timeout, limits, warm, cache)
    code = pytest.main(_args(test_dirs), plugins=[plugin])
    if plugin.collect_errors:
        raise KitError("the lab's tests could not be collected:\n" + "\n".join(plugin.collect_errors))
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        raise KitError(f"pytest stopped with {code!r}")
    plugin.judgement.calls = getattr(plugin, "calls", [])
    return plugin.judgement
