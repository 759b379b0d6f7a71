"""The first step of every launch, `python -P -m labkit.run.firststep SPEC CMD...`: it joins the run's
cgroups, sets its resource limits, keeps it in one session where no sandbox does, and becomes CMD.

It imports the standard library and the kit's own session filter (`labkit.run.sessions`), and, when it makes
the way to a folder for another user, `labkit.run.nest`: nothing a run could have written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from labkit.run import sessions


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
        print(
            f"labkit: process could not join the others' network ({kind} namespace: "
            f"{os.strerror(ctypes.get_errno())})",
            file=sys.stderr,
            flush=True,
        )
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
                if os.fstat(owner).st_ino != os.stat("/proc/self/ns/user").st_ino and not setns(
                    owner, "user"
                ):
                    return False
            finally:
                os.close(owner)
        return setns(net, "net")
    finally:
        os.close(net)


def apply_rlimits(rlimits: dict[str, int]) -> None:
    """Set this process's resource limits (`RLIMIT_` names less the prefix), never above their hard limits."""
    import resource

    for name, wanted in rlimits.items():
        which = getattr(resource, f"RLIMIT_{name}")
        _, hard = resource.getrlimit(which)
        value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
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
    if (
        spec.get("sessions") == "hold"
    ):  # no sandbox to apply the filter: this step does, before the command starts
        try:
            sessions.install()
        except OSError as e:
            print(
                f"labkit: the run's processes could not be kept in one session: {e}",
                file=sys.stderr,
                flush=True,
            )
            return 126
    if spec.get("reach"):  # root, before becoming the user that starts bwrap: what it must find at its place
        from labkit.run import nest

        nest.reach(spec["reach"], int(spec["user"]))
    if (
        "user" in spec
    ):  # inside the sandbox, as root with only CAP_SETUID and CAP_SETGID: become the run's user
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
