"""The README's first commands, typed as it writes them, in a fresh copy of the kit, with no setting a user would not make.

Each test takes its command line from README.md or the guides in docs/ (`readme_line`): a text that
says something else changes what is run, and one that no longer says it fails the test. The copy
is the kit's tracked and new files (what a clone of this tree would hold, without .venv, build/ or
anything ignored), so the commands make their own environment exactly as on a new machine, from
relative paths and default arguments. Variables of the kit's own (LABKIT_*) are removed from the
environment: a user has none of them.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


DOCS = sorted((ROOT / "docs").glob("*.md"))  # the guides the README points to (the site's pages)


def documentation() -> str:
    """The README and the guides in docs/: what users read, and type from."""
    return "\n".join(p.read_text() for p in (README, *DOCS))


def readme_lines() -> list[str]:
    """Every line of the README's and the guides' bash blocks, as a user would type it (its comment left out)."""
    lines, inside = [], False
    for line in documentation().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash" if not inside else False
            continue
        if inside:
            lines.append(re.sub(r"\s+#.*$", "", line).strip())
    return lines


def readme_line(command: str) -> str:
    """The README's line that is exactly `command`; fails when the README does not tell users to type it."""
    assert command in readme_lines(), f"README.md no longer tells users to type `{command}`"
    return command


def user_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("LABKIT_") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "JAX_NUM_CPU_DEVICES")}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A copy of the kit as a clone of this tree would be: tracked and new files, nothing ignored or built."""
    where = tmp_path_factory.mktemp("fresh") / "kit"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() or source.is_symlink():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name, follow_symlinks=False)
    return where


def type_in(fresh: Path, line: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run `line` in the copy as a shell would, from its top folder."""
    return subprocess.run(["bash", "-c", line], cwd=fresh, env=user_environment(), text=True, capture_output=True,
                          timeout=timeout, check=False)


def test_make_lab_3_on_the_untouched_notebook_sets_up_and_shows_every_configuration(fresh):
    done = type_in(fresh, readme_line("make lab-3"))
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out[-4000:]
    assert "cpu-1" in out and "cpu-8" in out, out[-4000:]
    assert (fresh / ".venv").is_dir()  # made by the command itself
    assert (fresh / "build" / "lab-3" / "report.json").is_file(), out[-4000:]
    assert done.returncode != 0  # the student's notebook is not written yet: its tests do not pass


def test_make_grade_with_its_default_folders_grades_the_class(fresh):
    # a TA puts the class in submissions/ (the default folder), then types the README's line
    (fresh / "submissions" / "ada").mkdir(parents=True)
    shutil.copy(fresh / "reference" / "lab-3.ipynb", fresh / "submissions" / "ada" / "lab-3.ipynb")
    done = type_in(fresh, readme_line("make grade LABS=3"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with open(fresh / "scoreboard" / "scoreboard.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["student"] == "ada"]
    assert {r["config"] for r in rows} >= {"cpu-1", "cpu-8", "cpu-2x4"}, rows
    assert {r["status"] for r in rows} == {"ok"}, [(r["config"], r["status"], r["message"]) for r in rows]


def readme_block(containing: str) -> str:
    """The README's bash block with a line that starts with `containing`, as lines a user types one after another."""
    blocks, current, inside = [], [], False
    for line in documentation().splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append(current)
            inside, current = line.strip() == "```bash" and not inside, []
            continue
        if inside:
            current.append(re.sub(r"\s+#.*$", "", line).strip())
    found = [b for b in blocks if any(line.startswith(containing) for line in b)]
    assert found, f"README.md no longer has a block with `{containing}`"
    return "\n".join(line for line in found[0] if line)


def test_the_exports_block_writes_the_canvas_and_wide_files_from_the_graded_class(fresh):
    assert (fresh / "scoreboard" / "scoreboard.json").is_file(), "the grading test runs first"
    done = type_in(fresh, "set -e\n" + readme_block("nox -s scoreboard -- export --format canvas"), timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with open(fresh / "canvas.csv", newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0][0] == "Student" and any("ada" in ",".join(row) for row in canvas[1:]), canvas[:3]
    assert (fresh / "grades-wide.csv").read_text().count("ada") >= 1


def test_make_doctor_says_what_this_machine_can_do(fresh):
    done = type_in(fresh, readme_line("make doctor"), timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "sandbox" in done.stdout.lower() or "bwrap" in done.stdout, done.stdout[-4000:]


# ---------------------------------------------------------------------------------------------
# Every command the README names is one the kit has: make targets and their variables, nox sessions,
# `python -m labkit` commands and their options (in the bash blocks and in the text's `code`).

def _makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9%_.-]+)\s*:(?!=)", text, re.M))
    variables = set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", text)) | set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:]?=", text, re.M))
    return targets, variables


def readme_commands() -> list[list[str]]:
    """Each command the README writes (bash lines and `code` spans), as words; options in [brackets] unwrapped."""
    spans = readme_lines() + re.findall(r"`([^`\n]+)`", documentation())
    commands = []
    for span in spans:
        for part in re.split(r"&&|;|\||\(|\)", span.replace("\\", " ")):
            try:
                split = shlex.split(part.replace("...", " "))
            except ValueError:  # an unclosed quote in a fragment of prose
                split = part.replace("...", " ").split()
            words = [w.strip("[]") for w in split]
            words = [w for w in words if w and not w.startswith("..")]
            while words and words[0] in ("sudo", "time"):
                words = words[1:]
            if words:
                commands.append(words)
    return commands


def test_every_make_target_and_variable_the_readme_names_is_in_the_makefile():
    targets, variables = _makefile()
    wrong = []
    for words in readme_commands():
        if words[0] != "make":
            continue
        for w in words[1:]:
            if w.startswith("-") or not re.fullmatch(r"[A-Za-z0-9%_.=,/:-]+", w.split("=")[0]):
                continue
            if "=" in w:
                wrong += [f"variable {w.split('=')[0]} in `{' '.join(words)}`"] if w.split("=")[0] not in variables else []
            elif not (w in targets or any("%" in t and re.fullmatch(t.replace("%", ".+"), w) for t in targets)):
                wrong.append(f"target {w} in `{' '.join(words)}`")
    assert wrong == []


def test_every_nox_session_and_labkit_option_the_readme_names_exists():
    import sys

    sessions = set(re.findall(r"^def (\w+)\(session", (ROOT / "noxfile.py").read_text(), re.M))
    helps: dict[str, str] = {}
    wrong = []
    for words in readme_commands():
        if words[:2] == ["nox", "-s"] and len(words) > 2 and words[2] not in sessions:
            wrong.append(f"nox session {words[2]}")
        if words[:3] == ["python", "-m", "labkit"] and len(words) > 3 and not words[3].startswith("-"):
            command = words[3]
            if command not in helps:
                done = subprocess.run([sys.executable, "-m", "labkit", command, "--help"], cwd=ROOT, capture_output=True,
                                      text=True, timeout=120, check=False)
                helps[command] = done.stdout if done.returncode == 0 else ""
            if not helps[command]:
                wrong.append(f"labkit command {command}")
            wrong += [f"option {w} of `labkit {command}`" for w in words[4:]
                      if re.fullmatch(r"--[a-z][a-z0-9-]*", w) and w not in helps[command]]
    assert wrong == []
