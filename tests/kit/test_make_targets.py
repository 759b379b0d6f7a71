"""Every make target a document names works on a fresh machine: it has the prerequisites its commands and
tests need, and where a Debian package is missing and cannot be installed it stops with one line that
names the fix, before any test runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from conftest import FAST_MODULES, ROOT

MAKEFILE = ROOT / "Makefile"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RULE = re.compile(r"^([A-Za-z0-9_%.-]+):(?![=:])([^#\n]*)(?:##.*)?$")


def rules() -> dict[str, tuple[list[str], str]]:
    """Each target of the Makefile: (its prerequisites, its recipe's text)."""
    found: dict[str, tuple[list[str], str]] = {}
    target = None
    for line in MAKEFILE.read_text().splitlines():
        if line.startswith("\t") and target is not None:
            found[target][1].append(line)
            continue
        m = RULE.match(line)
        target = m.group(1) if m and not m.group(1).startswith(".") else None
        if target is not None:
            found[target] = (m.group(2).split(), [])
    return {name: (prereqs, "\n".join(recipe)) for name, (prereqs, recipe) in found.items()}


def rule_of(target: str, table: dict) -> str | None:
    """The rule that makes `target`: its own, or a pattern's (`lab-%` makes `lab-3`)."""
    if target in table:
        return target
    return next(
        (p for p in table if "%" in p and re.fullmatch(re.escape(p).replace("%", ".+"), target)), None
    )


def prerequisites(target: str, table: dict) -> set[str]:
    """Every target made before `target`'s recipe runs, and those its recipe makes (`$(MAKE) ... name`)."""
    seen: set[str] = set()
    todo = [target]
    while todo:
        name = rule_of(todo.pop(), table)
        if name is None or name in seen:
            continue
        seen.add(name)
        prereqs, recipe = table[name]
        called = [
            w for part in re.findall(r"\$\(MAKE\)([^;&|>\n]*)", recipe) for w in part.split() if w in table
        ]
        todo += [p for p in prereqs if not p.startswith("$")] + called
    return seen - {rule_of(target, table)}


def recipe_of(target: str, table: dict) -> str:
    """The recipe of `target` and of every target it makes, as one text."""
    names = {rule_of(target, table)} | prerequisites(target, table)
    return "\n".join(table[n][1] for n in names if n)


def documented_targets() -> set[str]:
    table = rules()
    named = {m for doc in DOCUMENTS for m in re.findall(r"\bmake ([a-z][a-z0-9-]*)", doc.read_text())}
    return {t for t in named if rule_of(t, table) is not None}


def modules_run_by(recipe: str) -> list[Path]:
    """The test modules a recipe's pytest runs: those it names, else tests/kit (with -m fast, the fast tier)."""
    runs = []
    for line in recipe.splitlines():
        if "pytest" not in line:
            continue
        named = [ROOT / p for p in re.findall(r"tests/kit/test_[a-z0-9_]+\.py", line)]
        every = sorted((ROOT / "tests" / "kit").glob("test_*.py"))
        if "-m fast" in line:
            every = [p for p in every if p.name in FAST_MODULES or "mark.fast" in p.read_text()]
        runs += named or every
    return runs


def needs_system_deps(module: Path) -> bool:
    """A test module that fails, where a Debian package is missing, saying `make system-deps` installs it."""
    return module != Path(__file__) and "`make system-deps` installs" in module.read_text()


def test_the_documents_name_the_targets_this_checks():
    assert {
        "setup",
        "test",
        "test-fast",
        "lab-3",
        "grade",
        "doctor",
        "lint",
        "system-deps",
    } <= documented_targets()


def test_every_documented_target_has_the_prerequisites_its_commands_and_tests_need():
    """A recipe that runs .venv's Python needs `setup` first; one whose tests need a Debian package (those
    that fail saying `make system-deps` installs it) needs `system-deps` first."""
    table, missing = rules(), []
    for target in sorted(documented_targets()):
        before, recipe = prerequisites(target, table), recipe_of(target, table)
        uses_venv = re.search(r"\$\(PY\)|\$\(VENV\)/bin", recipe) and "-f $(VENV)/.synced" not in recipe
        if (
            uses_venv and target != "setup" and "setup" not in before
        ):  # doctor: .venv's python only where it is
            missing.append(f"make {target}: runs .venv's python without `setup`")
        needing = [p.name for p in modules_run_by(recipe) if needs_system_deps(p)]
        if needing and "system-deps" not in before:
            missing.append(f"make {target}: runs {', '.join(needing)} without `system-deps`")
    assert missing == []


def test_a_test_run_needs_system_deps_when_its_tests_do():
    """The check above, on the rule `make test-fast` had: its tests need chromium, and it did not install it."""
    table = rules() | {"old-fast": (["setup"], "\t$(PY) -m pytest -m fast")}
    recipe = recipe_of("old-fast", table)
    assert "system-deps" not in prerequisites("old-fast", table)
    assert [p.name for p in modules_run_by(recipe) if needs_system_deps(p)] == ["test_class_at_a_glance.py"]


def fake_debian(folder: Path, hidden: str) -> Path:
    """A PATH where `dpkg -s` says `hidden` is not installed, and apt-get and sudo record their arguments and fail
    (a machine with no network, or no right to install)."""
    folder.mkdir()
    log = folder / "calls.log"
    scripts = {
        "dpkg": f'[ "$2" = "{hidden}" ] && exit 1; exit 0\n',
        "apt-get": f'echo "apt-get $*" >> {log}; echo "E: Unable to locate package" >&2; exit 100\n',
        "sudo": f'echo "sudo $*" >> {log}; "$@"\n',
    }
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    return log


def outside_make(fakes: Path) -> dict[str, str]:
    """The environment of a user's shell, the fake Debian first on the PATH: the suite runs under `make -j2`,
    whose MAKEFLAGS name a job server this make cannot reach (it would warn of it on stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    return env | {"PATH": f"{fakes}:{os.environ['PATH']}"}


def test_system_deps_with_a_package_hidden_stops_with_one_line_naming_the_fix(tmp_path):
    log = fake_debian(tmp_path / "bin", "chromium")
    env = outside_make(tmp_path / "bin")
    done = subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "system-deps"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "installing: chromium\n" in done.stdout
    # what make itself adds (`make: ***`, or `make[1]: ***` under another make) and apt-get's own words left out
    said = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*|E: ", line)]
    assert said == [
        "error: the kit's tests need Debian packages that are not installed and could not be installed here: "
        "chromium (.ci/apt-packages.txt); fix: sudo apt-get install chromium, then run make again"
    ]
    assert "apt-get" in log.read_text()  # it tried, as a fresh machine would, before saying so


def test_system_deps_with_every_package_there_installs_nothing(tmp_path):
    log = fake_debian(tmp_path / "bin", "no-such-package")
    env = outside_make(tmp_path / "bin")
    done = subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "system-deps"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout, log.exists()) == (0, "", False)
