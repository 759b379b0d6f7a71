"""A run's own sandbox made inside a warm server's (see `labkit.run.warm`): namespaces, mounts, no capabilities.

A warm server lives in a bubblewrap sandbox of its own and never runs a student's code. For
each run it forks a child, and the child walls itself off, with the kernel's own calls, before
any of the run's code exists:

* a user namespace nested in the server's, mapping one id (the child's own) and nothing else;
* new mount, network, IPC, UTS and process-id namespaces, owned by that user namespace, so that
  every mount inherited from the server's sandbox is locked (it can be covered, never removed);
* a fresh, empty file system over each folder the server may write (`roots`: the grading run's
  output), in which only the run's own scratch folder is bound again, at the path it has
  outside; the other runs' folders are not there at all. Then that file system is made read-only;
* a private `/tmp` and `/dev/shm`, a `/proc` of its own process-id namespace (other runs, and the
  server, are not in it), and a loopback interface, up, in a network of its own;
* then every capability is dropped, from the bounding set too, and `no_new_privs` is set: the
  run's code cannot mount, unmount or gain a privilege back, even by making a namespace of its own.

Linux only; `available()` says whether this kernel lets a process of the server's sandbox do it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import socket
import struct
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
# The id a run has inside its user namespace when the server's is root there: never root itself,
# so that running a program can never give the run a capability back.
RUN_ID = 1000


class NestError(OSError):
    """A step of making the run's sandbox failed: the run must not start."""


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise NestError(err, f"{what}: {os.strerror(err)}")


def _mount(
    libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    _check(
        libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
        f"mount {fstype or source} on {target}",
    )


def enter_namespaces(
    workdir: Path,
    roots: list[Path],
    shared: dict[str, bool] | None = None,
    readable: Path | None = None,
    tmp_size: int | None = None,
) -> None:
    """In the forked child, before the run's code: new namespaces, and a file system showing only `workdir`.

    `shared` names more folders the server may write, each with whether this run may write it too
    (a compilation cache: the reference runs fill it, the others only read it). `readable`, a folder
    that holds `workdir` (the run's kit folder), is shown too, read-only. `tmp_size`, when given, caps
    each of the run's /tmp and /dev/shm (bytes: the run's disk allowance).

    The process-id namespace applies to the children this process makes next (`become_init`).
    """
    libc = _libc()
    _unshare(libc)
    work = str(Path(workdir).resolve())
    above = str(Path(readable).resolve()) if readable is not None else None
    if above is not None and not Path(work).is_relative_to(above):
        raise OSError(f"{work} is not inside {above}")
    # Each folder to show is held open before anything covers it (one may lie under /tmp or a root).
    keep = os.open(work, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    keep_above = os.open(above, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if above is not None else None
    shared = {str(Path(f).resolve()): bool(w) for f, w in (shared or {}).items()}
    shown = {f: os.open(f, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for f in shared}
    resolved = [str(Path(root).resolve()) for root in roots]
    # a root inside another is covered with it
    outermost = [r for r in resolved if not any(r != o and Path(r).is_relative_to(o) for o in resolved)]
    try:
        _fresh_tmp(libc, tmp_size)
        for root_s in outermost:
            _cover(libc, root_s, work, keep, above, keep_above)
        # the shared folders bound again (one under /tmp is gone by now), read-only unless the run is to write it
        for folder_s, fd in shown.items():
            os.makedirs(folder_s, exist_ok=True)
            _mount(libc, f"/proc/self/fd/{fd}", folder_s, None, MS_BIND)
            if not shared[folder_s]:
                _mount(libc, None, folder_s, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    finally:
        os.close(keep)
        if keep_above is not None:
            os.close(keep_above)
        for fd in shown.values():
            os.close(fd)


def _unshare(libc) -> None:
    """A user namespace in which this process is itself (or RUN_ID, for root), then new mount, network, IPC,
    host-name and process-id namespaces, with every mount private to them."""
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER), "a user namespace")
    Path("/proc/self/setgroups").write_text("deny")
    inside = uid if uid else RUN_ID
    Path("/proc/self/uid_map").write_text(f"{inside} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{inside} {gid} 1")
    _check(
        libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID), "namespaces"
    )
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)


def _fresh_tmp(libc, tmp_size: int | None) -> None:
    """An empty /tmp and /dev/shm of the run's own, each capped at `tmp_size` bytes where given.

    What the server's sandbox binds under /tmp (the kit's environment, when it lies there) is bound again,
    as it was (read-only stays read-only); a folder of the run's own (its scratch folder) is bound later."""
    kept = {m: os.open(m, os.O_PATH | os.O_CLOEXEC) for m in _mounts_under("/tmp")}
    options = "mode=1777" + (f",size={int(tmp_size)}" if tmp_size else "")
    _mount(libc, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, options)
    _mount(libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, options)
    try:
        for m, fd in kept.items():
            _bind_again(libc, fd, m)
    finally:
        for fd in kept.values():
            os.close(fd)


def _cover(libc, root_s: str, work: str, keep: int, above: str | None, keep_above: int | None) -> None:
    """Cover one of the server's folders with an empty read-only tmpfs, showing only the run's own folders in
    it: the kit folder read-only (where given) and the scratch folder in it, writable."""
    os.makedirs(root_s, exist_ok=True)  # a folder under /tmp is made again (empty), to be covered
    _mount(libc, "tmpfs", root_s, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    if Path(work).is_relative_to(root_s):
        if above is not None and keep_above is not None:
            os.makedirs(above, exist_ok=True)
            _mount(libc, f"/proc/self/fd/{keep_above}", above, None, MS_BIND)
            _mount(libc, None, above, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        else:
            os.makedirs(work, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{keep}", work, None, MS_BIND)
    _mount(libc, None, root_s, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=64k")


def _bind_again(libc, fd: int, path: str) -> None:
    """Bind what `fd` (opened before `path` was covered) names at `path` again, making the place for it."""
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()
    _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)


def _mounts_under(top: str) -> list[str]:
    """The highest mount points below `top` (not `top` itself) in this mount namespace."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4]
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
        if point.startswith(top.rstrip("/") + "/"):
            points.append(point)
    return sorted({p for p in points if not any(p != q and p.startswith(q + "/") for q in points)})


def become_init() -> None:
    """In the first process of the new process-id namespace: its own `/proc`, a loopback network."""
    libc = _libc()
    _check(libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "the parent-death signal")
    _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def forget_server() -> None:
    """Zero what `/proc/self/cmdline` and `/proc/self/environ` show of the warm server in this forked child.

    Both files read the strings the server's process started with (its command line names its
    socket and folders; its environment, its marker token), which a fork keeps in its memory;
    the kernel needs none of it. After this, the C environment is empty (`clearenv`): the caller
    sets the run's own. Where the kernel does not give the addresses, nothing is changed."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        # fields 48 to 51 of proc(5)'s stat (counted from 1; the list starts at field 3)
        arg_start, arg_end, env_start, env_end = (int(fields[n - 3]) for n in (48, 49, 50, 51))
    except (OSError, IndexError, ValueError):
        return
    libc = _libc()
    if arg_end > arg_start:
        ctypes.memset(arg_start, 0, arg_end - arg_start)
    if env_end > env_start:
        ctypes.memset(env_start, 0, env_end - env_start)
    libc.clearenv()


def drop_privileges() -> None:
    """No capability left, none to be had back (bounding set, ambient set, no_new_privs); not dumpable by others."""
    libc = _libc()
    for cap in range(64):
        if (
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 1
        ):  # EPERM: not ours to drop
            raise NestError(1, "the capability bounding set could not be emptied")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(
        24
    )  # two (effective, permitted, inheritable) sets of 32 bits, all zero
    _check(libc.capset(ctypes.c_char_p(header), data), "dropping the capabilities")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if capabilities() != 0:
        raise NestError(1, "a capability was left")


def capabilities() -> int:
    """This process's effective capabilities (a bit mask)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return -1


def _blocked(path: Path, uid: int) -> Path | None:
    """The highest folder above or at `path` that `uid` (of no group) may not pass through, or None."""
    here = Path("/")
    for part in Path(path).resolve().parts[1:]:
        here = here / part
        try:
            st = here.stat()
        except OSError:
            return None
        if st.st_uid != uid and not st.st_mode & 0o001:
            return here
    return None


def reach(paths: list[str], uid: int) -> None:
    """As root, before becoming `uid`: in a mount namespace of this process's own, make each of `paths` reachable.

    A folder on the way that `uid` may not pass (a home folder of mode 0700 holding the Python
    installation, say) is covered by an empty folder it may pass, in which only `paths` are bound
    again, each at its own place. Nothing else under that folder is there for `uid`, and nothing
    changes outside this namespace.
    """
    libc = _libc()
    blocked: dict[Path, list[str]] = {}
    for p in paths:
        top = _blocked(Path(p), uid)
        if top is not None:
            blocked.setdefault(top, []).append(str(Path(p).resolve()))
    if not blocked:
        return
    _check(libc.unshare(CLONE_NEWNS), "a mount namespace")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    tops = sorted(blocked, key=lambda t: len(t.parts))
    kept = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for top in tops for p in blocked[top]}
    try:
        for top in tops:
            if any(top.is_relative_to(t) and top != t for t in tops):
                continue  # under a folder covered already: its paths are bound with that one's
            _mount(libc, "tmpfs", str(top), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
            for p in sorted((q for t in tops if t.is_relative_to(top) for q in blocked[t]), key=len):
                _bind_again(libc, kept[p], p)
    finally:
        for fd in kept.values():
            os.close(fd)
