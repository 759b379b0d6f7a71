"""Why this machine refuses bubblewrap its namespaces, and what fixes it.

bwrap makes its sandbox from Linux namespaces. Where it fails, the cause is almost always one
of a few host policies, each with its own fix. `diagnose` reads what bwrap printed and what
the host says about itself (`/proc/sys`, `/proc/self/status`, container markers) and names one:

| check | seen as | fix |
| --- | --- | --- |
| `kernel-userns-off` | `/proc/sys/user/max_user_namespaces` = 0 | raise it (sysctl), or a setuid bwrap |
| `no-setuid-helper` | bwrap: "must be installed setuid" (a kernel without user namespaces) | the distribution's setuid bwrap |
| `docker-proc-masked` | bwrap: "Can't mount proc on /newroot/proc" | `--security-opt systempaths=unconfined` |
| `docker-seccomp` | bwrap: "No permissions to create new namespace" / EPERM, `Seccomp: 2`, a container | a seccomp profile that allows namespaces |
| `debian-userns-clone-off` | `/proc/sys/kernel/unprivileged_userns_clone` = 0 | set it to 1 (sysctl) |
| `apparmor-userns` | `/proc/sys/kernel/apparmor_restrict_unprivileged_userns` = 1 (Ubuntu 24.04) | an AppArmor profile for bwrap |
| `gvisor` | gVisor's `/proc/version`, or bwrap: "overflowuid", "Failed to make / slave" (GKE Sandbox) | nodes without gVisor |

Everything is read from `proc` and `root` (by default the real ones), so that each case can be
simulated with a folder of fake files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_CAP_SYS_ADMIN = 21
SECCOMP_FILTER = "2"  # /proc/self/status "Seccomp:": 0 none, 1 strict, 2 filter (Docker's default profile)


@dataclass(frozen=True)
class Refusal:
    """One diagnosed cause: `check` names it, `why` says what was seen, `fix` what makes a sandbox work."""

    check: str
    why: str
    fix: str

    def lines(self) -> list[str]:
        return [f"why: {self.why} [{self.check}]", f"fix: {self.fix}"]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _status(proc: Path) -> dict[str, str]:
    out = {}
    for line in (_read(proc / "self" / "status") or "").splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


# The fixed kernel version gVisor shows every sandboxed program in /proc/version.
GVISOR_VERSION = "#1 SMP Sun Jan 10 15:06:54 PST 2016"
# What bwrap says under gVisor's runsc 20221219 (Debian 12's), in the order it meets them (tests/kit/test_gvisor.py).
GVISOR_ERRORS = ("overflowuid", "Failed to make / slave", "RTM_NEWADDR")


def under_gvisor(proc: Path = Path("/proc")) -> bool:
    """Whether this process runs in gVisor (runsc; GKE Sandbox), by the kernel version gVisor reports."""
    return GVISOR_VERSION in (_read(proc / "version") or "")


def in_container(root: Path = Path("/"), environ: dict[str, str] | None = None) -> str | None:
    """Which container this looks like (Docker, Podman, Kubernetes), or None."""
    environ = os.environ if environ is None else environ
    if (root / ".dockerenv").exists():
        return "Docker"
    if (root / "run" / ".containerenv").exists():
        return "Podman"
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return "Kubernetes"
    return None


def _privileged(status: dict[str, str]) -> bool:
    """Whether this process holds CAP_SYS_ADMIN, which the unprivileged-namespace switches do not bind."""
    try:
        return bool(int(status.get("CapEff", "0"), 16) >> _CAP_SYS_ADMIN & 1)
    except ValueError:
        return False


def apparmor_profile(program: str) -> str:
    """An AppArmor profile that lets `program` (and only it) make user namespaces, for Ubuntu 24.04."""
    return (
        "abi <abi/4.0>,\ninclude <tunables/global>\n"
        f"profile labkit-bwrap {program} flags=(unconfined) {{\n  userns,\n}}\n"
    )


@dataclass(frozen=True)
class _Refused:
    """What a refusal is read from: bwrap's error text (`first`, its first line) and the host's settings."""

    text: str
    first: str
    program: str
    proc: Path
    container: str | None
    privileged: bool
    seccomp: bool  # a seccomp filter is on this process
    refused: bool  # bwrap said it may not make a namespace

    def sysctl(self, *name: str) -> str | None:
        return _read(self.proc.joinpath("sys", *name))

    @property
    def quoted(self) -> str:
        """bwrap's own words, where it said any, to end a message with."""
        return f"; bwrap: {self.first}" if self.text else ""


def diagnose(
    error: str,
    program: str = "bwrap",
    *,
    proc: Path = Path("/proc"),
    root: Path = Path("/"),
    environ: dict[str, str] | None = None,
) -> Refusal:
    """The cause of a refused sandbox, from bwrap's error text and the host's own settings: the first of
    `_CAUSES` that matches, else one that says bwrap cannot make a sandbox here."""
    text = error.strip()
    status = _status(proc)
    seen = _Refused(
        text=text,
        first=(text.splitlines() or ["no message"])[0][:300],
        program=program,
        proc=proc,
        container=in_container(root, environ),
        privileged=_privileged(status),
        seccomp=status.get("Seccomp") == SECCOMP_FILTER,
        refused="No permissions to create new namespace" in text or "Operation not permitted" in text,
    )
    for cause in _CAUSES:
        found = cause(seen)
        if found is not None:
            return found
    where = f" (in a {seen.container} container)" if seen.container else ""
    return Refusal(
        "unknown",
        f"bwrap cannot make a sandbox here{where}: {seen.first}",
        "see docs/sandbox.md, 'Isolation and limits': bwrap needs unprivileged user namespaces, or a setuid-root bwrap",
    )


def _gvisor(seen: _Refused) -> Refusal | None:
    if not (under_gvisor(seen.proc) or any(e in seen.text for e in GVISOR_ERRORS)):
        return None
    return Refusal(
        "gvisor",
        f"this is gVisor (runsc, as GKE Sandbox runs pods), which cannot host bwrap's sandbox ({seen.first}): its "
        "/proc has no kernel/overflowuid, and in a user namespace it refuses to change mount propagation "
        "(making / a slave mount) and to give the new network's loopback an address",
        "grade on nodes without gVisor, in a container started with the kit's seccomp profile and "
        "`systempaths=unconfined` (Kubernetes: the Job in infra/k8s on an ordinary node pool, "
        "`procMount: Unmasked`); gVisor itself is then not the sandbox, bwrap is",
    )


def _proc_masked(seen: _Refused) -> Refusal | None:
    if "Can't mount proc" not in seen.text:
        return None
    where = f"in this {seen.container} container " if seen.container else ""
    return Refusal(
        "docker-proc-masked",
        f"bwrap made its namespaces but may not mount a fresh /proc {where}({seen.first}): the container "
        "runtime masks parts of /proc, and the kernel then refuses a new proc mount",
        "start the container with `--security-opt systempaths=unconfined` (Docker; with the seccomp option "
        "that lets namespaces be made), or `procMount: Unmasked` in the pod's securityContext (Kubernetes)",
    )


def _no_user_namespaces(seen: _Refused) -> Refusal | None:
    if "must be installed setuid" not in seen.text and (seen.proc / "self" / "ns" / "user").exists():
        return None
    return Refusal(
        "no-setuid-helper",
        f"this kernel has no user namespaces ({seen.first}), so an unprivileged bwrap cannot work: it needs a "
        "setuid-root helper, and the bundled bwrap is not setuid (a wheel cannot install one)",
        "install the distribution's bubblewrap with its setuid bit (e.g. `sudo apt-get install bubblewrap`, "
        "then `sudo chmod u+s /usr/bin/bwrap` where the package does not set it), or use a kernel built with "
        "CONFIG_USER_NS",
    )


def _user_namespaces_off(seen: _Refused) -> Refusal | None:
    if seen.sysctl("user", "max_user_namespaces") != "0":
        return None
    return Refusal(
        "kernel-userns-off",
        "user namespaces are turned off in the kernel (/proc/sys/user/max_user_namespaces = 0)" + seen.quoted,
        "`sudo sysctl -w user.max_user_namespaces=15000`, and keep it with a line "
        "`user.max_user_namespaces = 15000` in /etc/sysctl.d/90-labkit.conf; or a setuid-root system bwrap",
    )


def _container_seccomp(seen: _Refused) -> Refusal | None:
    if not (seen.container and (seen.seccomp or seen.refused) and "uid map" not in seen.text):
        return None
    filt = "a seccomp filter (Seccomp: 2 in /proc/self/status)" if seen.seccomp else "the container's policy"
    return Refusal(
        "docker-seccomp",
        f"this {seen.container} container refuses new namespaces ({seen.first}): {filt}, as Docker's default "
        "seccomp profile does, blocks unshare/clone of namespaces",
        "run the container with a seccomp profile that allows creating namespaces (the kit's, or "
        "`--security-opt seccomp=unconfined`) and `--security-opt systempaths=unconfined`, as a user "
        "other than root; or grade outside the container",
    )


def _userns_clone_off(seen: _Refused) -> Refusal | None:
    if seen.privileged or seen.sysctl("kernel", "unprivileged_userns_clone") != "0":
        return None
    return Refusal(
        "debian-userns-clone-off",
        "unprivileged user namespaces are turned off (/proc/sys/kernel/unprivileged_userns_clone = 0)"
        + seen.quoted,
        "`sudo sysctl -w kernel.unprivileged_userns_clone=1`, and keep it with a line "
        "`kernel.unprivileged_userns_clone = 1` in /etc/sysctl.d/90-labkit.conf",
    )


def _apparmor(seen: _Refused) -> Refusal | None:
    if seen.privileged or seen.sysctl("kernel", "apparmor_restrict_unprivileged_userns") != "1":
        return None
    return Refusal(
        "apparmor-userns",
        "AppArmor restricts unprivileged user namespaces (/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
        f" = 1, Ubuntu 24.04's default) and no profile allows them to {seen.program}" + seen.quoted,
        f"allow this bwrap alone: write /etc/apparmor.d/labkit-bwrap with `{apparmor_profile(seen.program)!r}` "
        "(see docs/sandbox.md, 'Isolation and limits') and run `sudo apparmor_parser -r /etc/apparmor.d/labkit-bwrap`;"
        " or, for the whole machine, `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`",
    )


# The causes in the order they are told apart: the first that matches is the refusal's.
_CAUSES = (
    _gvisor,
    _proc_masked,
    _no_user_namespaces,
    _user_namespaces_off,
    _container_seccomp,
    _userns_clone_off,
    _apparmor,
)
