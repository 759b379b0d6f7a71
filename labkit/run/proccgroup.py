"""This process's cgroups, as `/proc/self/cgroup` lists them: one reading for every module that asks.

Each line is `hierarchy-id:controllers:path`; under cgroup v2 the one line is `0::/path`, under v1 each
hierarchy has its controllers (`4:cpu,cpuacct:/user.slice`). A file that cannot be read, or a line that is
not of that form, gives nothing (the callers then make no cgroup of their own and say so).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class Membership:
    hierarchy: str  # "0" for the unified (v2) hierarchy
    controllers: tuple[str, ...]  # empty for v2
    path: str  # the cgroup's path inside its hierarchy, "/..." (as this process's cgroup namespace sees it)

    @property
    def unified(self) -> bool:
        return self.hierarchy == "0" and not self.controllers


def memberships(proc: Path = PROC) -> list[Membership]:
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            found.append(Membership(parts[0], tuple(c for c in parts[1].split(",") if c), parts[2]))
    return found


def v1_path(controller: str, proc: Path = PROC) -> str | None:
    """The path of this process's cgroup in the v1 hierarchy of `controller` ("cpu", "pids", ...), or None."""
    return next((m.path for m in memberships(proc) if controller in m.controllers), None)


def v2_path(proc: Path = PROC) -> str | None:
    """The path of this process's cgroup in the unified (v2) hierarchy, or None."""
    return next((m.path for m in memberships(proc) if m.unified), None)
