"""A run's cgroups: a hard limit on its processes and its memory, and its share of the processors,
where this process may make them (v1 as root; a v2 cgroup handed to the kit, through
`labkit.run.cgroup2`); elsewhere, the kernel's autogroups, one per run (`labkit.run.sessions`).
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from pathlib import Path

from labkit import envnames
from labkit.run import cgroup2, proccgroup, sessions
from labkit.run.allowance import Limits


def _may_make_cgroups() -> bool:
    """Whether this process may make cgroups for its runs: as root, unless LABKIT_CGROUPS=off."""
    return os.geteuid() == 0 and os.environ.get(envnames.CGROUPS, "auto") != "off"


def counts_processes(cgroups: list[Path]) -> bool:
    """Whether `cgroups` (from make_cgroups) hold a pids cgroup (v1's, or a v2 run cgroup), which counts the
    run's processes."""
    return any(
        Path(g).is_relative_to(Path("/sys/fs/cgroup/pids")) or cgroup2.counts_processes(g) for g in cgroups
    )


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
    group = (
        "one scheduling group per run: the kernel's autogroups, a run's processes may not start a session of "
        "their own (seccomp: setsid fails)"
    )
    if os.environ.get(envnames.CGROUPS, "auto") == "off":
        if autogroups():
            return f"{group}; cgroups are turned off (LABKIT_CGROUPS=off)"
        return "none: cgroups are turned off (LABKIT_CGROUPS=off); runs compete process by process"
    if (
        _may_make_cgroups()
        and proccgroup.v1_path("cpu") is not None
        and Path("/sys/fs/cgroup/cpu/cgroup.procs").exists()
    ):
        return f"a v1 cpu cgroup per run (cpu.shares {CPU_SHARES}), made as root"
    if cgroup2.usable(cgroup2.own()):
        return (
            f"a v2 cgroup per run (cpu.weight {cgroup2.CPU_WEIGHT}, pids.max) in the cgroup handed to the kit"
        )
    if autogroups():
        return f"{group}; no cgroup per run (the kit may make no v1 one and was handed no v2 one)"
    return (
        "none: the kit may make no v1 cgroup (it is not root, or they are not mounted) and was handed no v2 "
        "cgroup with the cpu and pids controllers, and the kernel's autogroups do not hold for its processes "
        "(off, or the kit is in a cpu cgroup below the root); runs compete process by process"
    )


def make_cgroups(limits: Limits) -> list[Path]:
    """New cgroups for one run, when they can be made here; [] otherwise.

    As root, v1 ones (pids, memory, cpu). Where none is made so, and the kit was handed a v2 cgroup of
    its own with the cpu controller (`delegated_cgroup`), root or not: one v2 cgroup (cpu.weight,
    pids.max, and memory.max where delegated). Either gives every run the same share of the processors,
    however many processes it starts: a run that forks two dozen busy processes competes with its
    neighbour as one run, and cannot push it past its timeout."""
    made = _v1_cgroups(limits) if _may_make_cgroups() else []
    group = None if made or os.environ.get(envnames.CGROUPS, "auto") == "off" else delegated_cgroup()
    one = cgroup2.run_group(group, limits.processes, limits.memory) if group is not None else None
    return made or ([one] if one is not None else [])


def _v1_cgroups(limits: Limits) -> list[Path]:
    """New v1 cgroups (pids, memory, cpu) below the kit's own, as far as they can be made."""
    made = []
    name = f"labkit-{uuid.uuid4().hex[:12]}"
    for controller, settings in (
        ("pids", {"pids.max": limits.processes}),
        ("memory", {"memory.limit_in_bytes": limits.memory}),
        ("cpu", {"cpu.shares": CPU_SHARES}),
    ):
        own = proccgroup.v1_path(controller)
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


def pids_cgroups_available() -> bool:
    """Whether `make_cgroups` can give each run a pids cgroup here (root, with the pids controller mounted)."""
    if not _may_make_cgroups():
        return False
    own = proccgroup.v1_path("pids")
    return own is not None and (Path("/sys/fs/cgroup/pids") / own.lstrip("/")).is_dir()
