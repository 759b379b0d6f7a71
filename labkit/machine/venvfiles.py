"""What the distributions in an environment installed, read from their RECORD files (standard library only).

Two checks, both used by set-up and by the kit's tests:

- `clashes`: top-level modules that more than one distribution installs. Two such distributions write
  into the same files, and whichever was installed last wins (checkov's bc-python-hcl2 and python-hcl2
  both install `hcl2`). Namespace packages (a folder without `__init__.py`) are shared by design and
  are not clashes.
- `damaged`: distributions some of whose files are gone. Removing one of two clashing distributions
  deletes the files they shared, leaving the other one half there.

    python -m labkit.machine.venvfiles [SITE_PACKAGES]   # prints both, exits 1 when there is either
"""

from __future__ import annotations

import csv
import sys
import sysconfig
from pathlib import Path


def _records(site: Path) -> dict[str, list[str]]:
    """{distribution name: the paths its RECORD lists, relative to site}."""
    found: dict[str, list[str]] = {}
    for info in sorted(site.glob("*.dist-info")):
        record = info / "RECORD"
        if not record.is_file():
            continue
        name = info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        with open(record, newline="", encoding="utf-8", errors="replace") as f:
            found[name] = [row[0] for row in csv.reader(f) if row and row[0]]
    return found


def _module_of(entry: str) -> str | None:
    """The top-level module an installed path belongs to, or None (metadata, scripts, data, .pth files)."""
    parts = entry.replace("\\", "/").split("/")
    if parts[0] in ("..", "") or parts[0].endswith((".dist-info", ".data")) or parts[0] == "__pycache__":
        return None
    if len(parts) == 1:
        name = parts[0]
        if name.endswith(".py"):
            return name[:-3]
        if name.endswith((".so", ".pyd")):
            return name.split(".", 1)[0]
        return None
    return parts[0]


def top_level_modules(entries: list[str]) -> set[str]:
    """The regular top-level modules and packages among a RECORD's paths (not namespace packages)."""
    modules = set()
    for entry in entries:
        module = _module_of(entry)
        if module is None:
            continue
        parts = entry.replace("\\", "/").split("/")
        if (
            len(parts) == 1
            or parts[1] == "__init__.py"
            or (len(parts) == 2 and parts[1].startswith("__init__."))
        ):
            modules.add(module)
    return modules


def clashes(site: Path) -> dict[str, list[str]]:
    """{top-level module: the distributions that install it}, for modules more than one installs."""
    owners: dict[str, list[str]] = {}
    for name, entries in _records(site).items():
        for module in top_level_modules(entries):
            owners.setdefault(module, []).append(name)
    return {m: sorted(names) for m, names in sorted(owners.items()) if len(names) > 1}


def damaged(site: Path) -> dict[str, list[str]]:
    """{distribution: files its RECORD lists that are gone} (bytecode caches not counted)."""
    out: dict[str, list[str]] = {}
    for name, entries in _records(site).items():
        gone = [e for e in entries if "__pycache__" not in e and not (site / e).exists()]
        if gone:
            out[name] = gone
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    site = Path(args[0]) if args else Path(sysconfig.get_paths()["purelib"])
    bad = 0
    for module, names in clashes(site).items():
        print(f"module `{module}` is installed by {', '.join(names)}: whichever was installed last wins")
        bad = 1
    for name, gone in damaged(site).items():
        print(f"{name}: {len(gone)} of its files are gone (e.g. {gone[0]}); reinstall it")
        bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
