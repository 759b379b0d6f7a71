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

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from labkit import harness, sandbox, scratch, verify
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
    start: str = ""  # "warm" (a kernel forked by a warm server, `labkit.warm`) or "cold" (a kernel of its own)
    # what gave the run its share of the processors: "cgroup v1 cpu.shares", "cgroup v2 cpu.weight", "autogroup"
    # (one session per run, `labkit.sessions`) or "none" (its processes competed one by one with everything else)
    cpu_share: str = ""
    judged_by: str = ""  # "verified" (values from the kit's own run of the programs, `labkit.verify`) or "reported"
    verify_seconds: float = 0.0  # what the kit's own run of the programs took (after the notebook's run)
    verify_start: str = ""  # how that run started: "warm" (forked by the warm server) or "cold"

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
    """Write the copy to run into the run's kit folder `workdir`: the student's cells, outputs cleared, the harness last.

    `first`, when given, is a cell of the kit's that runs before the student's (a multi-process
    run joins the other processes there). The harness reads the calls from the kit folder (which
    the run sees read-only) and writes its results into the run's scratch folder."""
    folders = start_folders(workdir)
    calls_path = folders.kit / "calls.json"
    results_path = folders.scratch / "results.json"
    calls_path.write_text(json.dumps({"calls": calls}))
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
    path = folders.kit / "input.ipynb"
    nbformat.write(copy, path)
    return path


def kill_tree(pid: int) -> None:
    """End a process and everything it started, including kernels in sessions of their own."""
    for p in [pid, *sandbox.descendants(pid)]:
        for kill in (lambda: os.killpg(os.getpgid(p), signal.SIGKILL), lambda: os.kill(p, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError, OSError):
                pass


def launch(cmd: list[str], cwd: Path, env: dict[str, str], log, limits: Limits | None = None,
           key: str | None = None, join: dict[str, str] | None = None, extra_ro: tuple = (),
           extra_rw: tuple = ()) -> sandbox.Sandboxed:
    """Start one process of a run, sandboxed and under `limits`, its output into `log` (see `sandbox.launch`).

    Every process a run starts goes through here: one for a one-process configuration, one per
    JAX process for a multi-process one. The processes of a multi-process run on this machine
    share one private network (process 0's: `join`, from `sandbox.network_of`); only the workers
    of a multi-host TPU slice, which talk across machines, keep the host's network. `key`, when
    given, reaches the child on its stdin. `extra_ro` and `extra_rw` name more folders the run may
    read or write (JAX's compilation cache: see `jaxcache`).
    """
    limits = limits or DEFAULT_LIMITS
    if harness.tpu_hosts(env) > 1:
        limits = dataclasses.replace(limits, network=True)
    return sandbox.launch(cmd, cwd, env, limits, log=log, stdin=(key + "\n").encode() if key else None, join=join,
                          extra_ro=extra_ro, extra_rw=extra_rw)


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
    outer = json.loads(scratch.read(path.parent, path.name, RESULTS_MAX_BYTES))
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


NOT_A_FILE = {"link": "symbolic link", "folder": "folder", "other": "special file (a named pipe, a socket or a device)"}
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


RUN_MARK = ".labkit-run"  # in a kit folder: the kit made it, and may empty it


def fresh_workdir(workdir: Path) -> None:
    """Empty a run's folder before the run: nothing an earlier run left there is kept (links, dangling or not,
    pipes, modules, results), and nothing is followed on the way (`scratch.remove`).

    Only a folder the kit made (its mark, or an earlier layout's files) or an empty one is emptied:
    a folder of the user's given by mistake is refused (ValueError)."""
    workdir = Path(workdir)
    if os.path.lexists(workdir):
        if workdir.is_dir() and not workdir.is_symlink() and any(workdir.iterdir()) and not any(
                os.path.lexists(workdir / name) for name in (RUN_MARK, "input.ipynb", "run.log", "process-0")):
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


def run_notebook(notebook: Path, config: DeviceConfig, calls: list[dict], workdir: Path,
                 timeout: float = DEFAULT_TIMEOUT, *, limits: Limits | None = None, warm=None,
                 cache=None, keep_scratch: bool = False) -> RunRecord:
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
    limits = limits or DEFAULT_LIMITS
    available, reason = config.availability()
    if not available:
        return RunRecord(config.name, "skipped", reason, workdir=str(workdir))
    try:
        nb = read_notebook(notebook)
    except BadNotebook as e:
        return RunRecord(config.name, "error", str(e), workdir=str(workdir))
    fresh_workdir(workdir)
    try:
        if config.processes > 1:
            return _run_processes(nb, config, calls, workdir, timeout, limits)
        return _run_one(nb, config, calls, workdir, timeout, limits, warm, cache)
    finally:
        if not keep_scratch:
            for folder in [workdir, *sorted(workdir.glob("process-*"))]:
                scratch.remove(scratch.RunFolders(folder).scratch)


def _run_one(nb, config: DeviceConfig, calls: list[dict], workdir: Path, timeout: float, limits: Limits, warm,
             cache) -> RunRecord:
    input_path = prepare(nb, workdir, verify.for_the_student(calls))
    key = new_key()
    env = config.environment() | {"LABKIT_RUN": config.name} | (cache.environment() if cache else {})
    warm = warm if warm is not None and config.platform == "cpu" else None
    ran = _papermill(input_path, workdir / "executed.ipynb", scratch.RunFolders(workdir), env, limits, key, timeout,
                     warm=warm, cache=cache)
    cell_errors, last_started = _cell_errors(workdir / "executed.ipynb")
    record = RunRecord(config.name, "ok", seconds=round(ran.seconds, 2), cell_errors=cell_errors, workdir=str(workdir),
                       isolation=ran.isolation, limits=limits.to_json(), start=ran.start, cpu_share=ran.cpu_share)
    if ran.disk:
        record.status = "error"
        where = f" (while running cell {last_started})" if last_started is not None else ""
        record.message = f"{ran.disk}{where}: nothing from this run is graded"
        return record
    if ran.timed_out:
        record.status = "timeout"
        where = f" (still running cell {last_started})" if last_started is not None else ""
        record.message = f"the notebook did not finish within {timeout:g} s{where}"
        return record
    results_path = scratch.RunFolders(workdir).scratch / "results.json"
    found = scratch.kind(results_path.parent, results_path.name)
    if found != "file":
        record.status = "error"
        record.message = (_why_no_results(workdir / "run.log", ran) if found == "missing" else
                          f"the run's results file was replaced by a {NOT_A_FILE.get(found, 'special file')}, which "
                          "the kit never opens: nothing from this run is graded")
        return record
    try:
        record.environment, record.results = read_results(results_path, key)
    except ForgedResults:
        record.status = "error"
        record.message = FORGED
    except scratch.Refused as e:
        record.status = "error"
        record.message = f"the run's results could not be read: {e}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        record.status = "error"
        record.message = f"the run's results could not be read ({type(e).__name__})"
    else:
        verify.verify(record, calls, workdir, env, limits, timeout, cache, warm)
        record.judged_by = verify.judged_by(record.results)
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


# ----------------------------------------------------------------------------------------
# One kernel: papermill in this process, the kernel sandboxed, Unix sockets in between.
# ----------------------------------------------------------------------------------------

@dataclass
class KernelRun:
    """How one kernel's run ended, as seen from papermill's side."""

    seconds: float = 0.0
    timed_out: bool = False
    died: bool = False  # the kernel ended before the notebook did (a crash, a kill, out of memory)
    returncode: int | None = None
    isolation: str = ""
    failure: str = ""  # what papermill raised, when it was not the student's cells
    start: str = ""  # "warm" or "cold" (see RunRecord.start)
    cpu_share: str = ""  # see RunRecord.cpu_share
    disk: str = ""  # why the run was stopped for what it wrote to disk (see `_watch_disk`), when it was


class _KernelProcess:
    """The view of a sandboxed kernel that jupyter_client's provisioner uses: a Popen with no pipes of its own."""

    stdin = stdout = stderr = None

    def __init__(self, sandboxed: sandbox.Sandboxed):
        self.sandboxed, self.pid = sandboxed, sandboxed.pid

    def poll(self):
        return self.sandboxed.poll()

    def wait(self, timeout=None):
        return self.sandboxed.wait(timeout)

    def kill(self):
        self.sandboxed.kill()

    terminate = kill

    def send_signal(self, signum):
        os.killpg(self.pid, signum)


def _kernel_manager_class():
    """SandboxedKernelManager, defined on first use: jupyter_client is imported only by runs that need it."""
    global _SandboxedKernelManager
    if _SandboxedKernelManager is not None:
        return _SandboxedKernelManager
    import zmq
    import zmq.asyncio
    from jupyter_client.manager import AsyncKernelManager

    class SandboxedKernelManager(AsyncKernelManager):
        """A kernel started with `launch` (sandbox and limits) that listens on Unix sockets in its scratch folder.

        The kernel binds its sockets relative to its working folder (the scratch folder, the only
        place it may write); this process reaches them through a short link to that folder, as
        a socket path may not be longer than about 100 bytes.
        """

        def setup(self, workdir: Path, env: dict, limits: Limits, log, seal: list[str], network=None,
                  warm=None, cache=None, readable: Path | None = None) -> None:
            """`network`, when given, is called at launch for the namespaces to join (`sandbox.network_of`);
            `warm`, a `warm.Server`, forks the kernel instead of starting one."""
            self.run_dir, self.run_env, self.run_limits, self.run_log, self.seal_args = workdir, env, limits, log, seal
            self.network, self.warm, self.start_kind, self.cache = network, warm, "", cache
            self.readable = (readable,) if readable is not None else ()  # the run's kit folder, read-only
            self.started = threading.Event()  # set once the kernel's process exists (or could not be made)
            self.sandboxed: sandbox.Sandboxed | None = None
            self.ended, self.clients, self.asked_to_exit = False, [], False
            self.link_dir = Path(tempfile.mkdtemp(prefix="labkit-"))
            (self.link_dir / "w").symlink_to(workdir.resolve(), target_is_directory=True)
            # The connection file (which the kernel reads) names the sockets relative to the kernel's folder;
            # once the kernel is started, this side names them through the link.
            self.transport, self.ip = "ipc", "kernel"
            self.connection_file = str(workdir / "kernel.json")
            # A message far larger than the run's whole output allowance is refused by the socket, not read.
            self.client_context = zmq.asyncio.Context()
            self.client_context.setsockopt(zmq.MAXMSGSIZE, largest_message(limits))
            # The manager's own sockets (its control channel) never wait for a kernel that is gone: a message
            # left for a dead kernel would otherwise hold the context open until this process exits, and then
            # forever (zmq's term waits for every message to be sent).
            self.context = zmq.asyncio.Context()
            self.context.setsockopt(zmq.LINGER, 0)
            self.client_context.setsockopt(zmq.LINGER, 0)
            _LIVE_KERNELS.add(self)

        def client(self, **kwargs):
            kc = super().client(context=self.client_context, **kwargs)
            self.clients.append(kc)  # papermill's client does not stop its channels for a kernel it did not start
            return kc

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            # What the cells write to the process's own descriptors (os.write, C libraries) goes to the
            # run's log, which the sandbox cuts; what they print goes to the notebook, which the kernel cuts.
            cmd = [*kernel_cmd, "--IPKernelApp.capture_fd_output=False",
                   "--IPKernelApp.exec_lines=" + json.dumps(self.seal_args)]
            try:
                if self.warm is not None and self.network is None and "ipykernel_launcher" in cmd:
                    try:
                        argv = cmd[cmd.index("ipykernel_launcher") + 1:]
                        self.sandboxed = self.warm.launch(argv, self.run_dir, self.run_env, self.run_limits,
                                                          self.run_log, cache=self.cache, readable=self.readable)
                        self.start_kind = "warm"
                    except OSError as e:  # the run starts cold, as it would without a warm server
                        self.run_log.write(f"labkit: no warm start ({e}); the kernel starts cold\n".encode())
                if self.sandboxed is None:
                    cache_ro, cache_rw = self.cache.binds() if self.cache else ((), ())
                    self.sandboxed = launch(cmd, self.run_dir, self.run_env, self.run_log, self.run_limits,
                                            join=self.network() if self.network else None,
                                            extra_ro=(*self.readable, *cache_ro), extra_rw=cache_rw)
                    self.start_kind = "cold"
            finally:
                self.started.set()
            self.provisioner.process = _KernelProcess(self.sandboxed)
            self.provisioner.pid = self.provisioner.pgid = self.sandboxed.pid
            self._reconcile_connection_info(self.provisioner.connection_info)
            self.ip = str(self.link_dir / "w" / "kernel")

        def stop_kernel(self) -> None:
            """End the kernel and everything it started, at once (from any thread): papermill then returns."""
            if self.sandboxed is not None:
                self.sandboxed.kill()
                kill_tree(self.sandboxed.pid)

        def end(self) -> None:
            """Stop the kernel, wait for it, and remove what the run's sockets left (papermill's thread, once done)."""
            if self.ended:
                return
            self.ended = True
            _LIVE_KERNELS.discard(self)
            self.stop_kernel()
            if self.sandboxed is not None:
                self.sandboxed.wait()
            for kc in self.clients:
                with contextlib.suppress(Exception):
                    kc.stop_channels()
            self.client_context.destroy(linger=0)
            with contextlib.suppress(Exception):
                self._close_control_socket()
            self.context.destroy(linger=0)
            shutil.rmtree(self.link_dir, ignore_errors=True)  # the kit's own folder (the link in it is not followed)

    _SandboxedKernelManager = SandboxedKernelManager
    return SandboxedKernelManager


_SandboxedKernelManager = None
_LIVE_KERNELS: set = set()  # the kernels of runs going on now


def _engine() -> str:
    """papermill's engine for the kit's runs (registered on first use): its notebook client caps the outputs kept."""
    global _ENGINE_READY
    if _ENGINE_READY:
        return ENGINE
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.log import logger

    class CappedClient(PapermillNotebookClient):
        """Keeps at most `output_limit` bytes of cell outputs; a note says where they were cut.

        Errors are always kept (shortened), so that a cell that raised is still reported.
        """

        def __init__(self, nb_man, output_limit: int, **kw):
            super().__init__(nb_man, **kw)
            self.output_limit, self.output_kept, self.output_cut = output_limit, 0, False

        def output(self, outs, msg, display_id, cell_index):
            content = msg.get("content", {})
            if msg.get("msg_type") == "error":
                content["traceback"] = list(content.get("traceback", []))[-20:]
                content["evalue"] = str(content.get("evalue", ""))[:2000]
                return super().output(outs, msg, display_id, cell_index)
            size = len(json.dumps(content, default=str))
            note = f"\n[labkit: output cut here: the run's outputs passed {sandbox.format_size(self.output_limit)}]\n"
            room = self.output_limit - self.output_kept
            if size > room and not self.output_cut:
                self.output_cut = True
                if msg.get("msg_type") == "stream" and room > 1000:  # the start of a long stream is kept
                    content["text"] = str(content.get("text", ""))[:room - 1000] + note
                    size = room
                else:
                    outs.append(nbformat.v4.new_output("stream", name="stderr", text=note.lstrip("\n")))
                    return None
            elif size > room:
                return None
            self.output_kept += size
            return super().output(outs, msg, display_id, cell_index)

        async def _check_raise_for_error(self, cell, cell_index, exec_reply):
            # exit() in a cell stops the kernel a moment later, while the next cells may still be sent: end it
            # now, so that a notebook that asks to exit always ends the same way, whatever the machine's load.
            payload = ((exec_reply or {}).get("content") or {}).get("payload") or []
            if hasattr(self.km, "stop_kernel") and any(
                    p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payload):
                self.km.asked_to_exit = True
                self.km.stop_kernel()
            return await super()._check_raise_for_error(cell, cell_index, exec_reply)

    class Engine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None, stderr_file=None,
                                     start_timeout=60, execution_timeout=None, **kwargs):
            kwargs.pop("input_path", None)
            return CappedClient(nb_man, kernel_name=kernel_name, timeout=execution_timeout, startup_timeout=start_timeout,
                                log=logger, log_output=log_output, stdout_file=stdout_file, stderr_file=stderr_file,
                                **kwargs).execute()

    papermill_engines.register(ENGINE, Engine)
    _ENGINE_READY = True
    return ENGINE


ENGINE, _ENGINE_READY = "labkit", False


def largest_message(limits: Limits) -> int:
    """The largest message from a kernel this process accepts: a larger one ends the run's output (memory safety)."""
    return max(4 * limits.output, 64 << 20)
_PAPERMILL_LOCK = threading.Lock()


DISK_POLL = 0.2  # seconds between two measures of what a run holds on disk


def _watch_disk(folder: Path, allowed: int, ran: KernelRun, stop, done: threading.Event, pids=list) -> None:
    """While the run goes on, measure its scratch folder every DISK_POLL seconds (or four times as long as the last
    measure took, when longer: the kit's other runs share this process); past `allowed` bytes, stop the run,
    `ran.disk` saying why. Files the run removed but still holds open count too (`pids()`: the run's processes).

    Between two measures a run may write past the limit what the disk takes in that time (each file at most
    `allowed` bytes: RLIMIT_FSIZE, see `sandbox.run_rlimits`); the run is measured once more when it has ended."""
    pause = DISK_POLL
    while not done.wait(pause):
        began = time.monotonic()
        if _measure_disk(folder, allowed, ran, pids()):
            stop()
            return
        pause = max(DISK_POLL, 4 * (time.monotonic() - began))  # a folder of many names is measured less often


def _measure_disk(folder: Path, allowed: int, ran: KernelRun, pids: list[int] = ()) -> bool:
    """Whether the run's scratch folder, with the removed files its processes `pids` hold open, takes more than
    `allowed` bytes (`scratch.usage`, `processes.held_after_removal`); if so, `ran.disk` says it."""
    from labkit import processes

    try:
        used = scratch.usage(folder, allowed)
        if used <= allowed and pids:
            used += processes.held_after_removal(pids, os.stat(folder).st_dev)
    except scratch.Refused as e:
        ran.disk = f"the notebook's files could not be measured ({e}), so the run was stopped"
        return True
    except OSError:
        return False  # the folder is gone: the run is over
    if used <= allowed:
        return False
    ran.disk = f"the notebook wrote more than {sandbox.format_size(allowed)} to disk, so the run was stopped"
    return True


def _run_processes_of(km) -> list[int]:
    """The processes of the run whose kernel `km` started (none before it has started)."""
    run = km.sandboxed
    return [run.pid, *sandbox.descendants(run.pid)] if run is not None else []


def _papermill(input_path: Path, output_path: Path, folders: scratch.RunFolders, env: dict, limits: Limits, key: str,
               timeout: float, log_name: str = "run.log", network=None, kernels: list | None = None,
               warm=None, cache=None) -> KernelRun:
    """Execute `input_path` into `output_path` with papermill, on a sandboxed kernel working in `workdir`.

    Every cell runs even after one raised. The kernel reads the run's key from a file only it
    may read (`seal`), which it removes before the first cell; after `timeout` seconds, or when
    the notebook is done, the kernel and everything it started are ended. papermill's output and
    the run's log are in the kit folder; the kernel works in the scratch folder (`folders`).
    """
    with _PAPERMILL_LOCK:  # the first use imports papermill and registers the engine, once
        import papermill
        from papermill.exceptions import PapermillExecutionError

        engine = _engine()
    from nbclient.exceptions import DeadKernelError

    workdir = folders.scratch
    key_file = scratch.create(workdir, f".labkit-key-{secrets.token_hex(8)}.json", json.dumps(
        {"key": key, "calls": str(folders.kit / "calls.json"), "results": str(workdir / "results.json"),
         "output": limits.output}).encode())
    seal = ["import labkit.harness", f"labkit.harness.seal({str(key_file)!r})", "del labkit"]
    if cache is not None:
        from labkit import jaxcache

        seal.insert(0, jaxcache.QUIET)
    ran = KernelRun()
    start = time.monotonic()
    with open(folders.kit / log_name, "wb") as log:
        km = _kernel_manager_class()(kernel_name="python3")
        km.setup(workdir, env, limits, log, seal, network, warm, cache, readable=folders.kit)
        if kernels is not None:
            kernels.append(km)
        watchdog = threading.Timer(timeout, lambda: (setattr(ran, "timed_out", True), km.stop_kernel()))
        watchdog.daemon = True
        watchdog.start()
        done = threading.Event()
        disk = threading.Thread(target=_watch_disk, args=(workdir, limits.disk, ran, km.stop_kernel, done,
                                                          lambda: _run_processes_of(km)),
                                name="labkit-disk", daemon=True)
        disk.start()
        try:
            papermill.execute_notebook(
                str(input_path), str(output_path), kernel_name="python3", progress_bar=False, km=km,
                engine_name=engine, allow_errors=True, execution_timeout=max(1, int(timeout)),
                start_timeout=max(1, int(timeout)), output_limit=limits.output)
        except PapermillExecutionError:
            pass  # the student's cells raised; the harness cell still ran, and the errors are in the output
        except DeadKernelError:
            ran.died = not ran.timed_out
        except Exception as e:  # noqa: BLE001 - whatever stopped papermill, the run reports it
            if not ran.timed_out:
                ran.died = km.sandboxed is not None and km.sandboxed.poll() is not None
                ran.failure = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                if type(e).__name__ == "CellTimeoutError" and not ran.died:
                    # the cell ended but its outputs stopped arriving: a message over the size the kit accepts
                    ran.failure = (f"the cells' output stopped reaching the kit: a single output larger than "
                                   f"{sandbox.format_size(largest_message(limits))} is refused, and the rest of the "
                                   "run with it")
        finally:
            watchdog.cancel()
            done.set()
            disk.join()
            km.end()
    if not ran.disk:  # once more, now that nothing of the run is left: what it wrote after the last measure
        _measure_disk(workdir, limits.disk, ran)
    if ran.disk:
        ran.died, ran.failure = True, ran.disk
    elif km.asked_to_exit and not ran.timed_out:
        ran.died, ran.failure = True, "a cell asked it to exit (exit() or quit()), so the cells after it never ran"
    scratch.unlink(workdir, key_file.name)
    ran.seconds = time.monotonic() - start
    ran.returncode = km.sandboxed.returncode if km.sandboxed is not None else None
    ran.isolation = km.sandboxed.isolation if km.sandboxed is not None else sandbox.isolation()[0]
    ran.start = km.start_kind
    ran.cpu_share = km.sandboxed.cpu_share if km.sandboxed is not None else ""
    return ran


# ----------------------------------------------------------------------------------------
# A run of several JAX processes.
# ----------------------------------------------------------------------------------------

def _run_processes(nb: nbformat.NotebookNode, config: DeviceConfig, calls: list[dict], workdir: Path,
                   timeout: float, limits: Limits | None = None) -> RunRecord:
    """A run of `config.processes` JAX processes, each a kernel running the notebook, joined on a free localhost port.

    Process i works in `workdir/process-i/`; the run's results are process 0's, and every
    process's results are kept in `RunRecord.processes`. A process whose kernel ends early stops
    the run: its peers would wait for it in a collective until the timeout, so they get
    PEER_GRACE seconds to finish, then are ended. However it ends, no process outlives the run.
    """
    coordinator = f"127.0.0.1:{free_port()}"
    dirs = [workdir / f"process-{i}" for i in range(config.processes)]
    limits, key = limits or DEFAULT_LIMITS, new_key()
    runs: list[KernelRun | None] = [None] * config.processes
    stop = threading.Event()
    start = time.monotonic()

    first: list = []  # process 0's kernel manager: the others join its private network

    def network() -> dict[str, str] | None:
        deadline = time.monotonic() + timeout
        while not first and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.02)
        if not first or not first[0].started.wait(max(0.0, deadline - time.monotonic())) or not first[0].sandboxed:
            return None
        return sandbox.network_of(first[0].sandboxed)

    def one(i: int) -> None:
        input_path = prepare(nb, dirs[i], calls, first=JOIN_CELL)
        env = (config.environment() | {"LABKIT_RUN": config.name, "LABKIT_JOIN_TIMEOUT": str(int(min(60, timeout)))}
               | config.process_env(i, coordinator))
        runs[i] = _papermill(input_path, dirs[i] / "executed.ipynb", scratch.RunFolders(dirs[i]), env, limits, key, timeout,
                             network=network if i else None, kernels=first if i == 0 else None)
        if runs[i].died or runs[i].failure:
            stop.set()

    threads = [threading.Thread(target=one, args=(i,), name=f"labkit-process-{i}", daemon=True)
               for i in range(config.processes)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout + PEER_GRACE
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.05)
    failed = next((i for i, r in enumerate(runs) if r is not None and (r.died or r.failure)), None)
    if failed is not None:  # the others get a grace period, then their timeout is cut short
        grace = time.monotonic() + PEER_GRACE
        while any(t.is_alive() for t in threads) and time.monotonic() < grace:
            time.sleep(0.05)
        for i, thread in enumerate(threads):
            if thread.is_alive():
                _end_kernels_in(dirs[i])
    for thread in threads:
        thread.join()
    if failed is not None:  # a peer may be seen to end first (its collectives abort once a process is gone): a
        failed = next((i for i, r in enumerate(runs) if r is not None and r.disk), failed)  # stop for the disk is why
    seconds = time.monotonic() - start
    cell_errors, last_started = _cell_errors(dirs[0] / "executed.ipynb")
    record = RunRecord(config.name, "ok", seconds=round(seconds, 2), cell_errors=cell_errors, workdir=str(workdir),
                       isolation=next((r.isolation for r in runs if r), ""), limits=limits.to_json(), start="cold",
                       cpu_share=next((r.cpu_share for r in runs if r), ""))
    refused = []
    for i, (run, pdir) in enumerate(zip(runs, dirs)):
        results = scratch.RunFolders(pdir).scratch
        payload = _read_payload(results / "results.json", key)
        if payload is None and scratch.is_file(results, "results.json"):
            refused.append(i)
        record.processes.append({"process": i, "exit": run.returncode if run else None, "coordinator": coordinator,
                                 "environment": payload[0] if payload else {},
                                 "results": payload[1] if payload else {}})
    of = f"of {config.processes}"
    if failed is not None:
        record.status = "error"
        why = _why_no_results(dirs[failed] / "run.log", runs[failed])
        record.message = f"process {failed} {of} stopped early, so the others were ended too: {why}"
        return record
    if any(r is None or r.timed_out for r in runs):
        record.status = "timeout"
        where = f" (process 0 still running cell {last_started})" if last_started is not None else ""
        record.message = f"the notebook did not finish within {timeout:g} s on all {config.processes} processes{where}"
        return record
    missing = [i for i, p in enumerate(record.processes)
               if not p["results"] and not scratch.is_file(scratch.RunFolders(dirs[i]).scratch, "results.json")]
    if missing:
        record.status = "error"
        record.message = (f"process {missing[0]} {of} stopped before its functions could be called: "
                          + _why_no_results(dirs[missing[0]] / "run.log", runs[missing[0]]))
        return record
    if refused:
        record.status = "error"
        record.message = f"process {refused[0]} {of}: {FORGED}"
        return record
    record.environment = record.processes[0]["environment"]
    record.results = record.processes[0]["results"]
    record.judged_by = "reported"  # each process's own report: see labkit.verify
    return record


def _end_kernels_in(folder: Path) -> None:
    """End the kernel working in `folder` (a peer of a process that failed): its papermill then returns."""
    for km in list(_LIVE_KERNELS):
        if Path(km.run_dir) == scratch.RunFolders(folder).scratch:
            km.stop_kernel()


def _why_no_results(log_path: Path, ran: KernelRun) -> str:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    joined = [ln for ln in text.splitlines() if ln.startswith("labkit: process ")]
    if joined:
        return joined[-1].removeprefix("labkit: ")
    returncode = ran.returncode
    if ran.disk:
        return ran.disk
    if ran.died and ran.failure:
        return f"the Python kernel died while running the notebook: {ran.failure}"
    if ran.died:
        if returncode is not None and (returncode < 0 or returncode > 128):
            signum = -returncode if returncode < 0 else returncode - 128
            return f"the Python kernel died while running the notebook (killed by signal {signum}: a crash, or out of memory)"
        return "the Python kernel died while running the notebook (a crash, or out of memory)"
    if ran.failure:
        return f"the notebook stopped before its functions could be called: {ran.failure}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tail = lines[-1][:300] if lines else f"exit status {returncode}"
    return f"the notebook stopped before its functions could be called: {tail}"
