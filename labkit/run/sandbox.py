"""Isolation and limits for a notebook run: a student's notebook is untrusted code.

`launch(cmd, RunContext(workdir, env, log, limits))` starts one process of a run and returns a
`Sandboxed` handle (a `subprocess.Popen` look-alike). Every process the kit starts for a
notebook goes through it, whatever the configuration.

Where bubblewrap (`bwrap`) can make a sandbox, the process and everything it starts run in
one, with fresh namespaces (no network, its own process ids, no capabilities) and a file
system made only of what a run needs: the system folders and the kit's Python
environment read-only, a private `/tmp`, and one writable folder, the run's own `workdir`.
`reference/`, the hidden tests, other students' submissions and runs, the scoreboard and
the home folders are simply not there. When the run's first process ends, bubblewrap ends
every other one (a pid namespace): nothing a notebook starts outlives its run.

Which bwrap, and why none works, is `labkit.run.bwrap`'s (and `labkit.run.refusals`') to find.
What happens where none can be made is the run's `Limits.isolation`: `sandbox` (grading)
refuses to start the run (`SandboxUnavailable`, which says why and the fix); `auto` (the
student loop) gives the run its limits and scratch folder only, says "limits-only" in the
record and warns once; `limits-only`, asked for by name, never makes a sandbox. The limits
hold in every case:

* memory: the address space of each process (`RLIMIT_AS`; none for an accelerator run, whose runtime
  reserves more than it uses: see `accelerators.address_space_limit`), and the whole run's memory when
  this process may create a memory cgroup;
* processes: a pids cgroup when one can be created (v1 as root; v2 in a cgroup handed to the kit, see
  `labkit.run.cgroup2`), else `RLIMIT_NPROC`. That limit never
  binds a process whose real user is root (the kernel exempts root's own user, even in a user
  namespace), so when the kit runs as root without a pids cgroup, the sandbox's processes run as
  a user of their own (`run_user`): an unused uid, one per launch, that owns the scratch folder;
  only outside a sandbox (limits-only) does root stay root, and a fork bomb then meets only the
  time and memory limits (see docs/sandbox.md);
* output: the run's log is cut at `limits.output` bytes (the child process cuts the cells'
  outputs kept in the executed notebook at the same size);
* disk: `/tmp` and `/dev/shm` are tmpfs of `limits.disk` bytes each where bwrap can cap one; the
  scratch folder is measured while the run goes on, by the kit (`execute`, through `labkit.run.scratch`);
* file size (`RLIMIT_FSIZE`, at most `limits.disk`) and no core dumps.

`python -m labkit.run.firststep SPEC CMD...` is the small first step of every launch: it joins
the run's cgroups, sets the resource limits, and becomes CMD. Which isolation a run gets is
`labkit.run.modes`'s to say; what a run sees, `labkit.run.mounts`'; its cgroups, `labkit.run.cgroup`'s;
what it may use, `labkit.run.allowance`'s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from labkit import envnames
from labkit.machine import accelerators
from labkit.run import cgroup, modes, mounts, runusers, sessions
from labkit.run.allowance import DEFAULT_LIMITS, Limits, format_size
from labkit.run.runusers import hand_over, run_user

# labkit.run.processes (psutil) is imported where it is used.


# ----------------------------------------------------------------------------------------
# Launching.
# ----------------------------------------------------------------------------------------


class Drain(threading.Thread):
    """Copies a run's output into its log, up to `cap` bytes; the rest is read and thrown away."""

    def __init__(self, pipe, log, cap: int):
        super().__init__(daemon=True)
        self.pipe, self.log, self.cap, self.kept, self.seen = pipe, log, cap, 0, 0

    def run(self):
        try:
            while True:
                chunk = self.pipe.read1(1 << 16) if hasattr(self.pipe, "read1") else self.pipe.read(1 << 16)
                if not chunk:
                    break
                self.seen += len(chunk)
                if self.kept < self.cap:
                    part = chunk[: self.cap - self.kept]
                    self.kept += len(part)
                    self.log.write(part)
                    if self.kept >= self.cap:
                        self.log.write(
                            f"\n[labkit: the run's log was cut at {format_size(self.cap)}]\n".encode()
                        )
                    self.log.flush()
        except (OSError, ValueError):
            pass
        finally:
            try:
                self.pipe.close()
            except OSError:
                pass


class Sandboxed:
    """A launched process, used like `subprocess.Popen`: `pid`, `poll()`, `wait(timeout)`, `returncode`.

    Once its first process has ended, `wait()` also ends whatever else of the run is left
    (its session, its cgroups) and finishes copying its output to the log.
    """

    def __init__(
        self,
        popen: subprocess.Popen,
        isolation: str,
        reason: str,
        cgroups: list[Path],
        drain: Drain | None,
        limits: Limits,
        token: str = "",
        cpu_share: str = cgroup.NO_SHARE,
    ):
        self.popen, self.isolation, self.reason, self.cgroups, self.drain = (
            popen,
            isolation,
            reason,
            cgroups,
            drain,
        )
        self.limits, self.token, self.cpu_share = limits, token, cpu_share
        self.pid = popen.pid
        self._finished = False

    @property
    def returncode(self):
        return self.popen.returncode

    @property
    def output_cut(self) -> bool:
        return bool(self.drain and self.drain.seen > self.drain.cap)

    def poll(self):
        code = self.popen.poll()
        if code is not None:
            self._finish()
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = self.popen.wait(timeout=timeout)
        self._finish()
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.popen.kill()
        except OSError:
            pass
        self._end_rest()

    def _end_rest(self) -> None:
        from labkit.run import processes

        processes.kill(
            processes.session_members(self.pid) + (processes.marked(self.token) if self.token else [])
        )
        for group in self.cgroups:
            cgroup.remove_cgroup(group)

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._end_rest()
        if self.drain is not None:
            self.drain.join(timeout=10)


def network_of(other: Sandboxed, wait: float = 10.0) -> dict[str, str] | None:
    """The namespaces to join to share `other`'s private network (a peer of a multi-process run), or None.

    None when `other` has no network of its own (no sandbox) or its sandbox did not start within
    `wait` seconds. (A kit that is not root joins, first, the user namespace that owns that network:
    see `_join`.)
    """
    if other.isolation != modes.BUBBLEWRAP:
        return None
    from labkit.run import processes

    own = {"net": os.readlink("/proc/self/ns/net")}
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and other.poll() is None:
        for pid in [other.pid, *processes.descendants(other.pid)]:
            try:
                if os.readlink(f"/proc/{pid}/ns/net") != own["net"]:
                    return {"net": f"/proc/{pid}/ns/net"}
            except OSError:
                continue
        time.sleep(0.02)
    return None


def run_rlimits(env: dict[str, str], limits: Limits) -> dict[str, int]:
    """The resource limits of a run's processes (`RLIMIT_` names less the prefix), RLIMIT_NPROC aside."""
    rlimits = {"FSIZE": min(limits.file_size, limits.disk), "CORE": 0}
    address_space = accelerators.address_space_limit(env, limits.memory)
    if (
        address_space is not None
    ):  # an accelerator run has none: its memory cgroup, where there is one, limits it
        rlimits["AS"] = address_space
    return rlimits


def descendants(pid: int) -> list[int]:
    """Every process started by `pid`, its children's children included (see `labkit.run.processes`)."""
    from labkit.run import processes

    return processes.descendants(pid)


@dataclass(frozen=True)
class Reach:
    """What a run may reach beyond its own folder: more folders to read (`read`) or write (`write`), and another
    run's private network to join instead of a new one (`join`, from `network_of`: the processes of a
    multi-process run reach each other there, and nothing else)."""

    read: tuple[str | Path, ...] = ()
    write: tuple[str | Path, ...] = ()
    join: dict[str, str] | None = None


@dataclass(frozen=True)
class ServerStart:
    """How a warm server (`labkit.run.warm`) starts, unlike a run: as `user` where the kit is root (so that its
    bubblewrap makes a user namespace its runs can nest theirs in; None: as the kit's own user), with no
    cgroups of its own (each of its runs gets the run's), and free to start sessions, as its runs are forked
    in sessions of their own and each run's init applies the filter that `sessions` makes (`warmserver._init`)."""

    user: int | None = None


@dataclass(frozen=True)
class RunContext:
    """One process of a run, all that `launch` needs to start it besides its command.

    `env` is the run's intended environment (the configuration's); it is reduced to what a run needs
    (`mounts.run_environment`). `log`: where the process's output goes, cut at `limits.output` bytes.
    `stdin`, when given, is written to the process's standard input, which is then closed (how a run's
    private key reaches it without touching the disk). `server`: the warm server's own start; every
    other launch's processes may not start a session of their own (`labkit.run.sessions`)."""

    workdir: Path
    env: dict[str, str]
    log: BinaryIO
    limits: Limits = DEFAULT_LIMITS
    stdin: bytes | None = None
    reach: Reach = field(default_factory=Reach)
    server: ServerStart | None = None


def launch(cmd: list[str], run: RunContext) -> Sandboxed:
    """Start `cmd` as one process of `run`, in a sandbox where one can be made, under the run's limits.

    bwrap applies the session filter (`--seccomp`), or, without a sandbox, the first step does; a warm
    server (`run.server`) is the one launch exempt from it.
    """
    limits, reach = run.limits, run.reach
    # a network of the sandbox's own (none, or the one joined) has only a loopback: the host name says so
    hostname = mounts.PRIVATE_HOSTNAME if reach.join or not limits.network else None
    if reach.join:
        limits = replace(limits, network=True)  # bwrap keeps the network it starts in: the one joined
    workdir = Path(run.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    kind, reason = modes.isolation(limits.isolation)
    program = modes.bubblewrap()[0] if kind == modes.BUBBLEWRAP else None
    token = uuid.uuid4().hex
    run_env = mounts.run_environment(run.env, workdir, sandboxed=kind == modes.BUBBLEWRAP) | {
        envnames.RUN_TOKEN: token
    }
    cmd = list(cmd)
    if Path(cmd[0]).name.startswith("python") and "-P" not in cmd[1:2]:
        cmd.insert(1, "-P")  # a module the notebook left in its scratch folder never shadows the kit's
    drivers = accelerators.driver_library_folders(run.env)
    if drivers:  # the NVIDIA driver's libcuda, where it is not in a system folder
        reach = replace(reach, read=(*reach.read, *drivers))
        run_env["LD_LIBRARY_PATH"] = ":".join(drivers)
    cgroups = cgroup.make_cgroups(limits) if run.server is None else []
    held = run.server is None and sessions.available()
    seccomp = sessions.pipe() if held and kind == modes.BUBBLEWRAP else None
    rlimits = run_rlimits(run.env, limits)
    counted = cgroup.counts_processes(cgroups)
    as_user = run.server.user if run.server is not None else None
    if as_user is not None:
        counted = True  # the server's own processes: its runs are counted in their cgroups
        run_env |= {"USER": "labkit", "LOGNAME": "labkit"}
    inner = _inner_command(
        kind, program, cmd, workdir, limits, reach, hostname, seccomp, rlimits, run_env, counted
    )
    spec = json.dumps(
        {"rlimits": rlimits, "cgroups": [str(g / "cgroup.procs") for g in cgroups]}
        | ({"join": reach.join} if reach.join and kind == modes.BUBBLEWRAP else {})
        | ({"sessions": "hold"} if held and kind != modes.BUBBLEWRAP else {})
        | (_server_reach(as_user, workdir, reach) if as_user is not None else {})
    )
    # -P: the scratch folder (the current directory) is never on the path of the kit's own processes
    full = [sys.executable, "-P", "-m", "labkit.run.firststep", spec, *inner]
    popen, drain = _start(full, workdir, run_env, run.stdin, seccomp, run.log, limits.output)
    return Sandboxed(popen, kind, reason, cgroups, drain, limits, token, cgroup.share_of(cgroups, held))


def _inner_command(
    kind: str,
    program,
    cmd: list[str],
    workdir: Path,
    limits: Limits,
    reach: Reach,
    hostname: str | None,
    seccomp: int | None,
    rlimits: dict,
    run_env: dict,
    counted: bool,
) -> list[str]:
    """What the first step starts: `cmd` in bubblewrap (as a user of its own where the kit is root and no cgroup
    counts the run's processes), or `cmd` itself where there is no sandbox. Sets the run's user in `run_env`, and
    where no cgroup counts processes, the process limit in `rlimits`."""
    user = None
    if (
        not counted
        and kind == modes.BUBBLEWRAP
        and os.geteuid() == 0
        and modes.can_run_as_user(program)
        and runusers.open_to_others(mounts.accelerator_devices())
    ):
        user = run_user()
        user = user if hand_over(workdir, user) else None
    if user is not None:
        # RLIMIT_NPROC never limits root: the run's processes become a user of their own, inside the
        # sandbox, once bwrap (as root) has made it; that user owns the scratch folder.
        run_env |= {"USER": "labkit", "LOGNAME": "labkit"}
        first = json.dumps({"rlimits": {"NPROC": limits.processes}, "user": user})
        return mounts.bwrap_command(
            program,
            [sys.executable, "-P", "-m", "labkit.run.firststep", first, *cmd],
            workdir,
            limits,
            (*reach.read, Path(__file__).resolve().parents[1]),
            user=user,
            hostname=hostname,
            seccomp=seccomp,
        )
    if not counted and os.geteuid() != 0:
        from labkit.run import processes

        rlimits["NPROC"] = processes.user_tasks() + limits.processes
    if kind != modes.BUBBLEWRAP:
        return cmd
    return mounts.bwrap_command(
        program, cmd, workdir, limits, reach.read, extra_rw=reach.write, hostname=hostname, seccomp=seccomp
    )


def _server_reach(as_user: int, workdir: Path, reach: Reach) -> dict:
    """A warm server's first step: the user it becomes, and the folders that user must be able to reach."""
    return {
        "user": as_user,
        "reach": [
            *mounts.visible(reach.read),
            str(workdir.resolve()),
            *(str(Path(p).resolve()) for p in reach.write),
        ],
    }


def _start(
    full: list[str], workdir: Path, run_env: dict, stdin: bytes | None, seccomp: int | None, log, output: int
):
    """The first step started, its output drained into `log` (cut at `output` bytes), `stdin` written and closed."""
    try:
        popen = subprocess.Popen(
            full,
            cwd=workdir,
            env=run_env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(seccomp,) if seccomp is not None else (),
        )
    finally:
        if seccomp is not None:
            os.close(seccomp)
    drain = Drain(popen.stdout, log, output)
    drain.start()
    if stdin is not None:
        try:
            popen.stdin.write(stdin)
            popen.stdin.close()
        except OSError:
            pass
    return popen, drain
