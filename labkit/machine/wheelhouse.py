"""The wheelhouse: every locked wheel in one folder, so that `make setup OFFLINE=1` needs no network.

`make wheelhouse` fills the folder (on a machine with network); `make setup OFFLINE=1` installs
from it with no index. Before installing, the Makefile asks this module which of the wheels the
environment needs are not in the folder, so that an incomplete wheelhouse is named package by
package instead of failing on the first one.

It runs before the environment exists (`python3 -m labkit.machine.wheelhouse ...` from the kit's folder),
so it uses the standard library only:

    python3 -m labkit.machine.wheelhouse missing --wheelhouse wheelhouse --uv uv -- [uv sync selection]
    python3 -m labkit.machine.wheelhouse build-requires
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PLANNED = re.compile(r"^\s*\+\s*([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def normalize(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427/503): lower case, runs of -_. as _."""
    return re.sub(r"[-_.]+", "_", name).lower()


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# What a backend asks for, on top of [build-system] requires, to build the editable install that
# `uv sync` (and so `make setup`) makes of the kit.
_EDITABLE_REQUIRES = {"hatchling.build": ["editables"]}


def build_requires() -> list[str]:
    """What building the kit needs: [build-system] requires, plus the backend's editable extras."""
    system = pyproject().get("build-system", {})
    return list(system.get("requires", [])) + _EDITABLE_REQUIRES.get(system.get("build-backend", ""), [])


def _requirement_name(requirement: str) -> str:
    return normalize(re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0])


def present(wheelhouse: Path) -> dict[str, set[str]]:
    """Normalized name -> versions of the wheels in the folder."""
    found: dict[str, set[str]] = {}
    for wheel in Path(wheelhouse).glob("*.whl"):
        parts = wheel.name.split("-")
        if len(parts) >= 5:
            found.setdefault(normalize(parts[0]), set()).add(parts[1].lower())
    return found


class PlanError(RuntimeError):
    pass


def needed(uv: str, selection: list[str]) -> list[tuple[str, str]]:
    """(name, version) of every locked package this machine's environment would install.

    Asks uv itself, offline and into a throwaway environment path, so that markers (platform,
    Python version) are decided exactly as `uv sync` decides them. The project itself is left
    out: it is built from the kit's own folder, by the build backend (see `build_requires`).
    """
    project = normalize(pyproject()["project"]["name"])
    with tempfile.TemporaryDirectory(prefix="labkit-plan-") as scratch:
        env = dict(
            os.environ,
            UV_PROJECT_ENVIRONMENT=str(Path(scratch) / "venv"),
            UV_PYTHON_DOWNLOADS="never",
            NO_COLOR="1",
        )
        done = subprocess.run(
            [uv, "sync", "--frozen", "--offline", "--dry-run", *selection],
            cwd=ROOT,
            env=env,
            check=False,
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise PlanError((done.stderr or done.stdout).strip())
    plan = []
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        m = _PLANNED.match(line)
        if m and normalize(m.group(1)) != project:
            plan.append((m.group(1), m.group(2)))
    return plan


def missing(wheelhouse: Path, uv: str, selection: list[str]) -> list[str]:
    """Requirements (name==version, or a build requirement) with no wheel in the folder."""
    found = present(wheelhouse)
    lacking = [
        f"{name}=={version}"
        for name, version in needed(uv, selection)
        if version.lower() not in found.get(normalize(name), set())
    ]
    lacking += [
        f"{req} (the build backend of the kit itself)"
        for req in build_requires()
        if _requirement_name(req) not in found
    ]
    return lacking


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m labkit.machine.wheelhouse", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("missing", help="list the wheels the environment needs that the wheelhouse lacks")
    m.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    m.add_argument("--uv", default="uv")
    m.add_argument("selection", nargs="*", help="the uv sync options that select groups and extras")
    sub.add_parser("build-requires", help="print the build backend's requirements, one a line")
    args = p.parse_args(argv)

    if args.command == "build-requires":
        print("\n".join(build_requires()))
        return 0

    folder = args.wheelhouse
    if not folder.is_dir() or not any(folder.glob("*.whl")):
        print(
            f"error: no wheelhouse at {folder}/: run `make wheelhouse` on a machine with network "
            "(same platform and Python version as this one), then copy the folder here",
            file=sys.stderr,
        )
        return 1
    try:
        lacking = missing(folder, args.uv, args.selection)
    except PlanError as e:
        print(f"error: could not list the locked packages for this machine:\n{e}", file=sys.stderr)
        return 1
    if lacking:
        print(
            f"error: the wheelhouse {folder}/ is incomplete: {len(lacking)} package(s) this machine needs "
            "have no wheel there:",
            file=sys.stderr,
        )
        for requirement in lacking:
            print(f"  - {requirement}", file=sys.stderr)
        print(
            "Run `make wheelhouse` where there is network, on the same platform and Python version as this "
            "machine (and with the same EXTRAS), then copy wheelhouse/ here.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
