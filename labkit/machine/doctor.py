"""`make doctor`: what this machine can do for the kit, what is missing, and the fix for each.

One screen of checks: Python, the environment against uv.lock, the sandbox, the device
configurations, Docker, Chromium, disk and memory. Each check says ok, a warning, or a failure;
the exit status is 1 when something that the purposes asked for (`--for lab,grade,...`) cannot
work, else 0. It runs with the environment's Python when `.venv` is finished and with the
system's otherwise (the Makefile decides), so it imports only the standard library and the kit's
own standard-library modules at the top.

    python -m labkit.machine.doctor [--for lab,grade,test,docker,browser]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit.exitcodes import ExitCode
from labkit.machine import envsetup

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30
OK, WARN, FAIL = "ok", "warn", "fail"
MARK = {OK: "✓", WARN: "!", FAIL: "✗"}
# What each purpose needs: the checks whose failure makes `doctor --for PURPOSE` exit 1.
PURPOSES = {
    "lab": {"python", "environment", "cpu", "disk"},
    "grade": {"python", "environment", "cpu", "sandbox", "disk", "memory"},
    "test": {"python", "environment", "cpu", "sandbox", "disk", "memory"},
    "docker": {"docker"},
    "browser": {"chromium"},
}


@dataclass
class Check:
    key: str  # what PURPOSES name
    title: str
    status: str
    detail: str
    fix: str = ""


def _run(cmd: list[str], timeout: float = 20) -> tuple[int, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return done.returncode, (done.stdout + done.stderr).strip()


def check_python() -> Check:
    problem = envsetup.python_problem()
    version = ".".join(str(n) for n in sys.version_info[:3])
    if problem:
        return Check(
            "python",
            "Python",
            FAIL,
            f"Python {version} ({sys.executable}) is older than 3.11",
            "install Python 3.11 or newer and run `make ... PYTHON=python3.11`",
        )
    return Check("python", "Python", OK, f"Python {version} ({sys.executable})")


def check_jax() -> Check:
    """Which JAX this Python gets (the lock has two: 0.12 on Python 3.12 and newer, 0.10.2 on 3.11)."""
    here = tuple(sys.version_info[:3])
    locked = envsetup.jax_for(here)
    try:
        from importlib.metadata import version

        detail = f"JAX {version('jax')}, installed (uv.lock gives Python {here[0]}.{here[1]} JAX {locked})"
    except Exception:  # noqa: BLE001 - not installed yet (the system's Python, before `make setup`)
        detail = f"JAX {locked} from uv.lock for Python {here[0]}.{here[1]} (not installed yet)"
    if here[:2] >= envsetup.NEWER_JAX_FROM:
        return Check("jax", "JAX", OK, detail)
    newer = envsetup.jax_for(envsetup.NEWER_JAX_FROM)
    found = envsetup.pick_python()
    if found and found[0][:2] >= envsetup.NEWER_JAX_FROM:
        fix = f"Python {found[0][0]}.{found[0][1]} is here: `make setup PYTHON={found[1]}` makes .venv again with it"
    else:
        fix = (
            "install Python 3.12 or 3.13 (Debian 13 and Ubuntu 24.04 have one as python3; elsewhere "
            "`pyenv install 3.13` or `uv python install 3.13`), then `make setup PYTHON=python3.13`"
        )
    return Check(
        "jax",
        "JAX",
        WARN,
        f"{detail}; JAX {newer}, what Colab and current TPU images run, needs Python 3.12 or newer",
        fix,
    )


def check_environment(root: Path = ROOT) -> Check:
    venv, title = root / ".venv", "Environment (.venv)"
    stamp = venv / envsetup.STAMP
    if not (venv / "bin" / "python").exists():
        return Check(
            "environment", title, FAIL, "not made yet", "`make setup` (the first `make lab-N` does it too)"
        )
    if not stamp.exists():
        return Check(
            "environment",
            title,
            FAIL,
            "its last set-up did not finish",
            "`make setup` installs again (the log of the last try is build/setup.log)",
        )
    selection = stamp.read_text().split()
    if stamp.stat().st_mtime < (root / "uv.lock").stat().st_mtime:
        return Check("environment", title, FAIL, "older than uv.lock", "`make setup`")
    uv = shutil.which("uv") or str(root / ".tools" / "bin" / "uv")
    if os.access(uv, os.X_OK):
        code, out = _run([uv, "sync", "--frozen", "--check", "--project", str(root), *selection])
        if code != 0:
            changes = [line.strip() for line in out.splitlines() if line.strip()[:1] in "+-~"]
            return Check(
                "environment",
                title,
                FAIL,
                f"does not match uv.lock: {len(changes)} package(s) differ ({', '.join(changes[:3])})",
                "`make setup` (or `make setup FORCE=1` after editing .venv by hand)",
            )
    described = envsetup.describe_selection(selection)
    return Check("environment", title, OK, f"matches uv.lock ({described})")


def check_sandbox() -> Check:
    from labkit.run import modes

    found = modes.finding()
    if found.program:
        skipped = "".join(f"; not used: {p.lines()[0]}" for p in found.problems)
        return Check("sandbox", "Sandbox (bubblewrap)", OK, f"works: {found.summary()}{skipped}")
    report = found.report().splitlines()
    fixes = [line.strip() for line in report if line.strip().lower().startswith("fix")]
    return Check(
        "sandbox",
        "Sandbox (bubblewrap)",
        FAIL,
        " / ".join(line.strip() for line in report[:3]),
        "; ".join(fixes)
        or "grading refuses to run without one: `make isolation` says why, and docs/sandbox.md, "
        "'Isolation and limits', how to get one",
    )


def check_configurations() -> list[Check]:
    from labkit.course import configs

    out = []
    for config in configs.CONFIGS.values():
        ok, reason = config.availability()
        # A compile-only TPU configuration needs libtpu, which its own line judges (`check_libtpu`);
        # a simulated CPU configuration that cannot run here is a failure of this machine.
        key = "libtpu" if config.compile_for else config.platform
        status = OK if ok else (FAIL if key == "cpu" else WARN)
        out.append(
            Check(
                key,
                f"Configuration {config.name}",
                status,
                config.summary if ok else f"{config.summary}: {reason}",
            )
        )
    holders = _device_holders()
    if holders:
        out.append(
            Check(
                "tpu",
                "Accelerator in use",
                WARN,
                "held by " + ", ".join(holders),
                "stop that process (often a Jupyter kernel) before `make lab-N`: one process owns a TPU",
            )
        )
    return out


LIBTPU_LICENCE = (
    "Google Cloud Platform Terms of Service"  # what libtpu's own metadata says, when it is not here
)


def check_libtpu() -> Check:
    """libtpu: the TPU compiler of the compile-only TPU configurations (v5e-8, ...); never in the lean set-up."""
    from importlib import metadata

    from labkit.course import configs

    names = ", ".join(c.name for c in configs.CONFIGS.values() if c.compile_for)
    try:
        dist = metadata.distribution("libtpu")
    except metadata.PackageNotFoundError:
        return Check(
            "libtpu",
            "TPU compiler (libtpu)",
            WARN,
            f"not installed: the configurations {names} are skipped",
            f"`make setup EXTRAS=tpu` adds it ({envsetup.libtpu_download()} to download; licence: "
            f"{LIBTPU_LICENCE}); grading and "
            f"`make test` use it, a student's lean set-up never needs it",
        )
    size = sum(f.size or 0 for f in dist.files or [])
    licence = dist.metadata.get("License") or dist.metadata.get("License-Expression") or LIBTPU_LICENCE
    return Check(
        "libtpu",
        "TPU compiler (libtpu)",
        OK,
        f"libtpu {dist.version}, {size / 1e6:.0f} MB, licence: {licence}; compiles for {names}",
    )


def _device_holders() -> list[str]:
    """Processes that hold a TPU or GPU device open (only those this user may inspect)."""
    nodes = ("/dev/accel", "/dev/vfio/", "/dev/nvidia")
    holders = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd).startswith(nodes) for fd in fd_dir.iterdir()):
                pid = fd_dir.parent.name
                name = (fd_dir.parent / "comm").read_text().strip()
                if int(pid) != os.getpid():
                    holders.append(f"{name} (pid {pid})")
        except (OSError, ValueError):
            continue
    return holders


def check_docker() -> Check:
    client = shutil.which("docker")
    if not client:
        return Check(
            "docker",
            "Docker",
            FAIL,
            "no docker client on the PATH",
            "install Docker (Debian: apt install docker.io) for the course image; not needed otherwise",
        )
    code, out = _run([client, "version", "--format", "{{.Server.Version}}"])
    if code != 0:
        if "permission denied" in out.lower():
            why, fix = (
                "the engine refuses this user (no permission on its socket)",
                "add yourself to the `docker` group, or run as root",
            )
        else:
            why, fix = (
                "no engine answers"
                + (f" at {os.environ['DOCKER_HOST']}" if "DOCKER_HOST" in os.environ else ""),
                "start the Docker engine (or set DOCKER_HOST to one that runs)",
            )
        return Check("docker", "Docker", FAIL, f"client {client}; {why}", fix)
    _, buildx = _run([client, "buildx", "version"])
    builder = (
        "BuildKit through buildx"
        if buildx.lower().startswith("github.com/docker/buildx")
        else "BuildKit with DOCKER_BUILDKIT=1 (no buildx plugin)"
    )
    return Check("docker", "Docker", OK, f"engine {out.splitlines()[-1]} through {client}; {builder}")


def check_chromium() -> Check:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        program = shutil.which(name)
        if program:
            _, version = _run([program, "--version"])
            first = next(
                (line for line in version.splitlines() if line.lower().startswith(("chromium", "google"))),
                program,
            )
            return Check("chromium", "Chromium", OK, first)
    return Check(
        "chromium",
        "Chromium",
        FAIL,
        "not found",
        "only the HTML scoreboard's page test and the JupyterLab test need it (Debian: apt install chromium)",
    )


def check_disk(root: Path = ROOT, need: int = 3 * GiB) -> Check:
    free = shutil.disk_usage(root).free
    status = OK if free >= need else FAIL
    return Check(
        "disk",
        "Disk",
        status,
        f"{free / GiB:.1f} GiB free at {root}",
        ""
        if status == OK
        else f"the environment and a lab's runs need about {need / GiB:.0f} GiB: free some",
    )


def check_memory(per_run: int = 4 * GiB) -> Check:
    available = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        return Check("memory", "Memory", WARN, "unknown (no /proc/meminfo)")
    cores = os.cpu_count() or 1
    jobs = max(1, min(cores, available // per_run))
    status = OK if available >= per_run else FAIL
    return Check(
        "memory",
        "Memory",
        status,
        f"{available / GiB:.1f} GiB available, {cores} cores: grading runs up to {jobs} notebook(s) at once "
        f"at the default 4 GiB each",
        "" if status == OK else "lower the limit (`--memory 2G`) or grade on a larger machine",
    )


def run_checks(root: Path = ROOT) -> list[Check]:
    checks = [check_python(), check_jax(), check_environment(root)]
    for optional in (check_sandbox, check_configurations, check_libtpu):
        try:
            result = optional()
        except Exception as e:  # noqa: BLE001 - a broken environment must not hide the rest of the screen
            result = Check(
                optional.__name__.removeprefix("check_"),
                optional.__name__,
                FAIL,
                f"could not be checked: {type(e).__name__}: {e}",
                "`make setup`",
            )
        checks += result if isinstance(result, list) else [result]
    return checks + [check_docker(), check_chromium(), check_disk(root), check_memory()]


def render(checks: list[Check], required: set[str]) -> str:
    width = max(len(c.title) for c in checks)
    lines = []
    for c in checks:
        status = c.status if (c.status != FAIL or c.key in required) else WARN
        lines.append(f" {MARK[status]} {c.title:<{width}}  {c.detail}")
        if c.fix and status != OK:
            lines.append(f"   {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit doctor", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--for",
        dest="purposes",
        default="lab",
        help=f"what you mean to do, comma-separated: {', '.join(PURPOSES)} (default: lab)",
    )
    args = p.parse_args(argv)
    purposes = [x.strip() for x in args.purposes.split(",") if x.strip()]
    unknown = [x for x in purposes if x not in PURPOSES]
    if unknown:
        print(
            f"error: unknown purpose {', '.join(unknown)}; choose from {', '.join(PURPOSES)}", file=sys.stderr
        )
        return ExitCode.REFUSED
    required = set().union(*(PURPOSES[x] for x in purposes))
    checks = run_checks()
    print(f"What this machine can do for the kit (checked for: {', '.join(purposes)})\n")
    print(render(checks, required))
    failing = [c for c in checks if c.status == FAIL and c.key in required]
    print()
    if failing:
        print(f"NOT READY for {', '.join(purposes)}: " + "; ".join(c.title for c in failing))
        return ExitCode.FAILED
    print(f"READY for {', '.join(purposes)}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
