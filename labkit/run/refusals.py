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


def diagnose(
    error: str,
    program: str = "bwrap",
    *,
    proc: Path = Path("/proc"),
    root: Path = Path("/"),
    environ: dict[str, str] | None = None,
) -> Refusal:
    """The cause of a refused sandbox, from bwrap's error text and the host's own settings."""
    text = error.strip()
    first = (text.splitlines() or ["no message"])[0][:300]
    sysctl = proc / "sys"
    status = _status(proc)
    container = in_container(root, environ)
    privileged = _privileged(status)
    seccomp = status.get("Seccomp") == SECCOMP_FILTER
    refused = "No permissions to create new namespace" in text or "Operation not permitted" in text

    if under_gvisor(proc) or any(e in text for e in GVISOR_ERRORS):
        return Refusal(
            "gvisor",
            f"this is gVisor (runsc, as GKE Sandbox runs pods), which cannot host bwrap's sandbox ({first}): its "
            "/proc has no kernel/overflowuid, and in a user namespace it refuses to change mount propagation "
            "(making / a slave mount) and to give the new network's loopback an address",
            "grade on nodes without gVisor, in a container started with the kit's seccomp profile and "
            "`systempaths=unconfined` (Kubernetes: the Job in infra/k8s on an ordinary node pool, "
            "`procMount: Unmasked`); gVisor itself is then not the sandbox, bwrap is",
        )
    if "Can't mount proc" in text:
        where = f"in this {container} container " if container else ""
        return Refusal(
            "docker-proc-masked",
            f"bwrap made its namespaces but may not mount a fresh /proc {where}({first}): the container "
            "runtime masks parts of /proc, and the kernel then refuses a new proc mount",
            "start the container with `--security-opt systempaths=unconfined` (Docker; with the seccomp option "
            "that lets namespaces be made), or `procMount: Unmasked` in the pod's securityContext (Kubernetes)",
        )
    if "must be installed setuid" in text or not (proc / "self" / "ns" / "user").exists():
        return Refusal(
            "no-setuid-helper",
            f"this kernel has no user namespaces ({first}), so an unprivileged bwrap cannot work: it needs a "
            "setuid-root helper, and the bundled bwrap is not setuid (a wheel cannot install one)",
            "install the distribution's bubblewrap with its setuid bit (e.g. `sudo apt-get install bubblewrap`, "
            "then `sudo chmod u+s /usr/bin/bwrap` where the package does not set it), or use a kernel built with "
            "CONFIG_USER_NS",
        )
    if _read(sysctl / "user" / "max_user_namespaces") == "0":
        return Refusal(
            "kernel-userns-off",
            "user namespaces are turned off in the kernel (/proc/sys/user/max_user_namespaces = 0)"
            + (f"; bwrap: {first}" if text else ""),
            "`sudo sysctl -w user.max_user_namespaces=15000`, and keep it with a line "
            "`user.max_user_namespaces = 15000` in /etc/sysctl.d/90-labkit.conf; or a setuid-root system bwrap",
        )
    if container and (seccomp or refused) and "uid map" not in text:
        filt = "a seccomp filter (Seccomp: 2 in /proc/self/status)" if seccomp else "the container's policy"
        return Refusal(
            "docker-seccomp",
            f"this {container} container refuses new namespaces ({first}): {filt}, as Docker's default "
            "seccomp profile does, blocks unshare/clone of namespaces",
            "run the container with a seccomp profile that allows creating namespaces (the kit's, or "
            "`--security-opt seccomp=unconfined`) and `--security-opt systempaths=unconfined`, as a user "
            "other than root; or grade outside the container",
        )
    if not privileged and _read(sysctl / "kernel" / "unprivileged_userns_clone") == "0":
        return Refusal(
            "debian-userns-clone-off",
            "unprivileged user namespaces are turned off (/proc/sys/kernel/unprivileged_userns_clone = 0)"
            + (f"; bwrap: {first}" if text else ""),
            "`sudo sysctl -w kernel.unprivileged_userns_clone=1`, and keep it with a line "
            "`kernel.unprivileged_userns_clone = 1` in /etc/sysctl.d/90-labkit.conf",
        )
    if not privileged and _read(sysctl / "kernel" / "apparmor_restrict_unprivileged_userns") == "1":
        return Refusal(
            "apparmor-userns",
            "AppArmor restricts unprivileged user namespaces (/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
            f" = 1, Ubuntu 24.04's default) and no profile allows them to {program}"
            + (f"; bwrap: {first}" if text else ""),
            f"allow this bwrap alone: write /etc/apparmor.d/labkit-bwrap with `{apparmor_profile(program)!r}` "
            "(see docs/sandbox.md, 'Isolation and limits') and run `sudo apparmor_parser -r /etc/apparmor.d/labkit-bwrap`;"
            " or, for the whole machine, `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`",
        )
    where = f" (in a {container} container)" if container else ""
    return Refusal(
        "unknown",
        f"bwrap cannot make a sandbox here{where}: {first}",
        "see docs/sandbox.md, 'Isolation and limits': bwrap needs unprivileged user namespaces, or a setuid-root bwrap",
    )
