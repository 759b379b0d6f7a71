"""How a run is isolated here: a bubblewrap sandbox, resource limits only, or the pod it runs in.

A run asks for one (`--isolation`: SANDBOX, AUTO, LIMITS_ONLY or POD) and `isolation` says which it
gets: a sandbox wherever bubblewrap can make one (`labkit.run.bwrap` probes which bwrap, and
`labkit.run.refusals` names the host policy when none can); where none can be made, SANDBOX refuses
the run (`SandboxUnavailable`, with the reason and the fix) and AUTO steps down to limits only, saying so
once. LIMITS_ONLY and POD are only ever taken when asked for by name.
"""

from __future__ import annotations

import functools
import os
import sys
import threading

from labkit import envnames
from labkit.run import bwrap
from labkit.run.runusers import RUN_USERS

BUBBLEWRAP = "bubblewrap"
LIMITS_ONLY = "limits-only"
# What a run asks for (`--isolation`): a sandbox or nothing (grading's default), a sandbox where one can
# be made and limits only elsewhere, with a warning (the student loop's), or limits only, by name.
SANDBOX, AUTO = "sandbox", "auto"
# One more, only by name: the run's container is the sandbox (a pod of its own per graded unit, under
# gVisor: `labkit.grading.running.pods`), so no bubblewrap is made inside it; refused where / is writable (`pod_problem`).
POD = "pod"
ISOLATIONS = (SANDBOX, LIMITS_ONLY, AUTO, POD)


@functools.cache
def finding() -> bwrap.Finding:
    """Which bwrap makes the sandbox here (probed once; see `labkit.run.bwrap`), or why none can."""
    wanted = os.environ.get(envnames.SANDBOX, "auto").strip().lower()
    if wanted in ("none", "off", "limits-only", "0", "no"):
        return bwrap.Finding(
            None,
            "",
            "",
            [
                bwrap.Problem(
                    bwrap.Candidate(None, envnames.SANDBOX),
                    False,
                    f"LABKIT_SANDBOX={wanted} asks for resource limits only",
                )
            ],
        )
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
        "--isolation limits-only (make grade ISOLATION=limits-only)."
    )


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
        print(
            f"labkit: note: {problem.lines()[0]}; using the {found.origin} bwrap instead",
            file=sys.stderr,
            flush=True,
        )


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
            print(
                f"labkit: warning: notebooks run with resource limits only, not in a sandbox:\n  "
                f"{reason.replace(chr(10), chr(10) + '  ')}\nA notebook can then read what this user can read and "
                "use the network; see docs/sandbox.md, 'Isolation and limits'.",
                file=sys.stderr,
                flush=True,
            )
    return LIMITS_ONLY, reason


def pod_problem(root: str = "/") -> str:
    """Why this is not a pod the kit may run a notebook in without bubblewrap, or "" when it may.

    The pod's own walls (gVisor, no network, the unit's inputs only) cannot be seen from inside; one
    thing every pod of the kit's manifest has, and a TA's machine or a shared VM has not, can: a root
    file system mounted read-only. So `--isolation pod` typed by mistake outside such a container stops."""
    if _read_only(root):
        return ""
    return (
        f"--isolation pod runs notebooks without bubblewrap, the container being the sandbox, but {root} is "
        "writable here, so this is not a container of the kit's pod-per-unit design (read-only root, no "
        "network, its inputs read-only, one output folder): nothing was run. Outside such a pod, grade with "
        "--isolation sandbox (see docs/sandbox.md)."
    )


def _read_only(root: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether the file system at `root` is mounted read-only: its mount's own options (the last mount on
    that point), as gVisor reports them (its statfs does not say ST_RDONLY), else statvfs's flag."""
    try:
        with open(mountinfo) as f:
            options = [
                line.split()[5].split(",") for line in f if len(line.split()) > 5 and line.split()[4] == root
            ]
    except OSError:
        options = []
    if options:
        return "ro" in options[-1]
    return bool(os.statvfs(root).f_flag & os.ST_RDONLY)


def add_isolation_argument(parser, default: str) -> None:
    """`--isolation`: what a command does where no sandbox can be made."""
    parser.add_argument(
        "--isolation",
        choices=ISOLATIONS,
        default=default,
        help=f"{SANDBOX}: run notebooks only in a sandbox, and stop before running any where none can "
        f"be made; {AUTO}: a sandbox where one can be made, else limits only with a warning; "
        f"{LIMITS_ONLY}: resource limits only, no sandbox; {POD}: no bubblewrap, the container "
        f"the kit runs in is the sandbox (one pod per graded unit, see docs/grading.md; refused "
        f"where / is writable) (default %(default)s)",
    )
