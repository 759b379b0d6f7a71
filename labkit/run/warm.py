"""Warm starts: a server that has imported what every run imports, and forks each run's kernel.

Most of a short notebook run is fixed start-up: a Python interpreter, importing JAX, numpy,
IPython (and Flax, for the labs that use it), starting a Jupyter kernel. None of it depends on
the student. A warm server pays it once per grading run: it starts in a bubblewrap sandbox of
its own (`sandbox.launch`: read-only system and environment, no network, its own process ids, no
capabilities), imports those modules without starting any JAX backend, and then, for each run,
forks a child that:

1. reports to the kit (which moves it into the run's own cgroups, as a cold run's first step
   does itself) and sets the run's resource limits;
2. makes the run's own sandbox inside the server's (`labkit.run.nest`): new user, mount, network,
   IPC and process-id namespaces, only the run's scratch folder visible of the grading output,
   a private `/tmp`, its own `/proc`, then no capability at all, and no new session
   (`labkit.run.sessions`: the run keeps the one scheduling group the child's `setsid` made);
3. starts the Jupyter kernel there, with the run's environment. The device count and the other
   `JAX_*` settings are read when JAX starts its backend, which no process did before: one server
   serves cpu-1 and cpu-8 alike.

The server never runs a student's code, and holds nothing of one run that another could reach:
a run's child keeps none of the server's descriptors, sees no other run's files, processes or
sockets, and shares only the read-only pages of the imported modules. Where the kernel does not
let the server make namespaces of its own (`probe`), the kit starts every run cold, as before.

The kit's side is `Server` (start, `launch` a kernel, stop); `WarmRun` is a launched kernel,
used like `sandbox.Sandboxed`. The server itself is `labkit.run.warmserver`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from labkit import envnames
from labkit.run import cgroup, modes, mounts, sessions
from labkit.run.warmserver import FOR_SOME_LABS, MODULES, READY, UNAVAILABLE

START_TIMEOUT = 120.0  # seconds the server may take to import and probe


def environment_for(configs) -> dict[str, str] | None:
    """The environment a warm server starts with for runs on `configs`, or None where none of them is one it forks
    (a one-process CPU configuration that can run here: a compile-only TPU one needs libtpu). Each run's device
    count is its own, set in the forked child."""
    forked = [c for c in configs if c.platform == "cpu" and c.processes == 1 and c.availability()[0]]
    if not forked:
        return None
    return {k: v for k, v in forked[0].environment().items() if k != "JAX_NUM_CPU_DEVICES"}


# ----------------------------------------------------------------------------------------
# The kit's side.
# ----------------------------------------------------------------------------------------


class WarmRun:
    """A kernel forked by the server, seen like `sandbox.Sandboxed`: `pid`, `poll()`, `wait()`, `kill()`."""

    isolation, reason, cpu_share = "bubblewrap", "", "none"

    def __init__(self, conn: socket.socket, pid: int, cgroups: list[Path], drain, limits, token: str):
        self.conn, self.pid, self.cgroups, self.drain, self.limits, self.token = (
            conn,
            pid,
            cgroups,
            drain,
            limits,
            token,
        )
        self.returncode: int | None = None
        self._finished = False
        self._lock = threading.Lock()

    @property
    def output_cut(self) -> bool:
        return bool(self.drain and self.drain.seen > self.drain.cap)

    def _read_exit(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            ready, _, _ = select.select([self.conn], [], [], timeout)
            if not ready:
                return None
            data = b""
            try:
                data = self.conn.recv(256)
            except OSError:
                pass
            try:
                self.returncode = int(json.loads(data.decode().strip().splitlines()[0])["exit"])
            except (ValueError, KeyError, IndexError, TypeError):
                self.returncode = -9  # the server went away: the run is over
        self._finish()
        return self.returncode

    def poll(self):
        return self._read_exit(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_exit(timeout)
        if code is None:
            import subprocess

            raise subprocess.TimeoutExpired("warm kernel", timeout)
        return code

    def kill(self) -> None:
        # -1 (a child that never reported its pid) is no process: kill(-1) would signal every process the kit may
        for target in (self.pid,) if self.pid > 0 else ():
            try:
                os.killpg(target, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.conn.sendall(b"kill\n")
        except OSError:
            pass
        self._end_rest()

    def _end_rest(self) -> None:
        from labkit.run import processes

        processes.kill(processes.marked(self.token) if self.token else [])
        for group in self.cgroups:
            cgroup.remove_cgroup(group)

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._end_rest()
        try:
            self.conn.close()
        except OSError:
            pass
        if self.drain is not None:
            self.drain.join(timeout=10)


class Server:
    """One warm server for a grading run: `start()`, then `launch(...)` per run, `stop()` at the end.

    `roots` are the folders the runs' scratch folders lie in (the grading output); the server's
    sandbox may write there, each run's sees its own folder only. `available` is False, with
    `why`, when the server could not start or cannot make a run's sandbox here.
    """

    def __init__(
        self, roots: list[Path], env: dict[str, str], folder: Path, shared: list[Path] = (), labs: list = ()
    ):
        """`shared`: more folders its runs may see (a compilation cache), each run read-only unless it fills it.
        `labs`: the labs its runs are of (`catalog.Lab`): what only some labs import is imported for theirs."""
        self.roots = [Path(r).resolve() for r in roots]
        self.packages = [p for p in FOR_SOME_LABS if any(lab.uses(p) for lab in labs)]
        self.shared = [Path(p).resolve() for p in shared]
        self.env, self.folder = env, Path(folder).absolute()  # a socket path bound in another folder
        self.available, self.why = False, "not started"
        self.process = None
        self.user: int | None = None
        self.limits = None  # the server's own limits, once begun: a forked run can have no more
        self._log = None
        self._lock = threading.Lock()
        self._began = 0.0

    @property
    def socket_path(self) -> Path:
        return self.folder / "server.sock"

    def start(self, limits) -> bool:
        """Start the server and wait until it is ready; False (and `why`) where no warm start can be had."""
        return self.begin(limits) and self.ready()

    def begin(self, limits) -> bool:
        """Start the server without waiting for it (`ready` waits); False (and `why`) where none can be started."""
        from dataclasses import replace

        from labkit.run import runusers, sandbox

        kind, reason = modes.isolation(limits.isolation)
        if kind != modes.BUBBLEWRAP:
            self.why = f"no sandbox ({reason or kind})"
            return False
        if os.geteuid() == 0 and not cgroup.pids_cgroups_available():
            # without a pids cgroup per run, each run needs a user of its own for RLIMIT_NPROC: cold starts do that
            self.why = "root without a pids cgroup: each run starts as a user of its own"
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        for (
            root
        ) in self.roots:  # bound into the server's sandbox, so they must exist (OUT/work before any run)
            root.mkdir(parents=True, exist_ok=True)
        for stale in (self.socket_path, self.folder / "server.status"):  # a server of an earlier run's
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        spec = {
            "roots": [str(r) for r in self.roots],
            "socket": str(self.socket_path),
            "packages": self.packages,
        }
        if os.geteuid() == 0:
            # The server's sandbox is an unprivileged user's (a user namespace of its own), as on any machine
            # where the kit does not run as root; its runs' scratch folders are handed to that user.
            self.user = runusers.run_user()
            runusers.hand_over(self.folder, self.user)
            for folder in self.shared:  # its runs that fill it write there as that user
                os.chown(folder, self.user, self.user)
            for root in self.roots:
                mode = root.stat().st_mode
                if not mode & 0o001:  # that user passes through it to the runs' folders (it may not list it)
                    root.chmod(mode | 0o001)
        self._log = open(self.folder / "server.log", "wb")  # noqa: SIM115 - open while the server runs
        server_limits = replace(
            limits, memory=max(limits.memory, 8 << 30), processes=max(limits.processes, 4096)
        )
        self.limits = server_limits
        self.process = sandbox.launch(
            [sys.executable, "-m", "labkit.run.warmserver", json.dumps(spec)],
            sandbox.RunContext(
                self.folder,
                self.env,
                self._log,
                server_limits,
                reach=sandbox.Reach(write=(*self.roots, *self.shared)),
                server=sandbox.ServerStart(self.user),
            ),
        )
        self._began = time.monotonic()
        return True

    def ready(self) -> bool:
        """Wait until the server begun is ready to fork runs (True), or has failed (False, and `why`)."""
        with self._lock:
            if self.available or self.process is None:
                return self.available
            return self._wait_ready()

    def _wait_ready(self) -> bool:
        deadline = self._began + START_TIMEOUT
        status = self.folder / "server.status"
        while time.monotonic() < deadline:
            if status.exists():
                line = status.read_text().strip()
                if line == READY:
                    self.available, self.why = True, ""
                    return True
                if line:
                    self.why = line.removeprefix(UNAVAILABLE + ": ")
                    break
            if self.process.poll() is not None:
                tail = (self.folder / "server.log").read_text(errors="replace").strip().splitlines()[-1:]
                self.why = f"the server stopped ({tail[0][:200] if tail else 'no output'})"
                break
            time.sleep(0.05)
        else:
            self.why = f"the server was not ready within {START_TIMEOUT:g} s"
        self._stop()
        return False

    def launch(
        self,
        argv: list[str],
        workdir: Path,
        env: dict[str, str],
        limits,
        log,
        cache=None,
        readable: tuple = (),
        module: str | None = None,
    ) -> WarmRun:
        """Fork a kernel (`ipykernel_launcher` with `argv`) for one run working in `workdir`; OSError if not.

        `readable`: the run's kit folder (at most one), which holds `workdir` and which the run sees read-only.
        `module`: instead of a kernel, one of the kit's own programs (`MODULES`: the verifier) with `argv`."""
        if module is not None and module not in MODULES:
            raise OSError(f"the warm server runs no module {module!r}")
        from labkit.run import runusers

        if not self.ready():
            raise OSError(f"no warm server: {self.why}")
        if self.limits is not None and (
            limits.memory > self.limits.memory or limits.processes > self.limits.processes
        ):
            # a forked run's limits can only be lowered from the server's (v5e-256's raised ones: see configs.least_for)
            raise OSError("the run's limits are above the warm server's own")
        workdir = Path(workdir).resolve()
        if not any(workdir.is_relative_to(r) for r in self.roots):
            raise OSError(f"{workdir} is not in the warm server's folders")
        if self.user is not None and not runusers.hand_over(workdir, self.user):
            raise OSError(f"{workdir} could not be handed to the run's user")
        try:
            return self._launch(argv, workdir, env, limits, log, cache, readable, module)
        except OSError:
            if self.user is not None:  # the cold start that follows is this process's own user's
                runusers.hand_over(workdir, os.geteuid())
            raise

    def _launch(
        self,
        argv: list[str],
        workdir: Path,
        env: dict[str, str],
        limits,
        log,
        cache=None,
        readable: tuple = (),
        module: str | None = None,
    ) -> WarmRun:
        from labkit.run import sandbox

        if cache is not None and Path(cache.folder).resolve() not in self.shared:
            raise OSError(f"the compilation cache {cache.folder} is not the warm server's")
        token = os.urandom(16).hex()
        cgroups = cgroup.make_cgroups(limits)
        request = self._request(argv, workdir, env, limits, cache, readable, module, token, cgroups)
        conn, read_end, ours = self._send(request, cgroups)
        drain = sandbox.Drain(os.fdopen(read_end, "rb", buffering=0), log, limits.output)
        drain.start()
        return _handshake(conn, ours, cgroups, drain, limits, token)

    def _request(
        self, argv, workdir: Path, env: dict[str, str], limits, cache, readable, module, token, cgroups
    ) -> dict:
        """What the server's child is told of its run: its command, folders, environment and limits."""
        from labkit.run import sandbox

        run_env = mounts.run_environment(env, workdir, sandboxed=True) | {envnames.RUN_TOKEN: token}
        rlimits = sandbox.run_rlimits(env, limits)
        if not cgroup.counts_processes(cgroups):
            from labkit.run import processes

            rlimits["NPROC"] = processes.user_tasks() + limits.processes
        shared = {
            str(p): bool(cache is not None and cache.writable and Path(cache.folder).resolve() == p)
            for p in self.shared
        }
        return {
            "argv": argv,
            "workdir": str(workdir),
            "env": run_env,
            "rlimits": rlimits,
            "shared": shared,
            "readable": str(Path(readable[0]).resolve()) if readable else None,
            "module": module,
            "tmp_size": limits.disk,
        }

    def _send(self, request: dict, cgroups: list[Path]) -> tuple[socket.socket, int, socket.socket]:
        """Send the request with the run's output pipe and a socket for its hello; (connection, the pipe's read
        end, our end of that socket). OSError, with the run's cgroups removed, where the server cannot be told."""
        read_end, write_end = os.pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(self.socket_path))
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [write_end, theirs.fileno()])
        except OSError:
            conn.close()
            ours.close()
            for g in cgroups:
                cgroup.remove_cgroup(g)
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
            theirs.close()
        return conn, read_end, ours

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
            # its socket goes with it: a copy of the grading output (`cp -r OUT`) cannot copy a socket
            self.socket_path.unlink(missing_ok=True)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.available = False


def _handshake(
    conn: socket.socket, ours: socket.socket, cgroups: list[Path], drain, limits, token: str
) -> WarmRun:
    """The run, once its child has said its pid and been moved into the run's cgroups; OSError, with the child
    ended, where it never reports or cannot be moved."""
    pid = _hello(ours, timeout=60)
    run = WarmRun(conn, pid or -1, cgroups, drain, limits, token)
    run.cpu_share = cgroup.share_of(
        cgroups, sessions.available()
    )  # its init applies the filter (`warmserver._init`)
    if pid is None:
        ours.close()
        run.kill()
        with contextlib.suppress(Exception):
            run.wait(10)
        raise OSError("the warm server's child did not report")
    try:
        for group in cgroups:
            (group / "cgroup.procs").write_text(str(pid))
        ours.sendall(b"go\n")
    except OSError:
        run.kill()
        raise
    finally:
        ours.close()
    return run


def _hello(sock: socket.socket, timeout: float) -> int | None:
    """The pid (in this process's namespace) of the child that says hello on `sock`, from the kernel's credentials."""
    sock.settimeout(timeout)
    try:
        data, ancillary, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(12))
    except OSError:
        return None
    if not data.startswith(b"hello"):
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int.from_bytes(payload[:4], sys.byteorder, signed=True)
    return None
