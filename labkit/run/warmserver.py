"""The warm server itself, inside its own sandbox: `python -m labkit.run.warmserver SPEC`.

It imports what every run imports (`PRELOAD`) without starting a JAX backend, checks that a child of
it can make a run's sandbox here (`probe`), says READY, and then forks one child per request from the
kit (`labkit.run.warm`): the child reports its pid, takes the run's limits, walls itself off
(`labkit.run.nest`) and becomes the run's Jupyter kernel, or one of the kit's own programs (`MODULES`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

# What every lab's run imports, once, in the server (never starting a backend).
PRELOAD = (
    "numpy",
    "jax",
    "jax.numpy",
    "jax.sharding",
    "jax.experimental.mesh_utils",
    "IPython",
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "labkit.judge.harness",
    "labkit.notebook",
    # what the kernel's start imports (its debugger, shell, history, event loop): about 0.5 s each run
    "ipykernel.debugger",
    "ipykernel.zmqshell",
    "ipykernel.iostream",
    "ipykernel.heartbeat",
    "ipykernel.comm",
    "IPython.core.history",
    "IPython.core.completer",
    "sqlite3",
    "pdb",
    "pydoc",
    "tornado.ioloop",
    "tornado.queues",
    "xml.dom.minidom",
    "xmlrpc.client",
    "unicodedata",
    "faulthandler",
    "psutil",
    "jax.export",
    "labkit.judge.verify",
    "labkit.facts",
    # what a run's first export or lowering imports (the MHLO dialect), and a traceback's formatting: 0.4 s each
    "jaxlib.mlir.dialects.mhlo",
    "jax.experimental.multihost_utils",
    "stack_data",
    # what JAX imports to find the CPU's LAPACK routines at the first call of an exported program: 0.5 s in
    # every verifier (the lookup itself, of function pointers in it, is quick)
    "scipy.linalg",
    "scipy.linalg.cython_lapack",
)
# What only some labs import: a server imports them where a lab its runs are of does (`catalog.Lab.uses`),
# about 1 s of CPU that every other lab's server start is spared.
FOR_SOME_LABS = {"flax": ("flax.nnx", "optax")}
READY, UNAVAILABLE = "ready", "unavailable"
MODULES = (
    "labkit.judge.verify",
)  # what a forked child may run instead of a kernel: the kit's own, never a student's


def _child(request: dict, log_fd: int, hello_fd: int, roots: list[Path]) -> None:
    """The forked child of one run: never returns."""
    code = 125
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the kernel's, never its keepers'
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.dup2(hello_fd, 3)
        os.closerange(4, 1 << 16)
        hello = socket.socket(fileno=3)
        hello.sendall(b"hello")
        hello.settimeout(60)
        if not hello.recv(8).startswith(b"go"):
            os._exit(125)
        hello.close()
        from labkit.run import firststep, nest

        # the server's command line and environment are not the run's to read (its init and kernel keep this copy)
        nest.forget_server()
        firststep.apply_rlimits(request["rlimits"])

        workdir = Path(request["workdir"])
        nest.enter_namespaces(
            workdir,
            roots,
            shared=request.get("shared", {}),
            readable=request.get("readable"),
            tmp_size=request.get("tmp_size"),
        )
        pid = os.fork()
        if pid == 0:
            _init(request, workdir)
        code = _exit_code(os.waitpid(pid, 0)[1])
    except BaseException as e:  # noqa: BLE001 - the child reports and ends, whatever happened
        os.write(2, f"labkit: the run's sandbox could not be made: {e}\n".encode(errors="replace"))
    os._exit(code)


def _exit_code(status: int) -> int:
    """A child's wait status as an exit status, 128 + N for a signal N (as a shell, and bwrap, report it)."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _init(request: dict, workdir: Path) -> None:
    """Process 1 of the run's process-id namespace: its `/proc`, no privileges, then the kernel as its child."""
    code = 125
    try:
        from labkit.run import nest, sessions

        nest.become_init()
        nest.drop_privileges()
        if sessions.available():  # the run stays in the session the child made (`labkit.run.sessions`)
            sessions.install()
        kernel = os.fork()
        if kernel == 0:
            _kernel(request, workdir)
        while True:
            pid, status = os.wait()
            if pid == kernel:
                code = _exit_code(status)
                break
    except BaseException as e:  # noqa: BLE001
        os.write(2, f"labkit: the run's sandbox could not be made: {e}\n".encode(errors="replace"))
    os._exit(code)


def _kernel(request: dict, workdir: Path) -> None:
    """The run's Jupyter kernel, in the run's environment, as a cold start would have it."""
    code = 0
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        configure_jax(request["env"])
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # numpy's global generator was made in the server: not shared
        os.chdir(workdir)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request.get("module") in MODULES:  # one of the kit's own programs (the verifier), not a kernel
            import importlib

            os._exit(importlib.import_module(request["module"]).main(list(request["argv"])))
        sys.argv = ["ipykernel_launcher", *request["argv"]]
        from ipykernel.kernelapp import IPKernelApp

        IPKernelApp.launch_instance(argv=list(request["argv"]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def configure_jax(env: dict[str, str]) -> None:
    """Give JAX the `JAX_*` settings of `env`, which it reads from the environment only when imported."""
    jax_config = sys.modules.get("jax") and sys.modules["jax"].config
    if not jax_config:
        return
    holders = getattr(jax_config, "_value_holders", {})
    for key, text in env.items():
        name = key.lower()
        if not key.startswith("JAX_") or name not in holders:
            continue
        current = holders[name].value
        if isinstance(current, bool):
            value = text.strip().lower() in ("1", "y", "yes", "t", "true", "on")
        elif isinstance(current, int):
            value = int(text)
        elif isinstance(current, float):
            value = float(text)
        else:
            value = text
        jax_config.update(name, value)


def probe(folder: Path) -> str:
    """READY when a child of this process can make a run's sandbox here, else what stopped it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            from labkit.run import nest

            nest.enter_namespaces(folder, [])
            inner = os.fork()
            if inner == 0:
                try:
                    nest.become_init()
                    nest.drop_privileges()
                    os.write(write_end, READY.encode())
                except BaseException as e:  # noqa: BLE001
                    os.write(write_end, str(e).encode(errors="replace")[:300])
                os._exit(0)
            os.waitpid(inner, 0)
        except BaseException as e:  # noqa: BLE001
            os.write(write_end, str(e).encode(errors="replace")[:300])
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as f:
        said = f.read().decode(errors="replace").strip()
    return said or "the probe said nothing"


def serve(spec: dict) -> int:
    roots = [Path(r) for r in spec["roots"]]
    status = Path(spec["socket"]).with_name("server.status")
    import importlib

    chosen = [FOR_SOME_LABS[p] for p in spec.get("packages", ()) if p in FOR_SOME_LABS]
    for name in PRELOAD + tuple(name for names in chosen for name in names):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    said = probe(Path.cwd())
    if said != READY:
        status.write_text(f"{UNAVAILABLE}: {said}\n")
        return 0
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(spec["socket"])
    listener.bind(spec["socket"])
    listener.listen(64)
    status.write_text(READY + "\n")
    children: dict[int, socket.socket] = {}
    while True:
        conns = list(children.values())
        ready, _, _ = select.select([listener, *conns], [], [], 0.1)
        for sock in ready:
            if sock is listener:
                _fork_for(listener, roots, children)
            else:  # the kit closed its side or asked for a kill: end the run
                pid = next(p for p, c in children.items() if c is sock)
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        _reap(children)


def _fork_for(listener: socket.socket, roots: list[Path], children: dict[int, socket.socket]) -> None:
    """Take one request from the kit and fork its run's child (which never returns here); a request for a
    folder outside the server's, or without its two descriptors, is dropped."""
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
        request = json.loads(msg.decode())
        if len(fds) != 2 or not any(Path(request["workdir"]).is_relative_to(r) for r in roots):
            raise ValueError("a request the server does not serve")
    except (OSError, ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in children.values():
            other.close()
        conn.close()
        _child(request, fds[0], fds[1], [*roots, Path.cwd()])  # the server's own folder too
    for fd in fds:
        os.close(fd)
    children[pid] = conn


def _reap(children: dict[int, socket.socket]) -> None:
    """Collect every child that has ended and tell the kit its exit status on the run's connection."""
    while children:
        try:
            pid, wstatus = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        conn = children.pop(pid, None)
        if conn is not None:
            code = os.waitstatus_to_exitcode(wstatus)
            try:
                conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
            except OSError:
                pass
            conn.close()


if __name__ == "__main__":
    sys.exit(serve(json.loads(sys.argv[1])))
