"""The kernel manager of a run: jupyter_client's, with the kernel started in the kit's sandbox (or forked by
the warm server) and reached over Unix sockets in its scratch folder. Imported only by the runs that start a
kernel (`kernel.papermill_run`), as it brings jupyter_client and zmq with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager

from labkit.judge import harness
from labkit.run import allowance, processes, sandbox
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
        sandbox.RunContext(
            cwd,
            env,
            log,
            limits,
            stdin=(key + "\n").encode() if key else None,
            reach=sandbox.Reach(read=extra_ro, write=extra_rw, join=join),
        ),
    )


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
        self.ended, self.asked_to_exit = False, False
        self.clients: list = []  # papermill's clients of this kernel, whose channels `end` stops
        self.link_dir = Path(tempfile.mkdtemp(prefix="labkit-"))
        (self.link_dir / "w").symlink_to(workdir.resolve(), target_is_directory=True)
        # The connection file (which the kernel reads) names the sockets relative to the kernel's folder;
        # once the kernel is started, this side names them through the link.
        self.transport, self.ip = "ipc", "kernel"
        self.connection_file = str(workdir / "kernel.json")
        # A message far larger than the run's whole output allowance is refused by the socket, not read.
        self.client_context = zmq.asyncio.Context()
        self.client_context.setsockopt(zmq.MAXMSGSIZE, allowance.largest_message(limits))
        # The manager's own sockets (its control channel) never wait for a kernel that is gone: a message
        # left for a dead kernel would otherwise hold the context open until this process exits, and then
        # forever (zmq's term waits for every message to be sent).
        self.context = zmq.asyncio.Context()
        self.context.setsockopt(zmq.LINGER, 0)
        self.client_context.setsockopt(zmq.LINGER, 0)

    def client(self, **kwargs):
        kc = super().client(context=self.client_context, **kwargs)
        self.clients.append(kc)  # papermill's client does not stop its channels for a kernel it did not start
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
        self.stop_kernel()
        if self.sandboxed is not None:
            self.sandboxed.wait()
        stopped = [stop_channels(kc) for kc in self.clients]
        if all(stopped):
            self.client_context.destroy(linger=0)
        else:  # left to the process's exit: closing a socket that a thread still uses can crash the process
            self.run_log.write(
                b"labkit: a channel of the kernel's client did not stop; its sockets stay open\n"
            )
        with contextlib.suppress(Exception):
            self._close_control_socket()
        self.context.destroy(linger=0)
        shutil.rmtree(
            self.link_dir, ignore_errors=True
        )  # the kit's own folder (the link in it is not followed)


CHANNELS = ("_shell_channel", "_iopub_channel", "_stdin_channel", "_control_channel", "_hb_channel")


def stop_channels(kc) -> bool:
    """Stop each channel of the client `kc` on its own, and say whether none is left running.

    jupyter_client's `stop_channels` stops them in turn, so one that raises would leave the heartbeat's
    thread running; destroying the context under a socket that thread still uses is not thread-safe in zmq
    (a use after free, a crash of the whole process, not an exception). Only when this says so is the
    client's context destroyed. Channels never made are not made now (the client's properties would)."""
    running = False
    for name in CHANNELS:
        channel = getattr(kc, name, None)
        if channel is None:
            continue
        if isinstance(channel, threading.Thread):
            _until_begun(channel)
        with contextlib.suppress(Exception):
            if channel.is_alive():
                channel.stop()
        running = running or (isinstance(channel, threading.Thread) and channel.is_alive())
    return not running


def _until_begun(channel: threading.Thread, wait: float = 5.0) -> None:
    """Wait (a moment) until the heartbeat's thread has begun its loop. jupyter_client's heartbeat sets
    `_running` when its loop begins: asked to stop before that (a kernel that died at its start), it sets it
    again and never ends, making a new socket every turn until zmq has none left to give."""
    deadline = time.monotonic() + wait
    while getattr(channel, "_running", True) is False and channel.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
