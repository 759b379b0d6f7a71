"""Users of their own for sandboxed runs, when the kit runs as root without a pids cgroup.

RLIMIT_NPROC never limits root, so a run that must be held to a process count becomes an unused
uid (`run_user`), one per launch, that owns the run's scratch folder (`hand_over`).
"""

from __future__ import annotations

import os
import stat as filemode
from pathlib import Path

# A block of ids far above the ones systems give to people and services, and above the usual
# subordinate-id ranges.
RUN_USERS = range(0x6C6B0000, 0x6C6B0000 + (1 << 20))


def run_user() -> int:
    """An unused uid for one launch: no process runs as it and no account names it.

    RLIMIT_NPROC counts the tasks of one real user across the machine, so a user of its own
    makes the limit the run's alone, whatever else runs beside it.
    """
    import pwd
    import random

    from labkit.run import processes

    used = processes.uids_in_use()
    for _ in range(100):
        uid = random.choice(RUN_USERS)
        if uid in used:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise RuntimeError("no unused user id for the run")


def open_to_others(devices: list[str]) -> bool:
    """Whether a user of no group may read and write every one of `devices` (a TPU host's chips)."""
    try:
        return all(os.stat(d).st_mode & 0o006 == 0o006 for d in devices)
    except OSError:
        return False


def hand_over(workdir: Path, uid: int) -> bool:
    """Give the run's scratch folder, and what the kit put in it, to `uid` (links are not followed).

    False when the folder itself cannot be given (a file system that refuses root's chown).
    """
    workdir = Path(workdir)
    try:
        os.chown(workdir, uid, uid, follow_symlinks=False)
    except OSError:
        return False
    for folder, dirs, files in os.walk(workdir, followlinks=False):
        for name in dirs + files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
                # a second name for a file elsewhere (a hard link a run left) keeps its owner
                if not (filemode.S_ISREG(st.st_mode) and st.st_nlink > 1):
                    os.chown(path, uid, uid, follow_symlinks=False)
            except OSError:
                continue
    return True
