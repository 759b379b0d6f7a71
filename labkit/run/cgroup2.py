"""A cgroup (v2) of its own for each run, where the kit was given a subtree of its own: no root needed.

cgroup v2 lets a user manage the cgroups below one that was handed to it (delegated: systemd's
`Delegate=yes`, e.g. `systemd-run --user --scope -p Delegate=yes make grade`, or a container
runtime's). A cgroup that holds processes may not also hand controllers to cgroups below it, so
the kit first moves its processes into a leaf of their own (`labkit-kit`), then enables the controllers below
its cgroup and makes one cgroup per run beside that leaf:

* `cpu.weight` (the same for every run): a run of two dozen busy processes competes with the run
  beside it as one run, and cannot push it past its timeout;
* `pids.max`: the run's processes and threads, whatever user runs them;
* `memory.max`: the whole run's memory, where the memory controller is delegated too.

Nothing here is tried where the kit's cgroup is not a v2 one it may write or the cpu and pids
controllers are not delegated to it; then no run gets a cgroup of its own, and the kit's other limits
hold alone (see docs/sandbox.md, 'Limits').
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from labkit.run import proccgroup

ROOT = Path("/sys/fs/cgroup")
CPU_WEIGHT = 100  # every run's weight against the others (v2's default for a group)
LEAF = "labkit-kit"  # where the kit's own processes live once it manages its cgroup


def own(root: Path = ROOT, proc: Path = proccgroup.PROC) -> Path | None:
    """This process's v2 cgroup folder, when the unified hierarchy is mounted at `root`; else None."""
    path = proccgroup.v2_path(proc)
    return root / path.lstrip("/") if path is not None and (root / "cgroup.controllers").exists() else None


def _controllers(group: Path, name: str = "cgroup.controllers") -> set[str]:
    """The controllers a cgroup file names (the kernel reads them back without the '+' they were written with)."""
    try:
        return {c.lstrip("+") for c in (group / name).read_text().split()}
    except OSError:
        return set()


def _members(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def usable(group: Path | None) -> bool:
    """Whether `prepare` may make `group` hold one cgroup per run (it is not tried: nothing moves)."""
    if group is not None and group.name == LEAF:
        group = group.parent
    if group is None or not {"cpu", "pids"} <= _controllers(group):
        return False
    return {"cpu", "pids"} <= _controllers(group, "cgroup.subtree_control") or (
        os.access(group / "cgroup.procs", os.W_OK) and os.access(group / "cgroup.subtree_control", os.W_OK)
    )


def prepare(group: Path | None) -> bool:
    """Make `group` (the kit's own cgroup) ready to hold one cgroup per run: True when it is.

    Moves the processes of `group` (the kit, and whatever started it in the subtree handed to it: make,
    a shell) into the leaf `LEAF` below it and hands the cpu and pids controllers (and memory, where
    delegated) down to the cgroups below. Undone, and False, where any step is refused."""
    if not usable(group):
        return False
    if {"cpu", "pids"} <= _controllers(group, "cgroup.subtree_control"):
        return True  # done already (by this process, or by whoever handed the kit this subtree)
    leaf = group / LEAF
    try:
        leaf.mkdir(exist_ok=True)
        _move(_members(group), leaf)
        wanted = ["cpu", "pids", *(["memory"] if "memory" in _controllers(group) else [])]
        (group / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
    except OSError:
        try:
            _move(_members(leaf), group)
            leaf.rmdir()
        except OSError:
            pass
        return False
    return True


def _move(pids: list[int], group: Path) -> None:
    """Move each process into `group` (one that ended meanwhile is skipped)."""
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            continue


def run_group(group: Path, processes: int, memory: int | None) -> Path | None:
    """A new cgroup for one run below the prepared `group`, or None where it cannot be made."""
    made = group / f"labkit-{uuid.uuid4().hex[:12]}"
    try:
        made.mkdir()
        (made / "cpu.weight").write_text(str(CPU_WEIGHT))
        (made / "pids.max").write_text(str(processes))
        if memory is not None and "memory" in _controllers(group, "cgroup.subtree_control"):
            (made / "memory.max").write_text(str(memory))
    except OSError:
        try:
            made.rmdir()
        except OSError:
            pass
        return None
    return made


def counts_processes(group: Path) -> bool:
    """Whether `group` is a v2 run cgroup that limits its processes (`pids.max`)."""
    return (Path(group) / "pids.max").exists() and (Path(group) / "cpu.weight").exists()
