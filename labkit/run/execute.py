"""Run one notebook on one device configuration: papermill here, the student's kernel in a sandbox.

`run_notebook` copies the notebook into a scratch folder (the student's file is never
written), appends the harness cell that calls the student's functions on the judge's
inputs, and runs the copy with papermill. Papermill and its notebook client run in the
calling (trusted) process; only the Jupyter kernel, where the student's code runs, is a
child process: started through `sandbox.launch` with the configuration's environment,
sandboxed and under limits, talking to papermill over Unix sockets in its scratch folder.
The kernel seals the harness with the run's private key before the first cell. The call
returns a `RunRecord`: plain data about how the run went and what the functions returned,
read once when the run has ended and only when the sealed harness signed it. It judges nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from labkit import envnames
from labkit.course.configs import DeviceConfig
from labkit.judge import callplan, records, verify
from labkit.judge.callplan import CallSpec
from labkit.run import kernel, runreport, sandbox, scratch
from labkit.run.allowance import DEFAULT_LIMITS, Limits
from labkit.statuses import Run, Start

DEFAULT_TIMEOUT = 120.0  # seconds for one notebook on one configuration
HARNESS_TAG = "labkit-harness"
SETUP_TAG = "labkit-setup"
# The first cell of each process of a multi-process run: join the others before the student's cells.
JOIN_CELL = "import labkit.judge.harness as _labkit_harness\n_labkit_harness.join_distributed()"
LEAVE_CELL = "import labkit.judge.harness as _labkit_harness\n_labkit_harness.leave_distributed()"
PEER_GRACE = 5.0  # seconds the other processes get to finish once one process of a run has failed
RESULTS_MAX_BYTES = records.MAX_BYTES  # a results file larger than this is not read


class BadNotebook(Exception):
    """The file is not a notebook we can run. The message names the file and what is wrong."""


@dataclass
class RunRecord:
    config: str
    status: str  # a statuses.Run: "ok" (the notebook ran to its end), "error", "timeout" or "skipped"
    message: str = ""
    seconds: float = 0.0
    environment: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)  # call id -> {"value": ...} or {"error": ...}
    cell_errors: list = field(default_factory=list)  # errors raised by the student's own cells
    workdir: str = ""
    # A multi-process run: what every process returned (process 0's is also `results` and `environment`).
    processes: list = field(default_factory=list)  # [{"process", "exit", "environment", "results"}]
    isolation: str = ""  # "bubblewrap" (a sandbox) or "limits-only" (resource limits and a scratch folder)
    limits: dict = field(default_factory=dict)  # the Limits the run had, and its timeout in seconds
    start: str = (
        ""  # "warm" (a kernel forked by a warm server, `labkit.run.warm`) or "cold" (a kernel of its own)
    )
    # what gave the run its share of the processors: "cgroup v1 cpu.shares", "cgroup v2 cpu.weight", "autogroup"
    # (one session per run, `labkit.run.sessions`) or "none" (its processes competed one by one with everything else)
    cpu_share: str = ""
    judged_by: str = (
        ""  # "verified" (values from the kit's own run of the programs, `labkit.judge.verify`) or "reported"
    )
    verify_seconds: float = 0.0  # what the kit's own run of the programs took (after the notebook's run)
    verify_start: str = ""  # how that run started: "warm" (forked by the warm server) or "cold"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RunRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read and validate a notebook; raise BadNotebook with a message a student understands."""
    path = Path(path)
    if path.is_dir():
        raise BadNotebook(f"{path} is a folder, not a notebook file")
    if not path.exists():
        raise BadNotebook(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise BadNotebook(f"{path} is empty (0 bytes): save the notebook from Jupyter again")
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BadNotebook(
            f"{path} is not valid notebook JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    except UnicodeDecodeError:
        raise BadNotebook(f"{path} is not a text file: is it really a notebook?") from None
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 - nbformat's reader raises many kinds on a bad file
        raise BadNotebook(
            f"{path} is not a notebook nbformat can read: {str(e).splitlines()[0][:300]}"
        ) from None
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        raise BadNotebook(f"{path} is not a valid notebook: {str(e).splitlines()[0][:300]}") from None
    return nb


def prepare(
    nb: nbformat.NotebookNode,
    workdir: Path,
    calls: list[CallSpec],
    first: str | None = None,
    last: str | None = None,
) -> Path:
    """Write the copy to run into the run's kit folder `workdir`: the student's cells, outputs cleared, the harness last.

    `first`, when given, is a cell of the kit's that runs before the student's (a multi-process
    run joins the other processes there); `last`, one that runs after the harness (where they leave
    together). The harness reads the calls from the kit folder (which
    the run sees read-only) and writes its results into the run's scratch folder."""
    folders = start_folders(workdir)
    calls_path = folders.kit / "calls.json"
    results_path = folders.scratch / "results.json"
    calls_path.write_text(json.dumps({"calls": calls}))
    copy = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    )
    if first:
        copy.cells.append(nbformat.v4.new_code_cell(first, metadata={"tags": [SETUP_TAG]}))
    for number, cell in enumerate(nb.cells, start=1):
        if cell.cell_type == "code":
            if {HARNESS_TAG, SETUP_TAG} & set(cell.get("metadata", {}).get("tags", [])):
                continue  # a submission cannot bring its own harness or setup
            copy.cells.append(nbformat.v4.new_code_cell(cell.source, metadata={"labkit_cell": number}))
        else:
            copy.cells.append(nbformat.v4.new_markdown_cell(cell.source))
    harness = nbformat.v4.new_code_cell(
        "import labkit.judge.harness as _labkit_harness\n"
        f"_labkit_harness.run(globals(), {str(calls_path)!r}, {str(results_path)!r})"
    )
    harness.metadata["tags"] = [HARNESS_TAG]
    copy.cells.append(harness)
    if last:
        copy.cells.append(nbformat.v4.new_code_cell(last, metadata={"tags": [SETUP_TAG]}))
    path = folders.kit / "input.ipynb"
    nbformat.write(copy, path)
    return path


def new_key() -> str:
    """A run's private key: the harness signs its results with it; nothing else in the run can."""
    return secrets.token_hex(32)


class ForgedResults(Exception):
    """A results file the sealed harness did not write."""


def read_results(path: Path, key: str | None) -> tuple[dict, dict]:
    """(environment, results by call id) from a run's results file, read once, right after the run.

    The file lies in the run's scratch folder: it is read through `scratch.read` (a regular file
    only, never through a link, at most RESULTS_MAX_BYTES). With a `key`, only a file signed with
    it is accepted (ForgedResults otherwise): a file written or rewritten by the notebook itself,
    or by a process it left behind, is refused. Raises OSError (`scratch.Refused` included),
    ValueError, KeyError, TypeError or AttributeError when it cannot be read.
    """
    path = Path(path)
    outer = records.parse(scratch.read(path.parent, path.name, RESULTS_MAX_BYTES))
    if key is not None:
        text, mac = outer.get("payload"), outer.get("mac")
        if not isinstance(text, str) or not isinstance(mac, str):
            raise ForgedResults("the results file was not written by the kit's harness")
        expected = hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, mac):
            raise ForgedResults("the results file was not written by the kit's harness")
        payload = records.parse(text)
    else:
        payload = records.parse(outer["payload"]) if isinstance(outer.get("payload"), str) else outer
    return records.payload(
        payload
    )  # its schema, bounded: records.Malformed (a ValueError) if it does not fit


NOT_A_FILE = {
    "link": "symbolic link",
    "folder": "folder",
    "other": "special file (a named pipe, a socket or a device)",
}
FORGED = (
    "the run's results were not written by the kit's harness (a cell or a process it started wrote or "
    "replaced them): nothing from this run is graded"
)


RUN_MARK = ".labkit-run"  # in a kit folder: the kit made it, and may empty it


def fresh_workdir(workdir: Path) -> None:
    """Empty a run's folder before the run: nothing an earlier run left there is kept (links, dangling or not,
    pipes, modules, results), and nothing is followed on the way (`scratch.remove`).

    Only a folder the kit made (its mark, or an earlier layout's files) or an empty one is emptied:
    a folder of the user's given by mistake is refused (ValueError)."""
    workdir = Path(workdir)
    if os.path.lexists(workdir):
        if (
            workdir.is_dir()
            and not workdir.is_symlink()
            and any(workdir.iterdir())
            and not any(
                os.path.lexists(workdir / name) for name in (RUN_MARK, "input.ipynb", "run.log", "process-0")
            )
        ):
            raise ValueError(f"{workdir} is not a folder the kit made for a run: it is not emptied")
        scratch.remove(workdir)
    workdir.mkdir(parents=True)
    (workdir / RUN_MARK).write_text("a run's folder: the kit empties it before every run\n")


def start_folders(workdir: Path) -> scratch.RunFolders:
    """The run's kit folder `workdir` and its empty scratch folder (made empty now, whatever was there)."""
    folders = scratch.RunFolders(Path(workdir))
    folders.kit.mkdir(parents=True, exist_ok=True)
    scratch.empty(folders.scratch)
    return folders


def run_notebook(
    notebook: Path,
    config: DeviceConfig,
    calls: list[CallSpec],
    workdir: Path,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    limits: Limits | None = None,
    warm=None,
    cache=None,
    keep_scratch: bool = False,
) -> RunRecord:
    """Run `notebook` on `config` in a child process and return what came back, as plain data.

    The child runs sandboxed and under `limits` (see `sandbox`); its results are read once,
    right after it ended, and only when the run's sealed harness signed them. `warm`, a started
    `warm.Server`, forks the kernel of a one-process CPU run (a cold start where it cannot);
    `cache`, a `jaxcache.CompileCache`, is JAX's compilation cache for the run (read-only unless
    the cache says the run fills it).

    `workdir` is the run's kit folder (see `scratch`): the kit's files, and the run's scratch folder,
    which is removed once its results are read unless `keep_scratch`.
    """
    workdir = Path(workdir).absolute()  # named in the kernel's connection file and the sandbox's binds
    limits = config.run_limits(limits or DEFAULT_LIMITS)  # what a run on it needs to start, at the least
    timeout = config.run_timeout(timeout)  # and to finish, at the least
    available, reason = config.availability()
    if not available:
        return RunRecord(config.name, Run.SKIPPED, reason, workdir=str(workdir))
    calls = callplan.for_configuration(calls, bool(config.compile_for))
    try:
        nb = read_notebook(notebook)
    except BadNotebook as e:
        return RunRecord(config.name, Run.ERROR, str(e), workdir=str(workdir))
    fresh_workdir(workdir)
    try:
        if config.processes > 1:
            return _run_processes(nb, config, calls, workdir, timeout, limits)
        return _run_one(nb, config, calls, workdir, timeout, limits, warm, cache)
    finally:
        if not keep_scratch:
            for folder in [workdir, *sorted(workdir.glob("process-*"))]:
                scratch.remove(scratch.RunFolders(folder).scratch)


def environment_of(config: DeviceConfig) -> dict[str, str]:
    """A notebook run's environment on `config`: the configuration's own, and its name (`LABKIT_RUN`, which
    `labkit.notebook` reads to know it is inside a run). The same for a local run and a pod's."""
    return config.environment() | {envnames.RUN: config.name}


def _run_one(
    nb,
    config: DeviceConfig,
    calls: list[CallSpec],
    workdir: Path,
    timeout: float,
    limits: Limits,
    warm,
    cache,
) -> RunRecord:
    input_path = prepare(nb, workdir, callplan.for_the_student(calls))
    key = new_key()
    env = environment_of(config) | (cache.environment() if cache else {})
    warm = warm if warm is not None and config.platform == "cpu" else None
    ran = kernel.papermill_run(
        input_path,
        workdir / "executed.ipynb",
        scratch.RunFolders(workdir),
        env,
        limits,
        key,
        timeout,
        warm=warm,
        cache=cache,
    )
    cell_errors, last_started = runreport.cell_errors(workdir / "executed.ipynb")
    record = RunRecord(
        config.name,
        Run.OK,
        seconds=round(ran.seconds, 2),
        cell_errors=cell_errors,
        workdir=str(workdir),
        isolation=ran.isolation,
        limits=limits.to_json() | {"timeout": timeout},
        start=ran.start,
        cpu_share=ran.cpu_share,
    )
    stopped = _stopped(ran, last_started, timeout)
    if stopped is not None:
        record.status, record.message = stopped
        return record
    results_path = scratch.RunFolders(workdir).scratch / "results.json"
    found = scratch.kind(results_path.parent, results_path.name)
    if found != "file":
        record.status = Run.ERROR
        record.message = (
            runreport.why_no_results(workdir / "run.log", ran) + _in_cell(ran, last_started)
            if found == "missing"
            else f"the run's results file was replaced by a {NOT_A_FILE.get(found, 'special file')}, which "
            "the kit never opens: nothing from this run is graded"
        )
        return record
    if _read_back(record, results_path, key):
        verify.verify(record, calls, workdir, env, limits, timeout, cache, warm)
        record.judged_by = verify.judged_by(record.results)
    return record


def _in_cell(ran: kernel.KernelRun, last_started) -> str:
    """Where a kernel that died was: the notebook's cell it had started last ("" when not known)."""
    return f", in cell {last_started}" if ran.died and last_started is not None else ""


def _stopped(ran: kernel.KernelRun, last_started, timeout: float) -> tuple[Run, str] | None:
    """(status, message) of a run the kit stopped (over its disk, out of time), before anything is read of it."""
    if ran.disk:
        where = f" (while running cell {last_started})" if last_started is not None else ""
        return Run.ERROR, f"{ran.disk}{where}: nothing from this run is graded"
    if ran.timed_out:
        where = f" (still running cell {last_started})" if last_started is not None else ""
        return Run.TIMEOUT, f"the notebook did not finish within {timeout:g} s{where}"
    return None


def _read_back(record: RunRecord, results_path: Path, key: str) -> bool:
    """Read the run's results into `record`; False, with the record an error that says why, where they cannot be."""
    try:
        record.environment, record.results = read_results(results_path, key)
        return True
    except ForgedResults:
        record.message = FORGED
    except scratch.Refused as e:
        record.message = f"the run's results could not be read: {e}"
    except records.Malformed as e:
        record.message = (
            f"the run's results are not what the kit's harness writes ({e}): nothing from it is graded"
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        record.message = f"the run's results could not be read ({type(e).__name__})"
    record.status = Run.ERROR
    return False


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now (the coordinator of a multi-process run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_payload(path: Path, key: str | None = None) -> tuple[dict, dict] | None:
    """(environment, results by call id) from a harness's results.json, or None when unreadable or not signed."""
    try:
        return read_results(path, key)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ForgedResults):
        return None


# ----------------------------------------------------------------------------------------
# A run of several JAX processes.
# ----------------------------------------------------------------------------------------


def _run_processes(
    nb: nbformat.NotebookNode,
    config: DeviceConfig,
    calls: list[CallSpec],
    workdir: Path,
    timeout: float,
    limits: Limits | None = None,
) -> RunRecord:
    """A run of `config.processes` JAX processes, each a kernel running the notebook, joined on a free localhost port.

    Process i works in `workdir/process-i/`; the run's results are process 0's, and every
    process's results are kept in `RunRecord.processes`. A process whose kernel ends early stops
    the run: its peers would wait for it in a collective until the timeout, so they get
    PEER_GRACE seconds to finish, then are ended. However it ends, no process outlives the run.
    """
    start = time.monotonic()
    run = _ProcessRun(nb, config, calls, workdir, timeout, limits or DEFAULT_LIMITS)
    failed = run.run_all()
    return run.record(failed, time.monotonic() - start)


class _ProcessRun:
    """The processes of one multi-process run, a kernel each in a thread of this process, while they go."""

    def __init__(
        self,
        nb: nbformat.NotebookNode,
        config: DeviceConfig,
        calls: list[CallSpec],
        workdir: Path,
        timeout: float,
        limits: Limits,
    ):
        self.nb, self.config, self.calls, self.workdir = nb, config, calls, workdir
        self.timeout, self.limits, self.key = timeout, limits, new_key()
        self.coordinator = f"127.0.0.1:{free_port()}"
        self.dirs = [workdir / f"process-{i}" for i in range(config.processes)]
        self.runs: list[kernel.KernelRun | None] = [None] * config.processes
        self.stop = threading.Event()  # set when a process has died or failed: the others are ended
        self.first: list = []  # process 0's kernel manager, once made: the others join its private network

    def network(self) -> dict[str, str] | None:
        """The namespaces of process 0's sandbox, for process i > 0 to join (None: it never started)."""
        deadline = time.monotonic() + self.timeout
        while not self.first and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(0.02)
        if (
            not self.first
            or not self.first[0].started.wait(max(0.0, deadline - time.monotonic()))
            or not self.first[0].sandboxed
        ):
            return None
        return sandbox.network_of(self.first[0].sandboxed)

    def run_process(self, i: int) -> None:
        """Process i's kernel runs the notebook between the cells that join and leave the distributed run."""
        input_path = prepare(self.nb, self.dirs[i], self.calls, first=JOIN_CELL, last=LEAVE_CELL)
        env = (
            environment_of(self.config)
            | {envnames.JOIN_TIMEOUT: str(int(min(60, self.timeout)))}
            | self.config.process_env(i, self.coordinator)
        )
        ran = kernel.papermill_run(
            input_path,
            self.dirs[i] / "executed.ipynb",
            scratch.RunFolders(self.dirs[i]),
            env,
            self.limits,
            self.key,
            self.timeout,
            network=self.network if i else None,
            kernels=self.first if i == 0 else None,
        )
        self.runs[i] = ran
        if ran.died or ran.failure:
            self.stop.set()

    def run_all(self) -> int | None:
        """Every process run to its end; the one that failed first, if any (the others then ended after a grace)."""
        threads = [
            threading.Thread(target=self.run_process, args=(i,), name=f"labkit-process-{i}", daemon=True)
            for i in range(self.config.processes)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.timeout + PEER_GRACE
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(0.05)
        failed = next((i for i, r in enumerate(self.runs) if r is not None and (r.died or r.failure)), None)
        if failed is not None:  # the others get a grace period, then their timeout is cut short
            grace = time.monotonic() + PEER_GRACE
            while any(t.is_alive() for t in threads) and time.monotonic() < grace:
                time.sleep(0.05)
            for i, thread in enumerate(threads):
                if thread.is_alive():
                    kernel.end_kernels_in(self.dirs[i])
        for thread in threads:
            thread.join()
        if failed is not None:
            # a peer may be seen to end first (its collectives abort once a process is gone): a stop for the
            # disk is why
            failed = next((i for i, r in enumerate(self.runs) if r is not None and r.disk), failed)
        return failed

    def record(self, failed: int | None, seconds: float) -> RunRecord:
        """The run's record: every process's results kept, process 0's graded, or why there are none."""
        cell_errors, last_started = runreport.cell_errors(self.dirs[0] / "executed.ipynb")
        record = RunRecord(
            self.config.name,
            Run.OK,
            seconds=round(seconds, 2),
            cell_errors=cell_errors,
            workdir=str(self.workdir),
            isolation=next((r.isolation for r in self.runs if r), ""),
            limits=self.limits.to_json() | {"timeout": self.timeout},
            start=Start.COLD,
            cpu_share=next((r.cpu_share for r in self.runs if r), ""),
        )
        refused = self._read_results(record)
        why = self._why_no_results(record, failed, refused, last_started)
        if why is not None:
            record.status, record.message = why
            return record
        # process 0's word for its devices (a multi-process run is reported: see labkit.judge.verify), the
        # configuration's for its backend and the precision of its products
        record.environment = verify.kit_environment(
            record.processes[0]["environment"], environment_of(self.config), counted=True
        )
        record.results = record.processes[0]["results"]
        record.judged_by = "reported"  # each process's own report: see labkit.judge.verify
        return record

    def _read_results(self, record: RunRecord) -> list[int]:
        """Each process's results, as signed, into `record.processes`; the processes whose file was forged."""
        refused = []
        for i, (run, pdir) in enumerate(zip(self.runs, self.dirs)):
            results = scratch.RunFolders(pdir).scratch
            payload = _read_payload(results / "results.json", self.key)
            if payload is None and scratch.is_file(results, "results.json"):
                refused.append(i)
            record.processes.append(
                {
                    "process": i,
                    "exit": run.returncode if run else None,
                    "coordinator": self.coordinator,
                    "environment": payload[0] if payload else {},
                    "results": payload[1] if payload else {},
                }
            )
        return refused

    def _why_no_results(
        self, record: RunRecord, failed: int | None, refused: list[int], last_started
    ) -> tuple[str, str] | None:
        """(status, message) where the run gave no results to grade: a process failed, the run timed out, a
        process stopped before the calls, or its results were forged; None where every process reported."""
        of = f"of {self.config.processes}"
        if failed is not None:
            why = runreport.why_no_results(self.dirs[failed] / "run.log", self.runs[failed])
            return Run.ERROR, f"process {failed} {of} stopped early, so the others were ended too: {why}"
        if any(r is None or r.timed_out for r in self.runs):
            where = f" (process 0 still running cell {last_started})" if last_started is not None else ""
            return (
                Run.TIMEOUT,
                f"the notebook did not finish within {self.timeout:g} s on all {self.config.processes} processes"
                f"{where}",
            )
        missing = [
            i
            for i, p in enumerate(record.processes)
            if not p["results"]
            and not scratch.is_file(scratch.RunFolders(self.dirs[i]).scratch, "results.json")
        ]
        if missing:
            return Run.ERROR, (
                f"process {missing[0]} {of} stopped before its functions could be called: "
                + runreport.why_no_results(self.dirs[missing[0]] / "run.log", self.runs[missing[0]])
            )
        if refused:
            return Run.ERROR, f"process {refused[0]} {of}: {FORGED}"
        return None
