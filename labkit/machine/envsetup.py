"""Making `.venv` from uv.lock, quietly: a few lines on the terminal, the rest in a log.

`make setup` (and so the first `make lab-N`) calls this module with the system's Python, before
the environment exists, so it uses the standard library only (and runs on Python 3.8 and newer far
enough to say that the kit needs 3.11):

    python3 -m labkit.machine.envsetup check-python
    python3 -m labkit.machine.envsetup pick-python      (the newest supported Python here, as a path)
    python3 -m labkit.machine.envsetup pick-python --other-than PYTHON   (the newest of the other JAX world)
    python3 -m labkit.machine.envsetup remove-other-venv --venv .venv   (an offline set-up's first step)
    python3 -m labkit.machine.envsetup sync --uv UV --log build/setup.log -- [uv sync selection]

The Python that runs `sync` is the one `.venv` is made with: `PYTHON=` when given, else what
`pick-python` prints, the newest supported one on the machine (on the PATH, or installed by pyenv
but not selected there); uv never downloads one. Which JAX comes with it is the lock's
business: JAX 0.12 on Python 3.12 and newer, 0.10.2 on 3.11 (pyproject.toml says so with markers).
A `.venv` made with another Python is removed and made again, never synced over.

`sync` says what it installs and about how much it downloads, runs `uv sync --frozen` with its
output in the log, and says how long it took. When it fails, the end of the log is shown with
the log's name, a full disk is named as such, and the environment is marked unfinished so that
the next `make` installs again instead of taking a half-made `.venv` for a good one.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MINIMUM_PYTHON = (3, 11)
# The names the kit looks for on the PATH, newest first. A pyenv shim of a version that is installed
# but not selected does not run; pyenv's own folder of versions is looked in as well.
CANDIDATES = ("python3.13", "python3.12", "python3.11", "python3")
NEWEST_SUPPORTED = (3, 13)
NEWER_JAX_FROM = (3, 12)
# Prints the interpreter a Python runs on, by its real path: outside any virtual environment (a
# `python3.11` found first on the PATH may be .venv's own: an activated .venv, the course image), and
# the same for every user (the Makefile names .venv's interpreter the same way).
BASE_INTERPRETER = "import os, sys; print(os.path.realpath(sys.executable))"
# The file whose content is the selection `.venv` was made with; written only after a set-up
# succeeded, so a missing or stale one always means "install again".
STAMP = ".synced"
_PLANNED = re.compile(r"^\s*\+\s*([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def python_problem(
    version: tuple[int, ...] = tuple(sys.version_info[:3]), executable: str = sys.executable
) -> str:
    """One line saying why this Python cannot run the kit, or "" when it can."""
    if tuple(version[:2]) >= MINIMUM_PYTHON:
        return ""
    have = ".".join(str(n) for n in version)
    need = ".".join(str(n) for n in MINIMUM_PYTHON)
    return (
        f"error: the kit needs Python {need} or newer, and `{Path(executable).name}` is Python {have} "
        f"({executable}). Install Python {need} or newer and name it: `make lab-3 PYTHON=python{need}`."
    )


def jax_for(version: tuple[int, ...], pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The JAX version the lock gives Python `version`, read from the project's `jax==V; python_version ..`."""
    ops = {">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "==": lambda a, b: a == b}
    text = pyproject.read_text()
    for m in re.finditer(
        r"""["']jax==([^;"'\s]+)\s*;\s*python_version\s*(>=|<|==)\s*['"](\d+)\.(\d+)['"]""", text
    ):
        if ops[m.group(2)](tuple(version[:2]), (int(m.group(3)), int(m.group(4)))):
            return m.group(1)
    m = re.search(r"""["']jax==([^;"'\s]+)["']""", text)
    return m.group(1) if m else "unknown"


def pythons_here(candidates: tuple[str, ...] = CANDIDATES) -> list[tuple[str, tuple[int, ...], str]]:
    """The candidates that run here, as (name, version, executable); a name on the PATH that does
    not run (a pyenv shim for a version not selected, say) is passed over."""
    found, seen = [], set()
    for name in candidates:
        path = shutil.which(name)
        if not path:
            continue
        try:
            out = subprocess.run(
                [path, "-c", BASE_INTERPRETER + "; print(*sys.version_info[:3])"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = out.stdout.split("\n")
        if out.returncode != 0 or len(lines) < 2:
            continue
        executable, version = lines[0], tuple(int(n) for n in lines[1].split())  # a real path already
        if executable not in seen:
            seen.add(executable)
            found.append((name, version, executable))
    return found


def _pyenv_pythons() -> list[str]:
    """The interpreters pyenv has installed (`$PYENV_ROOT/versions/3.X.Y/bin/python3.X`), selected or not."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    try:
        found = root.glob("versions/3.*/bin/python3.*")
        return sorted(str(p) for p in found if re.fullmatch(r"python3\.\d+", p.name))
    except OSError:
        return []


def pick_python(
    candidates: tuple[str, ...] = CANDIDATES, other_than: tuple[int, ...] | None = None
) -> tuple[tuple[int, ...], str] | None:
    """The newest supported Python that runs here, as (version, executable): the PATH's names first,
    then pyenv's installed versions; None when there is none. With `other_than` (a Python version),
    the newest one whose JAX is not that version's (3.11 against 3.12 and newer, and back)."""
    supported = [
        (version, exe)
        for _, version, exe in pythons_here((*candidates, *_pyenv_pythons()))
        if MINIMUM_PYTHON <= tuple(version[:2]) <= NEWEST_SUPPORTED
    ]
    if other_than is not None:
        supported = [
            (version, exe)
            for version, exe in supported
            if (tuple(version[:2]) >= NEWER_JAX_FROM) != (tuple(other_than[:2]) >= NEWER_JAX_FROM)
        ]
    if not supported:
        return None
    best = max(version[:2] for version, _ in supported)
    return next((version, exe) for version, exe in supported if version[:2] == best)


def venv_python(venv: Path) -> tuple[int, ...] | None:
    """The Python version `venv` was made with (from its pyvenv.cfg), or None when there is none."""
    try:
        text = (venv / "pyvenv.cfg").read_text()
    except OSError:
        return None
    m = re.search(r"^\s*(?:version_info|version)\s*=\s*(\d+)\.(\d+)(?:\.(\d+))?", text, re.MULTILINE)
    return tuple(int(n) for n in m.groups() if n is not None) if m else None


def remove_if_made_with_another_python(venv: Path) -> None:
    """A .venv made with another Python than this one is removed, to be made again, never synced over."""
    made_with, here = venv_python(venv), tuple(sys.version_info[:2])
    if made_with is not None and made_with[:2] != here:
        print(
            f"  {venv.name}/ was made with Python {_dotted(made_with)}: removing it to make it again "
            f"with {_dotted(here)}.",
            flush=True,
        )
        shutil.rmtree(venv)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(n) for n in version)


def human(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}" if n >= 10 * scale else f"{n / scale:.1f} {unit}"
    return f"{n:.0f} bytes"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _platform_tags() -> tuple[str, set[str]]:
    """(this machine's architecture as wheel tags spell it, the Python tags a wheel may carry here)."""
    machine = os.uname().machine if hasattr(os, "uname") else ""
    machine = {"arm64": "aarch64", "amd64": "x86_64"}.get(machine.lower(), machine.lower())
    major, minor = sys.version_info[:2]
    pythons = {"py3", f"py{major}", f"py{major}{minor}", f"cp{major}{minor}", "py2.py3"}
    pythons |= {f"cp{major}{m}" for m in range(2, minor + 1)}  # abi3 wheels of older minors
    return machine, pythons


def _fits(wheel: str, machine: str, pythons: set[str]) -> bool:
    """Whether a wheel file name would install on this machine (a close reading of its tags)."""
    parts = wheel[:-4].split("-")
    if len(parts) < 5:
        return False
    python, abi, platform = parts[-3], parts[-2], parts[-1]
    if not any(p in pythons for p in python.split(".")):
        return False
    if abi not in ("none", "abi3") and not abi.startswith(f"cp{sys.version_info[0]}{sys.version_info[1]}"):
        return False
    if platform == "any":
        return True
    system = sys.platform
    tags = platform.split(".")
    if system.startswith("linux"):
        return any(("linux" in t) and t.endswith(machine) for t in tags)
    if system == "darwin":
        return any(t.startswith("macosx") and t.endswith((machine, "universal2")) for t in tags)
    return any(t.startswith("win") for t in tags) if system.startswith("win") else False


def lock_sizes(lock: Path) -> dict[tuple[str, str], int]:
    """(name, version) -> bytes of the wheel this machine would download, read from uv.lock."""
    import tomllib

    machine, pythons = _platform_tags()
    sizes: dict[tuple[str, str], int] = {}
    for package in tomllib.loads(lock.read_text()).get("package", []):
        fitting = [
            w.get("size", 0)
            for w in package.get("wheels", [])
            if _fits(w.get("url", "").rsplit("/", 1)[-1], machine, pythons)
        ]
        if fitting:
            sizes[(_normalize(package["name"]), str(package.get("version")))] = max(fitting)
    return sizes


def libtpu_download(lock: Path | None = None) -> str:
    """What `make setup EXTRAS=tpu` downloads for libtpu, as set-up says it ("about 214 MB"), from uv.lock."""
    try:  # `make doctor` may run on a Python too old for tomllib, or beside a lock it cannot read
        sizes = [n for (name, _), n in lock_sizes(lock or ROOT / "uv.lock").items() if name == "libtpu"]
    except (ImportError, OSError, ValueError):
        sizes = []
    return f"about {human(max(sizes))}" if sizes else "a size uv.lock does not give for this machine"


def _uv_env(venv: Path) -> dict[str, str]:
    # Bytecode compiled once, at setup: every run's sandbox sees the environment read-only, so a module without
    # its .pyc (all of them: uv writes none by default) is compiled again in every process that imports it,
    # about 1.6 s of CPU for JAX alone at each kernel, verifier and warm server start.
    return dict(
        os.environ,
        UV_PROJECT_ENVIRONMENT=str(venv),
        UV_PYTHON_DOWNLOADS="never",
        UV_COMPILE_BYTECODE="1",
        NO_COLOR="1",
    )


def plan(uv: str, selection: list[str], venv: Path) -> list[tuple[str, str]] | None:
    """What `uv sync` would install into `venv` (name, version); None when uv cannot say."""
    try:
        done = subprocess.run(
            [uv, "sync", "--frozen", "--dry-run", *selection],
            cwd=ROOT,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
            env=_uv_env(venv),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    found = []
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        m = _PLANNED.match(line)
        if m and _normalize(m.group(1)) != "labkit":
            found.append((_normalize(m.group(1)), m.group(2)))
    return found


def describe_selection(selection: list[str]) -> str:
    groups = [selection[i + 1] for i, a in enumerate(selection[:-1]) if a == "--group"]
    extras = [selection[i + 1] for i, a in enumerate(selection[:-1]) if a == "--extra"]
    if "--no-default-groups" not in selection:
        groups = ["the default groups"]
    words = ", ".join(groups) if groups else "no extra groups"
    return words + (f"; extras: {', '.join(extras)}" if extras else "")


def _failure_hint(log_text: str, venv: Path) -> str:
    if "No space left on device" in log_text or "os error 28" in log_text:
        free = shutil.disk_usage(venv.parent if venv.parent.exists() else ROOT).free
        return (
            f"the disk is full (no space left on device; {human(free)} free where .venv lives). "
            "Free some space (`make clean`, uv's cache: `uv cache clean`) and run the command again."
        )
    if re.search(
        r"(dns error|failed to lookup|Could not connect|connection (refused|reset)|timed out|"
        r"certificate)",
        log_text,
        re.I,
    ):
        return (
            "the package index could not be reached. Check the network (and a proxy's CA with "
            "SSL_CERT_FILE), or set up offline from a wheelhouse: `make setup OFFLINE=1` (see docs/containers.md, 'Offline, without Docker')."
        )
    return "see the log above."


def sync(uv: str, selection: list[str], venv: Path, log: Path) -> int:
    """`uv sync --frozen SELECTION` into `venv`, its output in `log`; a few lines on the terminal."""
    stamp = venv / STAMP
    log.parent.mkdir(parents=True, exist_ok=True)
    # From here on, .venv is unfinished until the stamp is written again at the end.
    try:
        stamp.unlink()
    except OSError:
        pass
    started = time.monotonic()
    _say_which_python()
    remove_if_made_with_another_python(venv)
    if "--python" not in selection:
        selection = ["--python", os.path.realpath(sys.executable), *selection]
    _say_what_is_planned(uv, selection, venv)
    print(f"  the full list goes to {_shown(log)}", flush=True)
    with open(log, "w") as out:
        out.write(f"$ {uv} sync --frozen {' '.join(selection)}\n")
        out.flush()
        code = _uv_sync(uv, selection, venv, out)
        if code == 0:
            code = _repair(uv, selection, venv, out)
    seconds = time.monotonic() - started
    if code != 0:
        text = log.read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-15:])
        print(
            f"{tail}\nerror: setting up {venv.name}/ failed after {seconds:.0f} s: {_failure_hint(text, venv)}\n"
            f"  full log: {_shown(log)}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    try:
        stamp.write_text(" ".join(selection) + "\n")
    except OSError as e:
        print(
            f"error: {venv.name}/ was installed but could not be marked finished ({e}); "
            f"{_failure_hint(str(e), venv)}",
            file=sys.stderr,
        )
        return 1
    print(f"  done in {seconds:.0f} s.", flush=True)
    return 0


def _say_which_python() -> None:
    """The Python the environment is made with, and the JAX that goes with it."""
    here = tuple(sys.version_info[:3])
    print(
        f"Python {_dotted(here)} ({sys.executable}): JAX {jax_for(here)}"
        + (
            ""
            if here[:2] >= NEWER_JAX_FROM
            else f" (JAX {jax_for(NEWER_JAX_FROM)} needs Python {_dotted(NEWER_JAX_FROM)} or newer)"
        )
        + ".",
        flush=True,
    )


def _say_what_is_planned(uv: str, selection: list[str], venv: Path) -> None:
    """How many packages the sync installs and about how much it downloads, where uv can tell."""
    planned = plan(uv, selection, venv)
    what = f"Setting up {venv.name}/ from uv.lock ({describe_selection(selection)})"
    if planned:
        sizes = lock_sizes(ROOT / "uv.lock")
        total = sum(sizes.get(p, 0) for p in planned)
        print(
            f"{what}: {len(planned)} packages, about {human(total)} to download "
            "(less when uv's cache has them).",
            flush=True,
        )
    elif planned == []:
        print(f"{what}: nothing new to install.", flush=True)
    else:
        print(f"{what}.", flush=True)


def _uv_sync(uv: str, selection: list[str], venv: Path, out, *more: str) -> int:
    try:
        return subprocess.run(
            [uv, "sync", "--frozen", *selection, *more],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_uv_env(venv),
            check=False,
        ).returncode
    except OSError as e:
        out.write(f"{e}\n")
        return 127


def _repair(uv: str, selection: list[str], venv: Path, out) -> int:
    """Reinstall any distribution whose files are gone: removing one of two distributions that
    installed the same module (as an older lock had) deletes the other one's files too."""
    from labkit.machine import venvfiles

    sites = sorted(venv.glob("lib/python3*/site-packages"))
    broken = sorted({name for site in sites for name in venvfiles.damaged(site)})
    if not broken:
        return 0
    print(f"  reinstalling {', '.join(broken)}: some of their files were gone.", flush=True)
    out.write(f"reinstalling (files gone): {' '.join(broken)}\n")
    out.flush()
    return _uv_sync(uv, selection, venv, out, *[a for name in broken for a in ("--reinstall-package", name)])


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m labkit.machine.envsetup", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("check-python", help="exit 1, with one line, when this Python is too old for the kit")
    pick = sub.add_parser(
        "pick-python", help="print the newest supported Python here (exit 1 when there is none)"
    )
    pick.add_argument(
        "--other-than",
        metavar="PYTHON",
        help="the newest one whose JAX differs from this Python's (the other world of the lock)",
    )
    fresh = sub.add_parser(
        "remove-other-venv", help="remove --venv when it was made with another Python than this one"
    )
    fresh.add_argument("--venv", type=Path, default=ROOT / ".venv")
    s = sub.add_parser("sync", help="uv sync --frozen SELECTION, quietly, into --venv")
    s.add_argument("--uv", default="uv")
    s.add_argument("--venv", type=Path, default=ROOT / ".venv")
    s.add_argument("--log", type=Path, default=ROOT / "build" / "setup.log")
    s.add_argument("selection", nargs="*", help="the uv sync options that select groups and extras")
    args = p.parse_args(argv)
    if args.command == "pick-python":
        other = None
        if args.other_than:
            found = pythons_here((args.other_than,))
            if not found:
                return 1
            other = found[0][1]
        picked = pick_python(other_than=other)
        if picked is None:
            return 1
        print(picked[1])
        return 0
    problem = python_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    if args.command == "check-python":
        return 0
    if args.command == "remove-other-venv":
        remove_if_made_with_another_python(args.venv.resolve())
        return 0
    return sync(args.uv, args.selection, args.venv.resolve(), args.log)


if __name__ == "__main__":
    sys.exit(main())
