"""One run, one scheduling group, where no cgroup gives a run a CPU share of its own: no new sessions.

Linux's scheduler shares the processors between groups of processes, not between processes, when
the kernel's autogroups are on (`/proc/sys/kernel/sched_autogroup_enabled`, on by default in most
distributions) and the processes are in no cpu cgroup below the root: every session (`setsid`) is
a group of its own, with the weight of one busy process. A run is started in a session of its own
(bwrap `--new-session`, a warm run's `setsid`), so two runs weigh the same, however many processes
each starts, as long as neither may start another session. Twenty-four busy processes, each in a
session of its own, would otherwise weigh twenty-four times the run beside them.

So every process of a run has a seccomp filter that makes `setsid` fail with EPERM: a small
classic-BPF program written here (no library), given to bwrap (`--seccomp FD`, applied just before
the run's command starts) or installed by the run's first process (`install`, where no bwrap
applies it: a warm run's init, a run with limits only). It refuses every system call of another
architecture's table too (a 32-bit `int 0x80` on x86-64, where `setsid` has another number), and
x32's numbering of `setsid`. Nothing else changes: a run may still make process groups (`setpgid`),
namespaces or threads, none of which makes a scheduling group.

`in_effect` says whether autogroups hold here for the kit's runs; where they do not (autogroups off,
or the kit in a cpu cgroup below the root, as under systemd's cgroup v2 with the cpu controller on)
the filter is still applied, but shares nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from pathlib import Path

from labkit.run import proccgroup

# (the audit architecture of the kernel's native system calls, the number of setsid there)
_NATIVE = {"x86_64": (0xC000003E, 112), "aarch64": (0xC00000B7, 157)}
_X32_BIT = 0x40000000  # x86-64's x32 calls are the native table's numbers with this bit set

# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _ALU_AND_K, _JEQ_K, _RET_K = 0x20, 0x54, 0x15, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EPERM = 1
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

AUTOGROUP = "autogroup"  # the word a run's record uses for this mechanism


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter (struct sock_filter[], as bwrap's --seccomp reads it), or None on an architecture not known here."""
    native = _NATIVE.get(machine or platform.machine())
    if native is None:
        return None
    arch, setsid = native
    return b"".join(
        [
            _insn(_LD_W_ABS, 0, 0, _ARCH),
            _insn(_JEQ_K, 0, 4, arch),  # another architecture's table: refused (jumps to the last)
            _insn(_LD_W_ABS, 0, 0, _NR),
            _insn(_ALU_AND_K, 0, 0, ~_X32_BIT & 0xFFFFFFFF),
            _insn(_JEQ_K, 1, 0, setsid),
            _insn(_RET_K, 0, 0, _ALLOW),
            _insn(_RET_K, 0, 0, _ERRNO | _EPERM),
        ]
    )


def available() -> bool:
    return program() is not None


def pipe() -> int | None:
    """A descriptor to read the filter from (bwrap --seccomp FD), inheritable; None where there is no filter."""
    code = program()
    if code is None:
        return None
    read_end, write_end = os.pipe()
    os.write(write_end, code)
    os.close(write_end)
    os.set_inheritable(read_end, True)
    return read_end


def install() -> None:
    """Apply the filter to this process and all it will start (with no_new_privs, which it needs); OSError if refused."""
    code = program()
    if code is None:
        raise OSError(0, f"no seccomp filter for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxQ", len(code) // 8, ctypes.addressof(buffer))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs refused")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the seccomp filter was refused")


def _cpu_group(proc: Path, mounts: Path) -> tuple[str, str] | None:
    """(this process's cgroup for the cpu controller, the root of that hierarchy's mount), v1 or v2."""
    try:
        info = mounts.read_text().splitlines()
    except OSError:
        return None
    joined = proccgroup.memberships(proc)
    if not joined:
        return None
    v1 = next((m.path for m in joined if "cpu" in m.controllers), None)
    for fields in (m.split() for m in info):
        dash = fields.index("-")
        kind, options = fields[dash + 1], fields[-1].split(",")
        if v1 is not None and kind == "cgroup" and "cpu" in options:
            return v1, fields[3]
        if v1 is None and kind == "cgroup2":
            path = next((m.path for m in joined if m.unified), None)
            return (path, fields[3] + "|" + fields[4]) if path is not None else None
    return None


def in_effect(
    proc: Path = proccgroup.PROC,
    mounts: Path = Path("/proc/self/mountinfo"),
    enabled: Path = Path("/proc/sys/kernel/sched_autogroup_enabled"),
) -> bool:
    """Whether the kernel's autogroups share the processors between this process's sessions.

    They do where they are on and the process is in the root of the cpu controller's hierarchy (seen
    from the real root, not a container's cgroup namespace); under a v2 hierarchy, also where the root
    hands the cpu controller to no cgroup below it."""
    try:
        if enabled.read_text().strip() != "1":
            return False
    except OSError:
        return False
    found = _cpu_group(proc, mounts)
    if found is None:
        return False
    path, root = found
    if "|" not in root:  # v1: the cpu hierarchy's own root, mounted whole
        return path == "/" and root == "/"
    root, mountpoint = root.split("|")
    if root != "/":
        return False
    try:
        return path == "/" or "cpu" not in (Path(mountpoint) / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
