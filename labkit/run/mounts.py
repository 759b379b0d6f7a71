"""What a sandboxed run sees: the bubblewrap command line and the run's environment.

The system folders and the kit's Python environment read-only (never the kit's repository: no
reference, no hidden tests), the device nodes of an accelerator run, a private `/tmp` and `/dev/shm`
capped in size where bwrap can cap them, and one writable folder, the run's own. Links on the way to
a folder bound into the sandbox are made inside it too, so that paths resolve there as they do here.
The run's environment keeps only the caller's variables a run needs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from labkit.machine import accelerators
from labkit.run import bwrap
from labkit.run.allowance import Limits
from labkit.run.modes import finding

# The variables a run's environment keeps from the caller's; everything else (tokens, keys,
# the TA's own settings) stays out of the student's process.
_KEEP_VARIABLES = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_",
    "TZ",
    "TERM",
    "NO_COLOR",
    "COLUMNS",
    "JAX_",
    "XLA_",
    "TPU_",
    "LIBTPU",
    "LABKIT_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "JUPYTER_PLATFORM_DIRS",
)
# System folders a run sees read-only (when they exist).
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


def _kit_root() -> Path:
    return Path(__file__).resolve().parents[2]


def visible(extra: tuple[str | Path, ...] = ()) -> list[str]:
    """Folders a run reads: the interpreter, its environment, the kit's package; never the kit's repository."""
    root, package = _kit_root(), Path(__file__).resolve().parents[1]
    found = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    found.add(Path(sys.executable).resolve().parent.parent)
    for entry in sys.path:
        if not entry:
            continue
        p = Path(entry).resolve()
        if not p.is_dir():
            continue
        inside_env = any(p.is_relative_to(Path(prefix).resolve()) for prefix in (sys.prefix, sys.base_prefix))
        if p == root or root.is_relative_to(p) or (p.is_relative_to(root) and not inside_env):
            found.add(
                package
            )  # an editable install, or a test's folder: only labkit/, never the rest of the kit
        else:
            found.add(p)
    found.update(Path(p).resolve() for p in extra)
    keep = sorted(str(p) for p in found if p.exists() and str(p) != "/")
    # a folder inside another one already bound needs no bind of its own
    return [p for i, p in enumerate(keep) if not any(p.startswith(q.rstrip("/") + "/") for q in keep[:i])]


def links_on_the_way(path: str | Path) -> list[tuple[str, str]]:
    """(target, link) for each symbolic link met on the way to `path`, in the order they are met.

    A bind shows a folder's resolved path only; a path that reaches it through a link elsewhere (uv's
    managed Pythons: a venv's interpreter is reached through `cpython-3.13-linux-x86_64-gnu`, a link to
    the installed `cpython-3.13.5-linux-x86_64-gnu`) would lead nowhere in the sandbox without the link."""
    out: list[tuple[str, str]] = []
    pending, done = list(Path(os.path.abspath(path)).parts[1:]), Path("/")
    for _ in range(64):  # as the kernel, give up on a loop
        if not pending:
            break
        here = done / pending.pop(0)
        if here.is_symlink():
            target = os.readlink(here)
            out.append((target, str(here)))
            pending = list(Path(os.path.normpath(done / target)).parts[1:]) + pending
            done = Path("/")
        else:
            done = here
    return out


def _links(binds: list[str]) -> list[tuple[str, str]]:
    """The links (target, link) on the way to this interpreter that no bind shows: made in the sandbox too."""
    shown = (*_SYSTEM, *binds)
    out = []
    for target, link in links_on_the_way(sys.executable):
        if (
            not any(link == s or link.startswith(s.rstrip("/") + "/") for s in shown)
            and (target, link) not in out
        ):
            out.append((target, link))
    return out


CPU_INFO = "/sys/devices/system/cpu"


def accelerator_devices() -> list[str]:
    """The accelerator device nodes of this host, TPU and NVIDIA (none on a CPU machine): a run must see them."""
    return accelerators.devices()


def bwrap_command(
    program: str,
    cmd: list[str],
    workdir: Path,
    limits: Limits,
    extra_ro: tuple[str | Path, ...] = (),
    *,
    user: int | None = None,
    extra_rw: tuple[str | Path, ...] = (),
    hostname: str | None = None,
    seccomp: int | None = None,
) -> list[str]:
    """bwrap's command line for `cmd`. With `user`, `cmd` must be the first step (`_exec`) that becomes it.

    `extra_rw` names more folders the sandbox may write (a warm server's: the grading output).
    `hostname`, the name the sandbox's own UTS namespace gets (see `PRIVATE_HOSTNAME`).
    `seccomp`, a descriptor bwrap reads a filter from (`sessions.pipe`: no new sessions in the run).
    """
    args = [
        program,
        *bwrap.namespace_args(limits.network, user),
        *(["--hostname", hostname] if hostname else []),
    ]
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
    args += _system_and_scratch_mounts(limits, user)
    args += _device_mounts()
    binds = [p for p in visible(extra_ro) if not any(p == s or p.startswith(s + "/") for s in _SYSTEM)]
    links = _links(binds)
    work = str(Path(workdir).resolve())
    if user is not None:  # the folders bwrap makes on the way to a bind are root's alone (0700): open them
        for folder in _on_the_way([*binds, *(link for _, link in links), work]):
            args += ["--perms", "0755", "--dir", folder]
    for p in binds:
        args += ["--ro-bind", p, p]
    for target, link in links:
        args += ["--symlink", target, link]
    for p in extra_rw:
        args += ["--bind", str(Path(p).resolve()), str(Path(p).resolve())]
    args += ["--bind", work, work, "--chdir", work, "--"]
    return args + list(cmd)


def _system_and_scratch_mounts(limits: Limits, user: int | None) -> list[str]:
    """The system's folders read-only, and a /tmp, /proc, /dev and /dev/shm of the sandbox's own."""
    args: list[str] = []
    for p in _SYSTEM:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    shared = ["--perms", "1777"] if user is not None else []  # root makes them; `user` must write there
    # /tmp and /dev/shm vanish with the sandbox; where this bwrap can cap a tmpfs (0.10 and later), each holds at
    # most the run's disk allowance, else the run's memory cgroup (where there is one) holds them
    capped = ["--size", str(limits.disk)] if bwrap.sizes_tmpfs(finding().version) else []
    return args + [
        *shared,
        *capped,
        "--tmpfs",
        "/tmp",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *shared,
        *capped,
        "--tmpfs",
        "/dev/shm",
    ]


def _device_mounts() -> list[str]:
    """The host's accelerators, and what the TPU runtime and compiler read of the machine (read-only)."""
    args: list[str] = []
    for device in accelerator_devices():
        args += ["--dev-bind", device, device]
    if accelerator_devices() and os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]  # libtpu reads the chips' topology there
    elif os.path.isdir(
        CPU_INFO
    ):  # the CPUs' count, which libtpu's allocator reads to compile for a TPU topology
        args += ["--ro-bind", CPU_INFO, CPU_INFO]
    return args


# The host name of a sandbox with a network of its own (none, or the private one of a multi-process run):
# JAX's CPU collectives (gloo) bind to the address the host name resolves to, and the machine's own name
# may resolve to nothing (a container with no network) or to an address this network does not have
# (Docker's bridge); "localhost" resolves to the loopback, the one interface such a network has.
PRIVATE_HOSTNAME = "localhost"


def _on_the_way(paths: list[str]) -> list[str]:
    """The folders above `paths` that bwrap would make itself, shallowest first (not the mounted ones)."""
    mounted = {"/", "/tmp", "/proc", "/dev", "/dev/shm", "/sys", *_SYSTEM}
    out: set[str] = set()
    for p in paths:
        for parent in Path(p).parents:
            q = str(parent)
            if q in mounted or any(q.startswith(s + "/") for s in (*_SYSTEM, "/proc", "/dev", "/sys")):
                continue
            out.add(q)
    return sorted(out, key=lambda q: (q.count("/"), q))


def run_environment(env: dict[str, str], workdir: Path, sandboxed: bool) -> dict[str, str]:
    """The environment a run gets: the caller's device and locale settings, nothing private, a home of its own."""
    kept = {k: v for k, v in env.items() if k.startswith(_KEEP_VARIABLES)}
    home = "/tmp/home" if sandboxed else str(Path(workdir).resolve() / ".home")
    if not sandboxed:
        Path(home).mkdir(parents=True, exist_ok=True)
    return kept | {
        "HOME": home,
        "TMPDIR": "/tmp" if sandboxed else home,
        "PYTHONNOUSERSITE": "1",
        "PYTHONSAFEPATH": "1",
        "MPLCONFIGDIR": f"{home}/.matplotlib",
        "JUPYTER_RUNTIME_DIR": f"{home}/.jupyter-runtime",
    }


def tmpfs_sizes() -> str:
    """Whether the sandbox's /tmp and /dev/shm are capped here, in words."""
    found = finding()
    if not found.program:
        return "no sandbox: a run's TMPDIR is in its scratch folder, which is measured (the machine's /tmp is not)"
    if bwrap.sizes_tmpfs(found.version):
        return "tmpfs of the run's --disk each (bwrap --size)"
    return (
        f"tmpfs without a size ({found.version} cannot cap one; bubblewrap 0.10 and later can, as the bundled "
        "one: LABKIT_BWRAP=bundled), held only by the run's memory cgroup where there is one"
    )
