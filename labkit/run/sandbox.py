"""Isolation and limits for a notebook run: a student's notebook is untrusted code.

`launch(cmd, workdir, env, limits, log=...)` starts one process of a run and returns a
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

`python -m labkit.run.sandbox SPEC CMD...` is the small first step of every launch: it joins
the run's cgroups, sets the resource limits, and becomes CMD.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from labkit.machine import accelerators
from labkit.run import bwrap, cgroup2, runusers, sessions
from labkit.run.runusers import RUN_USERS, hand_over, run_user

# labkit.run.processes (psutil) is imported where it is used: the first step of every launch,
# `python -m labkit.run.sandbox`, never needs it.

MiB = 1 << 20
GiB = 1 << 30

BUBBLEWRAP = "bubblewrap"
LIMITS_ONLY = "limits-only"
# What a run asks for (`--isolation`): a sandbox or nothing (grading's default), a sandbox where one can
# be made and limits only elsewhere, with a warning (the student loop's), or limits only, by name.
SANDBOX, AUTO = "sandbox", "auto"
# One more, only by name: the run's container is the sandbox (a pod of its own per graded unit, under
# gVisor: `labkit.grading.pods`), so no bubblewrap is made inside it; refused where / is writable (`pod_problem`).
POD = "pod"
ISOLATIONS = (SANDBOX, LIMITS_ONLY, AUTO, POD)

# The variables a run's environment keeps from the caller's; everything else (tokens, keys,
# the TA's own settings) stays out of the student's process.
_KEEP_VARIABLES = ("PATH", "LANG", "LANGUAGE", "LC_", "TZ", "TERM", "NO_COLOR", "COLUMNS", "JAX_", "XLA_", "TPU_",
                   "LIBTPU", "LABKIT_", "OMP_", "MKL_", "OPENBLAS_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED",
                   "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "JUPYTER_PLATFORM_DIRS")
# System folders a run sees read-only (when they exist).
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


@dataclass(frozen=True)
class Limits:
    """What one notebook run may use. Each has a default and a flag of `python -m labkit lab`."""

    memory: int = 4 * GiB  # bytes: each process's address space, and the whole run's where cgroups allow
    processes: int = 1024  # processes and threads the run may have at once (JAX starts threads per core)
    output: int = 10 * MiB  # bytes of output kept: in the executed notebook, and in the run's log
    file_size: int = 1 * GiB  # the largest file a run may write
    disk: int = 2 * GiB  # bytes the run may hold in its scratch folder (and in each of /tmp and /dev/shm)
    network: bool = False  # True only where a run's processes must reach each other (see docs/sandbox.md)
    isolation: str = AUTO  # SANDBOX, AUTO, LIMITS_ONLY or POD (see ISOLATIONS); grading asks for SANDBOX

    def to_json(self) -> dict:
        return asdict(self)


DEFAULT_LIMITS = Limits()


def parse_size(text: str | int) -> int:
    """Bytes from '4G', '512M', '1.5GiB', '64k' or a plain number of bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (write e.g. 4G, 512M or a number of bytes)")
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[m.group(2).lower()]
    value = int(float(m.group(1)) * scale)
    if value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return value


def add_arguments(parser) -> None:
    """The limit flags of a command that runs notebooks (`lab`, `grade`)."""
    d = DEFAULT_LIMITS
    parser.add_argument("--memory", type=parse_size, default=d.memory, metavar="SIZE",
                        help=f"memory one notebook run may use, e.g. 4G (default {format_size(d.memory)})")
    parser.add_argument("--max-processes", type=int, default=d.processes, metavar="N",
                        help=f"processes and threads one run may have at once (default {d.processes})")
    parser.add_argument("--disk", type=parse_size, default=d.disk, metavar="SIZE",
                        help=f"what one run may write to disk (its scratch folder; /tmp and /dev/shm each) before it is "
                             f"stopped (default {format_size(d.disk)})")
    parser.add_argument("--max-output", type=parse_size, default=d.output, metavar="SIZE",
                        help=f"output of one run that is kept; the rest is cut (default {format_size(d.output)})")


def add_isolation_argument(parser, default: str) -> None:
    """`--isolation`: what a command does where no sandbox can be made."""
    parser.add_argument("--isolation", choices=ISOLATIONS, default=default,
                        help=f"{SANDBOX}: run notebooks only in a sandbox, and stop before running any where none can "
                             f"be made; {AUTO}: a sandbox where one can be made, else limits only with a warning; "
                             f"{LIMITS_ONLY}: resource limits only, no sandbox; {POD}: no bubblewrap, the container "
                             f"the kit runs in is the sandbox (one pod per graded unit, see docs/grading.md; refused "
                             f"where / is writable) (default %(default)s)")


def limits_from_args(args) -> Limits:
    return Limits(memory=args.memory, processes=args.max_processes, output=args.max_output,
                  disk=getattr(args, "disk", DEFAULT_LIMITS.disk), isolation=getattr(args, "isolation", AUTO))


def format_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


# ----------------------------------------------------------------------------------------
# Can bubblewrap make a sandbox here?
# ----------------------------------------------------------------------------------------

@functools.cache
def finding() -> bwrap.Finding:
    """Which bwrap makes the sandbox here (probed once; see `labkit.run.bwrap`), or why none can."""
    wanted = os.environ.get("LABKIT_SANDBOX", "auto").strip().lower()
    if wanted in ("none", "off", "limits-only", "0", "no"):
        return bwrap.Finding(None, "", "", [bwrap.Problem(bwrap.Candidate(None, "LABKIT_SANDBOX"), False,
                                                          f"LABKIT_SANDBOX={wanted} asks for resource limits only")])
    return bwrap.find()


def bubblewrap() -> tuple[str | None, str]:
    """(the bwrap program, "") when it can make the kit's sandbox here, else (None, why not, with the fix)."""
    found = finding()
    return (found.program, "") if found.program else (None, found.report())


bubblewrap.cache_clear = finding.cache_clear  # tests probe again after changing the environment


@functools.cache
def can_run_as_user(program: str) -> bool:
    """Whether bwrap, as root, can make the sandbox without a user namespace (see `bwrap.namespace_args`)."""
    return bwrap.can_run_as_user(program, RUN_USERS[0])


class SandboxUnavailable(RuntimeError):
    """A sandbox is required (`--isolation sandbox`) and none can be made here; the message says why and the fix."""


def require_sandbox(consequence: str = "the notebook was not run") -> bwrap.Finding:
    """The bwrap that will make every run's sandbox; SandboxUnavailable, with each check that failed, if none."""
    found = finding()
    if found.program:
        return found
    raise SandboxUnavailable(
        f"no sandbox can be made on this machine, so {consequence}:\n  "
        + found.report().replace("\n", "\n  ")
        + "\nGrade where bubblewrap works (see docs/sandbox.md, 'Isolation and limits'), or, knowing that a notebook "
          "can then read what this user can read and use the network, ask for resource limits only by name: "
          "--isolation limits-only (make grade ISOLATION=limits-only).")


_warned = False
_noted = False
_warn_lock = threading.Lock()


def _note_problems() -> None:
    """Once: a bwrap that was found and not used (it does not start, or is refused) is said, not skipped silently."""
    global _noted
    with _warn_lock:
        if _noted:
            return
        _noted = True
    found = finding()
    for problem in found.problems:
        print(f"labkit: note: {problem.lines()[0]}; using the {found.origin} bwrap instead", file=sys.stderr,
              flush=True)


def isolation(wanted: str = AUTO) -> tuple[str, str]:
    """(BUBBLEWRAP or LIMITS_ONLY, why not bubblewrap) for a run whose policy is `wanted` (see ISOLATIONS).

    SANDBOX raises SandboxUnavailable where no sandbox can be made; AUTO steps down to limits only
    and warns once, on stderr; LIMITS_ONLY, asked for by name, is limits only wherever the kit runs.
    """
    global _warned
    if wanted == POD:
        problem = pod_problem()
        if problem:
            raise SandboxUnavailable(problem)
        return POD, "the pod is the sandbox, asked for by name (--isolation pod)"
    if wanted == LIMITS_ONLY:
        return LIMITS_ONLY, "resource limits only, asked for by name (--isolation limits-only)"
    program, reason = bubblewrap()
    if program:
        _note_problems()
        return BUBBLEWRAP, ""
    if wanted == SANDBOX:
        require_sandbox()
    with _warn_lock:
        if not _warned:
            _warned = True
            print(f"labkit: warning: notebooks run with resource limits only, not in a sandbox:\n  "
                  f"{reason.replace(chr(10), chr(10) + '  ')}\nA notebook can then read what this user can read and "
                  "use the network; see docs/sandbox.md, 'Isolation and limits'.", file=sys.stderr, flush=True)
    return LIMITS_ONLY, reason


def pod_problem(root: str = "/") -> str:
    """Why this is not a pod the kit may run a notebook in without bubblewrap, or "" when it may.

    The pod's own walls (gVisor, no network, the unit's inputs only) cannot be seen from inside; one
    thing every pod of the kit's manifest has, and a TA's machine or a shared VM has not, can: a root
    file system mounted read-only. So `--isolation pod` typed by mistake outside such a container stops."""
    if _read_only(root):
        return ""
    return (f"--isolation pod runs notebooks without bubblewrap, the container being the sandbox, but {root} is "
            "writable here, so this is not a container of the kit's pod-per-unit design (read-only root, no "
            "network, its inputs read-only, one output folder): nothing was run. Outside such a pod, grade with "
            "--isolation sandbox (see docs/sandbox.md).")


def _read_only(root: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether the file system at `root` is mounted read-only: its mount's own options (the last mount on
    that point), as gVisor reports them (its statfs does not say ST_RDONLY), else statvfs's flag."""
    try:
        with open(mountinfo) as f:
            options = [line.split()[5].split(",") for line in f if len(line.split()) > 5 and line.split()[4] == root]
    except OSError:
        options = []
    if options:
        return "ro" in options[-1]
    return bool(os.statvfs(root).f_flag & os.ST_RDONLY)


# ----------------------------------------------------------------------------------------
# What a sandboxed run sees.
# ----------------------------------------------------------------------------------------

def _kit_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _visible(extra: tuple[str | Path, ...] = ()) -> list[str]:
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
            found.add(package)  # an editable install, or a test's folder: only labkit/, never the rest of the kit
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
        if not any(link == s or link.startswith(s.rstrip("/") + "/") for s in shown) and (target, link) not in out:
            out.append((target, link))
    return out


def accelerator_devices() -> list[str]:
    """The accelerator device nodes of this host, TPU and NVIDIA (none on a CPU machine): a run must see them."""
    return accelerators.devices()


def bwrap_command(program: str, cmd: list[str], workdir: Path, limits: Limits,
                  extra_ro: tuple[str | Path, ...] = (), *, user: int | None = None,
                  extra_rw: tuple[str | Path, ...] = (), hostname: str | None = None,
                  seccomp: int | None = None) -> list[str]:
    """bwrap's command line for `cmd`. With `user`, `cmd` must be the first step (`_exec`) that becomes it.

    `extra_rw` names more folders the sandbox may write (a warm server's: the grading output).
    `hostname`, the name the sandbox's own UTS namespace gets (see `PRIVATE_HOSTNAME`).
    `seccomp`, a descriptor bwrap reads a filter from (`sessions.pipe`: no new sessions in the run).
    """
    args = [program, *bwrap.namespace_args(limits.network, user), *(["--hostname", hostname] if hostname else [])]
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
    for p in _SYSTEM:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    shared = ["--perms", "1777"] if user is not None else []  # root makes them; `user` must write there
    # /tmp and /dev/shm vanish with the sandbox; where this bwrap can cap a tmpfs (0.10 and later), each holds at
    # most the run's disk allowance, else the run's memory cgroup (where there is one) holds them
    capped = ["--size", str(limits.disk)] if bwrap.sizes_tmpfs(finding().version) else []
    args += [*shared, *capped, "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", *shared, *capped,
             "--tmpfs", "/dev/shm"]
    for device in accelerator_devices():
        args += ["--dev-bind", device, device]
    if accelerator_devices() and os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]  # libtpu reads the chips' topology there
    binds = [p for p in _visible(extra_ro) if not any(p == s or p.startswith(s + "/") for s in _SYSTEM)]
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
    return kept | {"HOME": home, "TMPDIR": "/tmp" if sandboxed else home, "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1",
                   "MPLCONFIGDIR": f"{home}/.matplotlib", "JUPYTER_RUNTIME_DIR": f"{home}/.jupyter-runtime"}


# ----------------------------------------------------------------------------------------
# cgroups: a hard limit on processes and on the run's memory, where this process may make them.
# ----------------------------------------------------------------------------------------

def _own_cgroup(controller: str) -> str | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
    except OSError:
        pass
    return None


def _may_make_cgroups() -> bool:
    """Whether this process may make cgroups for its runs: as root, unless LABKIT_CGROUPS=off."""
    return os.geteuid() == 0 and os.environ.get("LABKIT_CGROUPS", "auto") != "off"


def counts_processes(cgroups: list[Path]) -> bool:
    """Whether `cgroups` (from make_cgroups) hold a pids cgroup (v1's, or a v2 run cgroup), which counts the
    run's processes."""
    return any(Path(g).is_relative_to(Path("/sys/fs/cgroup/pids")) or cgroup2.counts_processes(g) for g in cgroups)


@functools.cache
def delegated_cgroup() -> Path | None:
    """The kit's own v2 cgroup, made ready to hold one cgroup per run (`cgroup2.prepare`, once), or None."""
    group = cgroup2.own()
    if group is not None and group.name == cgroup2.LEAF:
        group = group.parent  # prepared already, by this process or the one that started it
    return group if cgroup2.prepare(group) else None


CPU_SHARES = 1024  # every run's weight against the others (v1's default for a group)


# What a run's record says of its CPU share (`Sandboxed.cpu_share`), and `cpu_share` in words.
CGROUP_V1, CGROUP_V2, NO_SHARE = "cgroup v1 cpu.shares", "cgroup v2 cpu.weight", "none"


def share_of(cgroups: list[Path], sessions_held: bool) -> str:
    """The mechanism that gives a run with these cgroups its CPU share: a cgroup, one autogroup, or none."""
    if any(Path(g).is_relative_to(Path("/sys/fs/cgroup/cpu")) for g in cgroups):
        return CGROUP_V1
    if any(cgroup2.counts_processes(g) for g in cgroups):
        return CGROUP_V2
    return sessions.AUTOGROUP if sessions_held and autogroups() else NO_SHARE


@functools.cache
def autogroups() -> bool:
    """Whether the kernel's autogroups share the processors between the kit's runs here (see `labkit.run.sessions`)."""
    return sessions.in_effect() and sessions.available()


def cpu_share() -> str:
    """Which CPU share each run gets here, in words (see docs/sandbox.md, 'Limits'); nothing is made or moved."""
    group = ("one scheduling group per run: the kernel's autogroups, a run's processes may not start a session of "
             "their own (seccomp: setsid fails)")
    if os.environ.get("LABKIT_CGROUPS", "auto") == "off":
        if autogroups():
            return f"{group}; cgroups are turned off (LABKIT_CGROUPS=off)"
        return "none: cgroups are turned off (LABKIT_CGROUPS=off); runs compete process by process"
    if _may_make_cgroups() and _own_cgroup("cpu") is not None and Path("/sys/fs/cgroup/cpu/cgroup.procs").exists():
        return f"a v1 cpu cgroup per run (cpu.shares {CPU_SHARES}), made as root"
    if cgroup2.usable(cgroup2.own()):
        return f"a v2 cgroup per run (cpu.weight {cgroup2.CPU_WEIGHT}, pids.max) in the cgroup handed to the kit"
    if autogroups():
        return f"{group}; no cgroup per run (the kit may make no v1 one and was handed no v2 one)"
    return ("none: the kit may make no v1 cgroup (it is not root, or they are not mounted) and was handed no v2 "
            "cgroup with the cpu and pids controllers, and the kernel's autogroups do not hold for its processes "
            "(off, or the kit is in a cpu cgroup below the root); runs compete process by process")


def tmpfs_sizes() -> str:
    """Whether the sandbox's /tmp and /dev/shm are capped here, in words."""
    found = finding()
    if not found.program:
        return "no sandbox: a run's TMPDIR is in its scratch folder, which is measured (the machine's /tmp is not)"
    if bwrap.sizes_tmpfs(found.version):
        return "tmpfs of the run's --disk each (bwrap --size)"
    return (f"tmpfs without a size ({found.version} cannot cap one; bubblewrap 0.10 and later can, as the bundled "
            "one: LABKIT_BWRAP=bundled), held only by the run's memory cgroup where there is one")


def make_cgroups(limits: Limits) -> list[Path]:
    """New cgroups for one run, when they can be made here; [] otherwise.

    As root, v1 ones (pids, memory, cpu). Where none is made so, and the kit was handed a v2 cgroup of
    its own with the cpu controller (`delegated_cgroup`), root or not: one v2 cgroup (cpu.weight,
    pids.max, and memory.max where delegated). Either gives every run the same share of the processors,
    however many processes it starts: a run that forks two dozen busy processes competes with its
    neighbour as one run, and cannot push it past its timeout."""
    made = _v1_cgroups(limits) if _may_make_cgroups() else []
    group = None if made or os.environ.get("LABKIT_CGROUPS", "auto") == "off" else delegated_cgroup()
    one = cgroup2.run_group(group, limits.processes, limits.memory) if group is not None else None
    return made or ([one] if one is not None else [])


def _v1_cgroups(limits: Limits) -> list[Path]:
    """New v1 cgroups (pids, memory, cpu) below the kit's own, as far as they can be made."""
    made = []
    name = f"labkit-{uuid.uuid4().hex[:12]}"
    for controller, settings in (("pids", {"pids.max": limits.processes}),
                                 ("memory", {"memory.limit_in_bytes": limits.memory}),
                                 ("cpu", {"cpu.shares": CPU_SHARES})):
        own = _own_cgroup(controller)
        base = Path("/sys/fs/cgroup") / controller
        if own is None or not (base / "cgroup.procs").exists():
            continue
        group = base / own.lstrip("/") / name
        try:
            group.mkdir()
            for key, value in settings.items():
                (group / key).write_text(str(value))
            made.append(group)
        except OSError:
            remove_cgroup(group)
    return made


def remove_cgroup(group: Path) -> None:
    """End every process left in `group`, then remove it."""
    for _ in range(50):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            break
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    try:
        group.rmdir()
    except OSError:
        pass


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
                        self.log.write(f"\n[labkit: the run's log was cut at {format_size(self.cap)}]\n".encode())
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

    def __init__(self, popen: subprocess.Popen, isolation: str, reason: str, cgroups: list[Path],
                 drain: Drain | None, limits: Limits, token: str = "", cpu_share: str = NO_SHARE):
        self.popen, self.isolation, self.reason, self.cgroups, self.drain = popen, isolation, reason, cgroups, drain
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

        left = processes.session_members(self.pid) + (processes.marked(self.token) if self.token else [])
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for group in self.cgroups:
            remove_cgroup(group)

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
    if other.isolation != BUBBLEWRAP:
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
    if address_space is not None:  # an accelerator run has none: its memory cgroup, where there is one, limits it
        rlimits["AS"] = address_space
    return rlimits


def pids_cgroups_available() -> bool:
    """Whether `make_cgroups` can give each run a pids cgroup here (root, with the pids controller mounted)."""
    if not _may_make_cgroups():
        return False
    own = _own_cgroup("pids")
    return own is not None and (Path("/sys/fs/cgroup/pids") / own.lstrip("/")).is_dir()


def descendants(pid: int) -> list[int]:
    """Every process started by `pid`, its children's children included (see `labkit.run.processes`)."""
    from labkit.run import processes

    return processes.descendants(pid)


def launch(cmd: list[str], workdir: Path, env: dict[str, str], limits: Limits | None = None, *, log,
           stdin: bytes | None = None, extra_ro: tuple[str | Path, ...] = (),
           join: dict[str, str] | None = None, extra_rw: tuple[str | Path, ...] = (),
           as_user: int | None = None, cgroups: bool = True, new_sessions: bool = False) -> Sandboxed:
    """Start `cmd` in `workdir` under `limits`, in a sandbox where one can be made; its output goes to `log`.

    `env` is the run's intended environment (the configuration's); it is reduced to what a run
    needs (`run_environment`). `stdin`, when given, is written to the process's standard input,
    which is then closed (how a run's private key reaches it without touching the disk).
    `extra_ro` names more folders the run may read. `join` (from `network_of`) puts the sandbox
    in another run's private network instead of a new one: the processes of a multi-process run
    reach each other there, and nothing else.

    A warm server (`labkit.run.warm`) is launched with `extra_rw` (the grading output, where its runs'
    scratch folders are), `as_user` (a kit running as root starts it as that unprivileged user, so
    that its bubblewrap makes a user namespace its runs can nest theirs in), no cgroups of its
    own (each of its runs gets the run's), and `new_sessions`: it may start sessions, as its runs are
    forked in sessions of their own, and each run's init applies the filter that `sessions` makes (`warmserver._init`).

    Every other launch's processes may not start a session of their own (`labkit.run.sessions`): bwrap applies
    the filter (`--seccomp`), or, without a sandbox, the first step does.
    """
    limits = limits or DEFAULT_LIMITS
    # a network of the sandbox's own (none, or the one joined) has only a loopback: the host name says so
    hostname = PRIVATE_HOSTNAME if join or not limits.network else None
    if join:
        limits = replace(limits, network=True)  # bwrap keeps the network it starts in: the one joined
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    kind, reason = isolation(limits.isolation)
    program = bubblewrap()[0] if kind == BUBBLEWRAP else None
    token = uuid.uuid4().hex
    run_env = run_environment(env, workdir, sandboxed=kind == BUBBLEWRAP) | {"LABKIT_RUN_TOKEN": token}
    cmd = list(cmd)
    if Path(cmd[0]).name.startswith("python") and "-P" not in cmd[1:2]:
        cmd.insert(1, "-P")  # a module the notebook left in its scratch folder never shadows the kit's
    drivers = accelerators.driver_library_folders(env)
    if drivers:  # the NVIDIA driver's libcuda, where it is not in a system folder
        extra_ro = (*extra_ro, *drivers)
        run_env["LD_LIBRARY_PATH"] = ":".join(drivers)
    cgroups = make_cgroups(limits) if cgroups else []
    held = not new_sessions and sessions.available()
    seccomp = sessions.pipe() if held and kind == BUBBLEWRAP else None
    rlimits = run_rlimits(env, limits)
    counted = counts_processes(cgroups)
    user = None
    if as_user is not None:
        counted = True  # the server's own processes: its runs are counted in their cgroups
        run_env |= {"USER": "labkit", "LOGNAME": "labkit"}
    elif (kind == BUBBLEWRAP and os.geteuid() == 0 and not counted and can_run_as_user(program)
            and runusers.open_to_others(accelerator_devices())):
        user = run_user()
        user = user if hand_over(workdir, user) else None
    if user is not None:
        # RLIMIT_NPROC never limits root: the run's processes become a user of their own, inside the
        # sandbox, once bwrap (as root) has made it; that user owns the scratch folder.
        run_env |= {"USER": "labkit", "LOGNAME": "labkit"}
        first = json.dumps({"rlimits": {"NPROC": limits.processes}, "user": user})
        inner = bwrap_command(program, [sys.executable, "-P", "-m", "labkit.run.sandbox", first, *cmd], workdir, limits,
                              (*extra_ro, Path(__file__).resolve().parents[1]), user=user, hostname=hostname,
                              seccomp=seccomp)
    else:
        inner = (bwrap_command(program, cmd, workdir, limits, extra_ro, extra_rw=extra_rw, hostname=hostname,
                               seccomp=seccomp)
                 if kind == BUBBLEWRAP else cmd)
        if not counted and os.geteuid() != 0:
            from labkit.run import processes

            rlimits["NPROC"] = processes.user_tasks() + limits.processes
    spec = json.dumps({"rlimits": rlimits, "cgroups": [str(g / "cgroup.procs") for g in cgroups]}
                      | ({"join": join} if join and kind == BUBBLEWRAP else {})
                      | ({"sessions": "hold"} if held and kind != BUBBLEWRAP else {})
                      | ({"user": as_user, "reach": [*_visible(extra_ro), str(workdir.resolve()),
                                                     *(str(Path(p).resolve()) for p in extra_rw)]}
                         if as_user is not None else {}))
    # -P: the scratch folder (the current directory) is never on the path of the kit's own processes
    full = [sys.executable, "-P", "-m", "labkit.run.sandbox", spec, *inner]
    try:
        popen = subprocess.Popen(full, cwd=workdir, env=run_env,
                                 stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                 pass_fds=(seccomp,) if seccomp is not None else ())
    finally:
        if seccomp is not None:
            os.close(seccomp)
    drain = Drain(popen.stdout, log, limits.output)
    drain.start()
    if stdin is not None:
        try:
            popen.stdin.write(stdin)
            popen.stdin.close()
        except OSError:
            pass
    return Sandboxed(popen, kind, reason, cgroups, drain, limits, token, share_of(cgroups, held))


def _capabilities() -> int:
    """This process's effective capabilities (a bit mask)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return -1


_CLONE = {"user": 0x10000000, "net": 0x40000000}  # CLONE_NEWUSER, CLONE_NEWNET
_NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace
_CAP_SYS_ADMIN = 21


def _join(namespaces: dict[str, str]) -> bool:
    """Enter the network namespace named; False, and a line on stderr, when it cannot be.

    Root with CAP_SYS_ADMIN may enter it at once. Another user, or root without it (in a container with
    Docker's default capabilities, as Gradescope's), first enters the user namespace that owns it (made by
    bubblewrap for that user, so the user's own), where it has the right to.
    """
    import ctypes
    import fcntl

    libc = ctypes.CDLL(None, use_errno=True)

    def setns(fd: int, kind: str) -> bool:
        if libc.setns(fd, _CLONE[kind]) == 0:
            return True
        print(f"labkit: process could not join the others' network ({kind} namespace: "
              f"{os.strerror(ctypes.get_errno())})", file=sys.stderr, flush=True)
        return False

    try:
        net = os.open(namespaces["net"], os.O_RDONLY)
    except OSError as e:
        print(f"labkit: process could not join the others' network: {e}", file=sys.stderr, flush=True)
        return False
    try:
        if os.geteuid() != 0 or not _capabilities() & 1 << _CAP_SYS_ADMIN:
            owner = fcntl.ioctl(net, _NS_GET_USERNS)
            try:
                if os.fstat(owner).st_ino != os.stat("/proc/self/ns/user").st_ino and not setns(owner, "user"):
                    return False
            finally:
                os.close(owner)
        return setns(net, "net")
    finally:
        os.close(net)


def apply_rlimits(rlimits: dict[str, int]) -> None:
    """Set this process's resource limits (`RLIMIT_` names less the prefix), never above their hard limits."""
    import resource

    for name, value in rlimits.items():
        which = getattr(resource, f"RLIMIT_{name}")
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def _exec(argv: list[str]) -> int:
    """The first step of every launch: join the cgroups, set the limits, become the command."""
    spec, cmd = json.loads(argv[0]), argv[1:]
    if spec.get("join") and not _join(spec["join"]):
        return 126
    for procs in spec.get("cgroups", []):
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    apply_rlimits(spec.get("rlimits", {}))
    if spec.get("sessions") == "hold":  # no sandbox to apply the filter: this step does, before the command starts
        try:
            sessions.install()
        except OSError as e:
            print(f"labkit: the run's processes could not be kept in one session: {e}", file=sys.stderr, flush=True)
            return 126
    if spec.get("reach"):  # root, before becoming the user that starts bwrap: what it must find at its place
        from labkit.run import nest

        nest.reach(spec["reach"], int(spec["user"]))
    if "user" in spec:  # inside the sandbox, as root with only CAP_SETUID and CAP_SETGID: become the run's user
        uid = int(spec["user"])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or _capabilities() != 0:
            print("labkit: the run could not give up root", file=sys.stderr, flush=True)
            return 126
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(_exec(sys.argv[1:]))
