"""The machine's processes as psutil sees them: a run's process tree, what is left of a run, users in use.

Every question the sandbox asks about other processes is asked here; a process that ends while
it is being read, or that this user may not read, is simply not counted.
"""

from __future__ import annotations

import os
import signal

import psutil

from labkit import envnames


def kill(pids) -> None:
    """SIGKILL each of `pids`; one that has ended already, or that this user may not signal, is passed over."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_tree(pid: int) -> None:
    """End `pid` and every process it started, each one's process group too (a kernel in a session of its own
    leads one); one that has ended, or that this user may not signal, is passed over."""
    for p in [pid, *descendants(pid)]:
        try:
            os.killpg(os.getpgid(p), signal.SIGKILL)
        except OSError:
            pass
        kill([p])


def descendants(pid: int) -> list[int]:
    """Every process started by `pid`, its children's children included."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def session_members(sid: int) -> list[int]:
    """The processes of session `sid`, its leader excepted."""
    out = []
    for pid in psutil.pids():
        if pid == sid:
            continue
        try:
            if os.getsid(pid) == sid:
                out.append(pid)
        except OSError:
            continue
    return out


def marked(token: str) -> list[int]:
    """Processes whose environment carries a run's token: what is left of the run, even in a session of its own."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(envnames.RUN_TOKEN) == token:
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return out


def uids_in_use() -> set[int]:
    """The real and effective user ids of every process now."""
    used = set()
    for p in psutil.process_iter(["uids"]):
        if p.info["uids"] is not None:
            used.update((p.info["uids"].real, p.info["uids"].effective))
    return used


def user_tasks(uid: int | None = None) -> int:
    """Processes and threads user `uid` (this one by default) has now: what RLIMIT_NPROC counts."""
    uid = os.getuid() if uid is None else uid
    return sum(
        p.info["num_threads"] or 0
        for p in psutil.process_iter(["uids", "num_threads"])
        if p.info["uids"] is not None and p.info["uids"].real == uid
    )


def held_after_removal(pids: list[int], device: int) -> int:
    """The bytes of disk taken by files on `device` that `pids` hold open after every name of them was removed.

    Each descriptor is only looked at (`stat` through `/proc/PID/fd/N`, never opened); a file counts once.
    A process this user may not read is not counted."""
    import stat

    seen: set[int] = set()
    total = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (
                stat.S_ISREG(st.st_mode)
                and st.st_nlink == 0
                and st.st_dev == device
                and st.st_ino not in seen
            ):
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total
