"""Run one notebook on one device configuration, in processes of its own.

`run_notebook` copies the notebook into a scratch folder (the student's file is never
written), appends the harness cell that calls the student's functions on the judge's
inputs, and runs the copy with papermill in a child process whose environment is the
configuration's, sandboxed and under limits (`sandbox.launch`). It returns a `RunRecord`:
plain data about how the run went and what the functions returned, read once when the
run has ended and only when the run's sealed harness signed it. It judges nothing.

`python -m labkit.execute IN OUT` is that child process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from labkit import harness, sandbox
from labkit.configs import DeviceConfig
from labkit.sandbox import DEFAULT_LIMITS, Limits

DEFAULT_TIMEOUT = 120.0  # seconds for one notebook on one configuration
HARNESS_TAG = "labkit-harness"
SETUP_TAG = "labkit-setup"
# The first cell of each process of a multi-process run: join the others before the student's cells.
JOIN_CELL = "import labkit.harness as _labkit_harness\n_labkit_harness.join_distributed()"
PEER_GRACE = 5.0  # seconds the other processes get to finish once one process of a run has failed
RESULTS_MAX_BYTES = 256 << 20  # a results file larger than this is not read


class BadNotebook(Exception):
    """The file is not a notebook we can run. The message names the file and what is wrong."""


@dataclass
class RunRecord:
    config: str
    status: str  # "ok" (the notebook ran to its end), "error", "timeout" or "skipped"
    message: str = ""
    seconds: float = 0.0
    environment: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)  # call id -> {"value": ...} or {"error": ...}
    cell_errors: list = field(default_factory=list)  # errors raised by the student's own cells
    workdir: str = ""
    # A multi-process run: what every process returned (process 0's is also `results` and `environment`).
    processes: list = field(default_factory=list)  # [{"process", "exit", "environment", "results"}]
    isolation: str = ""  # "bubblewrap" (a sandbox) or "limits-only" (resource limits and a scratch folder)
    limits: dict = field(default_factory=dict)  # the Limits the run had

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RunRecord":
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
        raise BadNotebook(f"{path} is not valid notebook JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise BadNotebook(f"{path} is not a text file: is it really a notebook?") from None
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # nbformat's own reader errors
        raise BadNotebook(f"{path} is not a notebook nbformat can read: {str(e).splitlines()[0][:300]}") from None
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        raise BadNotebook(f"{path} is not a valid notebook: {str(e).splitlines()[0][:300]}") from None
    return nb


def prepare(nb: nbformat.NotebookNode, workdir: Path, calls: list[dict], first: str | None = None) -> Path:
    """Write the copy to run: the student's cells, outputs cleared, and the harness cell last.

    `first`, when given, is a cell of the kit's that runs before the student's (a multi-process
    run joins the other processes there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    calls_path = workdir / "calls.json"
    results_path = workdir / "results.json"
    calls_path.write_text(json.dumps({"calls": calls}))
    if results_path.exists():
        results_path.unlink()
    copy = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                             "language": "python"}})
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
        "import labkit.harness as _labkit_harness\n"
        f"_labkit_harness.run(globals(), {str(calls_path)!r}, {str(results_path)!r})"
    )
    harness.metadata["tags"] = [HARNESS_TAG]
    copy.cells.append(harness)
    path = workdir / "input.ipynb"
    nbformat.write(copy, path)
    return path


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """End a process and everything it started, including kernels in sessions of their own."""
    for p in [pid, *_descendants(pid)]:
        for kill in (lambda: os.killpg(os.getpgid(p), signal.SIGKILL), lambda: os.kill(p, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError, OSError):
                pass


def launch(cmd: list[str], cwd: Path, env: dict[str, str], log, limits: Limits | None = None,
           key: str | None = None) -> sandbox.Sandboxed:
    """Start one process of a run, sandboxed and under `limits`, its output into `log` (see `sandbox.launch`).

    Every process a run starts goes through here: one for a one-process configuration, one per
    JAX process for a multi-process one (whose processes must reach each other on localhost, so
    they share the host's network). `key`, the run's private key, reaches the child on its stdin.
    """
    limits = limits or DEFAULT_LIMITS
    if env.get("LABKIT_COORDINATOR") or harness.tpu_hosts(env) > 1:
        limits = dataclasses.replace(limits, network=True)
    return sandbox.launch(cmd, cwd, env, limits, log=log, stdin=(key + "\n").encode() if key else None)


def new_key() -> str:
    """A run's private key: the harness signs its results with it; nothing else in the run can."""
    return secrets.token_hex(32)


class ForgedResults(Exception):
    """A results file the sealed harness did not write."""


def read_results(path: Path, key: str | None) -> tuple[dict, dict]:
    """(environment, results by call id) from a run's results file, read once, right after the run.

    With a `key`, only a file signed with it is accepted (ForgedResults otherwise): a file
    written or rewritten by the notebook itself, or by a process it left behind, is refused.
    Raises OSError, ValueError, KeyError, TypeError or AttributeError when it cannot be read.
    """
    path = Path(path)
    if path.stat().st_size > RESULTS_MAX_BYTES:
        raise ValueError(f"the results file is larger than {RESULTS_MAX_BYTES >> 20} MiB")
    outer = json.loads(path.read_text())
    if key is not None:
        text, mac = outer.get("payload"), outer.get("mac")
        if not isinstance(text, str) or not isinstance(mac, str):
            raise ForgedResults("the results file was not written by the kit's harness")
        expected = hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, mac):
            raise ForgedResults("the results file was not written by the kit's harness")
        payload = json.loads(text)
    else:
        payload = json.loads(outer["payload"]) if isinstance(outer.get("payload"), str) else outer
    return dict(payload.get("environment", {})), {str(r["id"]): r for r in payload.get("results", [])}


FORGED = ("the run's results were not written by the kit's harness (a cell or a process it started wrote or "
          "replaced them): nothing from this run is graded")


def _cell_errors(executed: Path) -> tuple[list[dict], int | None]:
    """Errors raised by the student's cells, and the index of the last cell that started."""
    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception:
        return [], None
    errors, last_started = [], None
    for cell in nb.cells:
        number = cell.get("metadata", {}).get("labkit_cell")
        if cell.cell_type != "code" or number is None:
            continue  # markdown, papermill's own marker cells, the harness
        pm = cell.get("metadata", {}).get("papermill", {})
        if pm.get("start_time"):
            last_started = number
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append({"cell": number, "type": out.get("ename", ""),
                               "message": str(out.get("evalue", "")).splitlines()[0][:300] if out.get("evalue") else "",
                               "code": cell.source.strip().splitlines()[0][:120] if cell.source.strip() else ""})
    return errors, last_started


def fresh_workdir(workdir: Path) -> None:
    """Empty a run's scratch folder: nothing an earlier run left there (a module, a results file) is kept."""
    workdir = Path(workdir)
    if workdir.is_dir() and any((workdir / name).exists() for name in ("input.ipynb", "run.log", "process-0")):
        shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)


def run_notebook(notebook: Path, config: DeviceConfig, calls: list[dict], workdir: Path,
                 timeout: float = DEFAULT_TIMEOUT, *, limits: Limits | None = None) -> RunRecord:
    """Run `notebook` on `config` in a child process and return what came back, as plain data.

    The child runs sandboxed and under `limits` (see `sandbox`); its results are read once,
    right after it ended, and only when the run's sealed harness signed them.
    """
    workdir = Path(workdir)
    limits = limits or DEFAULT_LIMITS
    available, reason = config.availability()
    if not available:
        return RunRecord(config.name, "skipped", reason, workdir=str(workdir))
    try:
        nb = read_notebook(notebook)
    except BadNotebook as e:
        return RunRecord(config.name, "error", str(e), workdir=str(workdir))
    fresh_workdir(workdir)
    if config.processes > 1:
        return _run_processes(nb, config, calls, workdir, timeout, limits)
    input_path = prepare(nb, workdir, calls)
    output_path = workdir / "executed.ipynb"
    log_path = workdir / "run.log"
    cmd = [sys.executable, "-m", "labkit.execute", str(input_path), str(output_path), str(timeout), str(limits.output)]
    key = new_key()
    start = time.monotonic()
    with open(log_path, "wb") as log:
        env = config.environment() | {"LABKIT_RUN": config.name}
        proc = launch(cmd, workdir, env, log, limits, key)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_tree(proc.pid)
            proc.wait()
    seconds = time.monotonic() - start
    cell_errors, last_started = _cell_errors(output_path)
    record = RunRecord(config.name, "ok", seconds=round(seconds, 2), cell_errors=cell_errors, workdir=str(workdir),
                       isolation=proc.isolation, limits=limits.to_json())
    if timed_out:
        record.status = "timeout"
        where = f" (still running cell {last_started})" if last_started is not None else ""
        record.message = f"the notebook did not finish within {timeout:g} s{where}"
        return record
    results_path = workdir / "results.json"
    if not results_path.exists():
        record.status = "error"
        record.message = _why_no_results(log_path, proc.returncode)
        return record
    try:
        record.environment, record.results = read_results(results_path, key)
    except ForgedResults:
        record.status = "error"
        record.message = FORGED
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        record.status = "error"
        record.message = f"the run's results could not be read ({type(e).__name__})"
    return record


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


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> tuple[bool, int | None]:
    """Wait for every process of a run: (timed out, the first process that failed, if any).

    A process that ends with an error stops the run: its peers would wait for it in a
    collective until the timeout, so they get PEER_GRACE seconds to finish, then are ended.
    """
    deadline = time.monotonic() + timeout
    failed, grace_until = None, None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return False, failed
        if failed is None:
            failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                grace_until = time.monotonic() + PEER_GRACE
        now = time.monotonic()
        if grace_until is not None and now >= grace_until:
            return False, failed
        if now >= deadline:
            return True, failed
        time.sleep(0.1)


def _run_processes(nb: nbformat.NotebookNode, config: DeviceConfig, calls: list[dict], workdir: Path,
                   timeout: float, limits: Limits | None = None) -> RunRecord:
    """A run of `config.processes` JAX processes, each running the notebook, joined on a free localhost port.

    Process i works in `workdir/process-i/`; the run's results are process 0's, and every
    process's results are kept in `RunRecord.processes`. However it ends, no process outlives it.
    """
    coordinator = f"127.0.0.1:{free_port()}"
    dirs = [workdir / f"process-{i}" for i in range(config.processes)]
    procs, logs = [], []
    limits, key = limits or DEFAULT_LIMITS, new_key()
    start = time.monotonic()
    try:
        for i, pdir in enumerate(dirs):
            input_path = prepare(nb, pdir, calls, first=JOIN_CELL)
            cmd = [sys.executable, "-m", "labkit.execute", str(input_path), str(pdir / "executed.ipynb"), str(timeout),
                   str(limits.output)]
            env = (config.environment() | {"LABKIT_RUN": config.name, "LABKIT_JOIN_TIMEOUT": str(int(min(60, timeout)))}
                   | config.process_env(i, coordinator))
            logs.append(open(pdir / "run.log", "wb"))
            procs.append(launch(cmd, pdir, env, logs[-1], limits, key))
        timed_out, failed = _wait_all(procs, timeout)
    finally:
        for proc in procs:
            kill_tree(proc.pid)
        for proc in procs:
            proc.wait()
        for log in logs:
            log.close()
    seconds = time.monotonic() - start
    cell_errors, last_started = _cell_errors(dirs[0] / "executed.ipynb")
    record = RunRecord(config.name, "ok", seconds=round(seconds, 2), cell_errors=cell_errors, workdir=str(workdir),
                       isolation=procs[0].isolation if procs else "", limits=limits.to_json())
    refused = []
    for i, (proc, pdir) in enumerate(zip(procs, dirs)):
        payload = _read_payload(pdir / "results.json", key)
        if payload is None and (pdir / "results.json").exists():
            refused.append(i)
        record.processes.append({"process": i, "exit": proc.returncode, "coordinator": coordinator,
                                 "environment": payload[0] if payload else {},
                                 "results": payload[1] if payload else {}})
    of = f"of {config.processes}"
    if failed is not None:
        record.status = "error"
        why = _why_no_results(dirs[failed] / "run.log", procs[failed].returncode)
        record.message = f"process {failed} {of} stopped early, so the others were ended too: {why}"
        return record
    if timed_out:
        record.status = "timeout"
        where = f" (process 0 still running cell {last_started})" if last_started is not None else ""
        record.message = f"the notebook did not finish within {timeout:g} s on all {config.processes} processes{where}"
        return record
    missing = [i for i, p in enumerate(record.processes) if not p["results"] and not (dirs[i] / "results.json").exists()]
    if missing:
        record.status = "error"
        record.message = (f"process {missing[0]} {of} stopped before its functions could be called: "
                          + _why_no_results(dirs[missing[0]] / "run.log", procs[missing[0]].returncode))
        return record
    if refused:
        record.status = "error"
        record.message = f"process {refused[0]} {of}: {FORGED}"
        return record
    record.environment = record.processes[0]["environment"]
    record.results = record.processes[0]["results"]
    return record


def _why_no_results(log_path: Path, returncode: int) -> str:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    joined = [ln for ln in text.splitlines() if ln.startswith("labkit: process ")]
    if joined:
        return joined[-1].removeprefix("labkit: ")
    if "DeadKernelError" in text or "Kernel died" in text:
        return "the Python kernel died while running the notebook (a crash, or out of memory)"
    if returncode is not None and (returncode < 0 or returncode > 128):
        signum = -returncode if returncode < 0 else returncode - 128
        return (f"the notebook stopped before its functions could be called: the process running it was killed "
                f"(signal {signum})")
    lines = [ln for ln in text.splitlines() if ln.strip() and "Kernel is running over TCP without encryption" not in ln]
    tail = lines[-1][:300] if lines else f"exit status {returncode}"
    return f"the notebook stopped before its functions could be called: {tail}"


def _not_dumpable() -> None:
    """Keep this process's memory (it holds the run's key) from the kernel's eyes: no /proc/PID/mem, no ptrace."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def _seal_at_kernel_start(key: str, folder: Path) -> None:
    """Have the kernel seal the harness before any cell runs: an IPython start-up file in a private IPYTHONDIR."""
    import tempfile

    private = Path(tempfile.mkdtemp(prefix="labkit-"))
    key_file = private / "key.json"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"key": key, "calls": str(folder / "calls.json"), "results": str(folder / "results.json")}, f)
    startup = private / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-labkit-seal.py").write_text(
        f"import labkit.harness\nlabkit.harness.seal({str(key_file)!r})\ndel labkit\n")
    os.environ["IPYTHONDIR"] = str(private / "ipython")


def _cap_outputs(limit: int) -> None:
    """Keep at most `limit` bytes of cell outputs in the executed notebook; a note says where they were cut.

    Errors are always kept (shortened), so that a cell that raised is still reported.
    """
    from nbclient.client import NotebookClient

    original = NotebookClient.output
    state = {"kept": 0, "cut": False}

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        if msg.get("msg_type") == "error":
            content["traceback"] = list(content.get("traceback", []))[-20:]
            content["evalue"] = str(content.get("evalue", ""))[:2000]
            return original(self, outs, msg, display_id, cell_index)
        size = len(json.dumps(content, default=str))
        if state["kept"] + size > limit:
            if not state["cut"]:
                state["cut"] = True
                outs.append(nbformat.v4.new_output(
                    "stream", name="stderr",
                    text=f"[labkit: output cut here: the run's outputs passed {sandbox.format_size(limit)}]\n"))
            return None
        state["kept"] += size
        return original(self, outs, msg, display_id, cell_index)

    NotebookClient.output = output


def main(argv: list[str] | None = None) -> int:
    """The child process: execute IN into OUT with papermill, letting every cell run even after an error.

    A first line on stdin is the run's key: the kernel then seals the harness with it at start-up.
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    args = (argv or sys.argv[1:])
    input_path, output_path, timeout = args[:3]
    _cap_outputs(int(args[3]) if len(args) > 3 else DEFAULT_LIMITS.output)
    key = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.readline().strip()
    if key:
        _not_dumpable()
        _seal_at_kernel_start(key, Path(input_path).resolve().parent)
    try:
        papermill.execute_notebook(
            input_path, output_path, kernel_name="python3", progress_bar=False, cwd=str(Path(input_path).parent),
            allow_errors=True, execution_timeout=int(float(timeout)),
        )
    except PapermillExecutionError:
        pass  # the student's cells raised; the harness cell still ran, and the errors are in OUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
