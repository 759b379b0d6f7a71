"""One kernel: papermill in the kit's own process, the student's Jupyter kernel in a sandbox, Unix sockets
in between.

`papermill_run` runs a prepared notebook with a kernel started through `sandbox.launch` (or forked by the
warm server), under the run's limits; a thread measures what the run holds on disk and stops it past its
allowance. It returns a `KernelRun`: how the kernel ended, never what the notebook computed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from labkit.judge import harness
from labkit.run import allowance, modes, processes, sandbox, scratch
from labkit.run.allowance import DEFAULT_LIMITS, Limits
from labkit.statuses import Start


def launch(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    log,
    limits: Limits | None = None,
    key: str | None = None,
    join: dict[str, str] | None = None,
    extra_ro: tuple = (),
    extra_rw: tuple = (),
) -> sandbox.Sandboxed:
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
    return sandbox.launch(
        cmd,
        cwd,
        env,
        limits,
        log=log,
        stdin=(key + "\n").encode() if key else None,
        join=join,
        extra_ro=extra_ro,
        extra_rw=extra_rw,
    )


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

        def setup(
            self,
            workdir: Path,
            env: dict,
            limits: Limits,
            log,
            seal: list[str],
            network=None,
            warm=None,
            cache=None,
            readable: Path | None = None,
        ) -> None:
            """`network`, when given, is called at launch for the namespaces to join (`sandbox.network_of`);
            `warm`, a `warm.Server`, forks the kernel instead of starting one."""
            self.run_dir, self.run_env, self.run_limits, self.run_log, self.seal_args = (
                workdir,
                env,
                limits,
                log,
                seal,
            )
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
            self.clients.append(
                kc
            )  # papermill's client does not stop its channels for a kernel it did not start
            return kc

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            # What the cells write to the process's own descriptors (os.write, C libraries) goes to the
            # run's log, which the sandbox cuts; what they print goes to the notebook, which the kernel cuts.
            cmd = [
                *kernel_cmd,
                "--IPKernelApp.capture_fd_output=False",
                "--IPKernelApp.exec_lines=" + json.dumps(self.seal_args),
            ]
            try:
                if self.warm is not None and self.network is None and "ipykernel_launcher" in cmd:
                    try:
                        argv = cmd[cmd.index("ipykernel_launcher") + 1 :]
                        self.sandboxed = self.warm.launch(
                            argv,
                            self.run_dir,
                            self.run_env,
                            self.run_limits,
                            self.run_log,
                            cache=self.cache,
                            readable=self.readable,
                        )
                        self.start_kind = Start.WARM
                    except OSError as e:  # the run starts cold, as it would without a warm server
                        self.run_log.write(f"labkit: no warm start ({e}); the kernel starts cold\n".encode())
                if self.sandboxed is None:
                    cache_ro, cache_rw = self.cache.binds() if self.cache else ((), ())
                    self.sandboxed = launch(
                        cmd,
                        self.run_dir,
                        self.run_env,
                        self.run_log,
                        self.run_limits,
                        join=self.network() if self.network else None,
                        extra_ro=(*self.readable, *cache_ro),
                        extra_rw=cache_rw,
                    )
                    self.start_kind = Start.COLD
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
                processes.kill_tree(self.sandboxed.pid)

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
            shutil.rmtree(
                self.link_dir, ignore_errors=True
            )  # the kit's own folder (the link in it is not followed)

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
            note = f"\n[labkit: output cut here: the run's outputs passed {allowance.format_size(self.output_limit)}]\n"
            room = self.output_limit - self.output_kept
            if size > room and not self.output_cut:
                self.output_cut = True
                if msg.get("msg_type") == "stream" and room > 1000:  # the start of a long stream is kept
                    content["text"] = str(content.get("text", ""))[: room - 1000] + note
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
                p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payload
            ):
                self.km.asked_to_exit = True
                self.km.stop_kernel()
            return await super()._check_raise_for_error(cell, cell_index, exec_reply)

    class Engine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(
            cls,
            nb_man,
            kernel_name,
            log_output=False,
            stdout_file=None,
            stderr_file=None,
            start_timeout=60,
            execution_timeout=None,
            **kwargs,
        ):
            kwargs.pop("input_path", None)
            # papermill writes the whole notebook before and after every cell (two thirds of the trusted side's
            # time in a grading run); the kit reads it only when the run is over, so it is written once, by
            # papermill's own `notebook_complete`, which runs however the execution ends
            path, nb_man.output_path = nb_man.output_path, None
            try:
                return CappedClient(
                    nb_man,
                    kernel_name=kernel_name,
                    timeout=execution_timeout,
                    startup_timeout=start_timeout,
                    log=logger,
                    log_output=log_output,
                    stdout_file=stdout_file,
                    stderr_file=stderr_file,
                    **kwargs,
                ).execute()
            finally:
                nb_man.output_path = path

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
        pause = max(
            DISK_POLL, 4 * (time.monotonic() - began)
        )  # a folder of many names is measured less often


def _measure_disk(folder: Path, allowed: int, ran: KernelRun, pids: list[int] = ()) -> bool:
    """Whether the run's scratch folder, with the removed files its processes `pids` hold open, takes more than
    `allowed` bytes (`scratch.usage`, `processes.held_after_removal`); if so, `ran.disk` says it."""
    from labkit.run import processes

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
    ran.disk = (
        f"the notebook wrote more than {allowance.format_size(allowed)} to disk, so the run was stopped"
    )
    return True


def _run_processes_of(km) -> list[int]:
    """The processes of the run whose kernel `km` started (none before it has started)."""
    run = km.sandboxed
    return [run.pid, *sandbox.descendants(run.pid)] if run is not None else []


def papermill_run(
    input_path: Path,
    output_path: Path,
    folders: scratch.RunFolders,
    env: dict,
    limits: Limits,
    key: str,
    timeout: float,
    log_name: str = "run.log",
    network=None,
    kernels: list | None = None,
    warm=None,
    cache=None,
) -> KernelRun:
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
    key_file = scratch.create(
        workdir,
        f".labkit-key-{secrets.token_hex(8)}.json",
        json.dumps(
            {
                "key": key,
                "calls": str(folders.kit / "calls.json"),
                "results": str(workdir / "results.json"),
                "output": limits.output,
            }
        ).encode(),
    )
    seal = ["import labkit.judge.harness", f"labkit.judge.harness.seal({str(key_file)!r})", "del labkit"]
    if cache is not None:
        from labkit.run import jaxcache

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
        disk = threading.Thread(
            target=_watch_disk,
            args=(workdir, limits.disk, ran, km.stop_kernel, done, lambda: _run_processes_of(km)),
            name="labkit-disk",
            daemon=True,
        )
        disk.start()
        try:
            papermill.execute_notebook(
                str(input_path),
                str(output_path),
                kernel_name="python3",
                progress_bar=False,
                km=km,
                engine_name=engine,
                allow_errors=True,
                execution_timeout=max(1, int(timeout)),
                start_timeout=max(1, int(timeout)),
                output_limit=limits.output,
            )
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
                    ran.failure = (
                        f"the cells' output stopped reaching the kit: a single output larger than "
                        f"{allowance.format_size(largest_message(limits))} is refused, and the rest of the "
                        "run with it"
                    )
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
        ran.died, ran.failure = (
            True,
            "a cell asked it to exit (exit() or quit()), so the cells after it never ran",
        )
    scratch.unlink(workdir, key_file.name)
    ran.seconds = time.monotonic() - start
    ran.returncode = km.sandboxed.returncode if km.sandboxed is not None else None
    ran.isolation = km.sandboxed.isolation if km.sandboxed is not None else modes.isolation()[0]
    ran.start = km.start_kind
    ran.cpu_share = km.sandboxed.cpu_share if km.sandboxed is not None else ""
    return ran


def end_kernels_in(folder: Path) -> None:
    """End the kernel working in `folder` (a peer of a process that failed): its papermill then returns."""
    for km in list(_LIVE_KERNELS):
        if Path(km.run_dir) == scratch.RunFolders(folder).scratch:
            km.stop_kernel()
