"""The commands of the README and the guides, typed as they are written, in a fresh copy of the kit, with no
setting a user would not make; and no shell block on those pages that no test runs.

Each test takes its command lines from the pages (`doc_commands`: `typed`, `block`): a page that says
something else changes what is run, and one that no longer says it fails the test. The copy is the
kit's tracked and new files (what a clone of this tree would hold, without .venv, build/ or anything
ignored), so the commands make their own environment exactly as on a new machine, from relative paths
and default arguments. Variables of the kit's own (LABKIT_*) are removed from the environment: a user
has none of them. Lines that need an engine, a cluster or a wheelhouse are run by the tests of those
(test_container_image, test_gradescope_container, test_slurm, test_offline, test_docs), taken from the
pages the same way.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import cloud_standins
import doc_commands
import pytest

ROOT = Path(__file__).resolve().parents[2]
typed, block, user_environment = doc_commands.typed, doc_commands.block, doc_commands.user_environment


def documentation() -> str:
    """The README and the guides in docs/: what users read, and type from."""
    return "\n".join(p.read_text() for p in doc_commands.pages())


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A copy of the kit as a clone of this tree would be: tracked and new files, nothing ignored or built."""
    where = tmp_path_factory.mktemp("fresh") / "kit"
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() or source.is_symlink():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name, follow_symlinks=False)
    return where


def type_in(fresh: Path, line: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run `line` in the copy as a shell would, from its top folder."""
    return subprocess.run(
        ["bash", "-c", line],
        cwd=fresh,
        env=user_environment(),
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def test_make_lab_3_on_the_untouched_notebook_sets_up_and_shows_every_configuration(fresh):
    done = type_in(fresh, typed("make lab-3"))
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
    done = type_in(fresh, typed("make grade LABS=3"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with open(fresh / "scoreboard" / "scoreboard.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["student"] == "ada"]
    assert {r["config"] for r in rows} >= {"cpu-1", "cpu-8", "cpu-2x4"}, rows
    assert {r["status"] for r in rows} == {"ok"}, [(r["config"], r["status"], r["message"]) for r in rows]


def test_the_exports_block_writes_the_canvas_and_wide_files_from_the_graded_class(fresh):
    assert (fresh / "scoreboard" / "scoreboard.json").is_file(), "the grading test runs first"
    done = type_in(
        fresh, "set -e\n" + "\n".join(block("nox -s scoreboard -- export --format canvas")), timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with open(fresh / "canvas.csv", newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0][0] == "Student" and any("ada" in ",".join(row) for row in canvas[1:]), canvas[:3]
    assert (fresh / "grades-wide.csv").read_text().count("ada") >= 1


def test_make_doctor_says_what_this_machine_can_do(fresh):
    done = type_in(fresh, typed("make doctor"), timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "sandbox" in done.stdout.lower() or "bwrap" in done.stdout, done.stdout[-4000:]


def test_make_doctor_for_grading_and_docker_fails_when_either_cannot_work_here(fresh):
    done = type_in(fresh, typed("make doctor FOR=grade,docker"), timeout=600)
    verdict = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    # make says a failed command with its own exit status, 2
    assert (done.returncode, verdict.split(":")[0]) in (
        (0, "READY for grade, docker"),
        (2, "NOT READY for grade, docker"),
    ), done.stdout + done.stderr


def test_progress_of_a_finished_run_says_so_once_and_returns(fresh):
    done = type_in(fresh, typed("make progress OUT=scoreboard WATCH=1"), timeout=120)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and re.match(r"shards finished 1/1, units graded (\d+)/\1$", lines[0]), done.stdout


def test_merging_the_shards_by_the_guides_line_gives_back_the_class_graded_in_one_run(fresh):
    # Three parts of the graded class, one configuration each, as shards graded apart would write them;
    # the guide's line merges them into scoreboard/, which must then be the one run's, byte for byte.
    whole = json.loads((fresh / "scoreboard" / "scoreboard.json").read_text())
    configs = sorted({r["config"] for r in whole["rows"]})
    one_run = {p.name: p.read_bytes() for p in (fresh / "scoreboard").glob("scoreboard.*")}
    for i in (1, 2, 3):
        (fresh / f"part{i}").mkdir()
        (fresh / f"part{i}" / "scoreboard.json").write_text(
            json.dumps(
                {**whole, "rows": [r for r in whole["rows"] if configs.index(r["config"]) % 3 == i - 1]}
            )
        )
    for name in one_run:
        (fresh / "scoreboard" / name).unlink()
    done = type_in(
        fresh,
        typed("source .venv/bin/activate")
        + "\n"
        + typed("nox -s scoreboard -- merge part1/ part2/ part3/ --out scoreboard/"),
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    merged = {p.name: p.read_bytes() for p in (fresh / "scoreboard").glob("scoreboard.*")}
    assert merged == one_run, sorted(n for n in one_run if merged.get(n) != one_run[n])


def test_the_organisers_guide_runs_a_workshop_day_against_stand_ins_for_the_cloud(fresh, tmp_path):
    # gcloud and terraform cannot reach a cloud here: recording stand-ins answer for them, first on the
    # PATH (what `cloud_standins` says), and one student's TPU VM holds lab 3 written right.
    workshop, student = "spmd-2026", "ada"
    vm = f"{workshop}-{student}"
    cloud, remote = tmp_path / "cloud", tmp_path / "remote"
    (remote / vm / "opt/labkit/labs").mkdir(parents=True)
    shutil.copy(fresh / "reference" / "lab-3.ipynb", remote / vm / "opt/labkit/labs" / "lab-3.ipynb")
    (tmp_path / "canned.json").write_text(
        json.dumps(
            {
                "outputs": {
                    "tpu_names": [vm],
                    "cpu_names": [],
                    "students": {vm: student},
                    "accounts": {vm: "ada@example.org"},
                    "backup_bucket": f"my-course-project-{workshop}-labs",
                }
            }
        )
    )
    cloud_standins.install(
        cloud, ("gcloud", "terraform"), tmp_path / "calls.jsonl", tmp_path / "canned.json", remote
    )
    env = dict(user_environment(), PATH=f"{cloud}{os.pathsep}{os.environ['PATH']}")
    said = {}
    for line in block("cp infra/workshop.tfvars.example infra/workshop.tfvars"):
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=fresh,
            env=env,
            input="y\n",
            text=True,
            capture_output=True,
            timeout=1200,
            check=False,
        )
        assert done.returncode == 0, f"{line}\n{(done.stdout + done.stderr)[-4000:]}"
        said[line.split()[1]] = done.stdout
    assert "Estimated cost" in said["workshop-up"] and "--tunnel-through-iap" in said["workshop-links"]
    calls = [json.loads(c) for c in (tmp_path / "calls.jsonl").read_text().splitlines()]
    actions = [next(a for a in c[1:] if not a.startswith("-")) for c in calls if c[0] == "terraform"]
    assert [a for a in actions if a in ("apply", "destroy")] == ["apply", "destroy"], actions
    assert any(
        c[-1].endswith("make lab-3 CONFIGS=tpu EXTRAS=tpu DEP_GROUPS=notebook LABKIT_TPU_HOSTS=1")
        for c in calls
        if c[0] == "gcloud"
    )
    results = fresh / "build" / "workshop-results"
    assert (results / "submissions" / student / "lab-3.ipynb").is_file()
    with open(results / "graded" / "scoreboard.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["student"] == student]
    assert rows and {r["status"] for r in rows} == {"ok"}, rows  # graded here, with the hidden tests


# ---------------------------------------------------------------------------------------------
# Every command the README names is one the kit has: make targets and their variables, nox sessions,
# `python -m labkit` commands and their options (in the bash blocks and in the text's `code`).


def _makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9%_.-]+)\s*:(?!=)", text, re.MULTILINE))
    variables = set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", text)) | set(
        re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:]?=", text, re.MULTILINE)
    )
    return targets, variables


def readme_commands() -> list[list[str]]:
    """Each command the README writes (bash lines and `code` spans), as words; options in [brackets] unwrapped."""
    spans = doc_commands.shell_commands() + re.findall(r"`([^`\n]+)`", documentation())
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
                wrong += (
                    [f"variable {w.split('=')[0]} in `{' '.join(words)}`"]
                    if w.split("=")[0] not in variables
                    else []
                )
            elif not (
                w in targets or any("%" in t and re.fullmatch(t.replace("%", ".+"), w) for t in targets)
            ):
                wrong.append(f"target {w} in `{' '.join(words)}`")
    assert wrong == []


def test_every_nox_session_and_labkit_option_the_readme_names_exists():
    import sys

    sessions = set(re.findall(r"^def (\w+)\(session", (ROOT / "noxfile.py").read_text(), re.MULTILINE))
    helps: dict[tuple[str, ...], str] = {}
    wrong = []
    for words in readme_commands():
        if words[:2] == ["nox", "-s"] and len(words) > 2 and words[2] not in sessions:
            wrong.append(f"nox session {words[2]}")
        if words[:3] == ["python", "-m", "labkit"] and len(words) > 3 and not words[3].startswith("-"):
            command = words[3]
            # a command's own subcommand (`labkit canvas push`) has options of its own: both helps count
            levels = [(command,)] + (
                [(command, words[4])] if len(words) > 4 and re.fullmatch(r"[a-z]+", words[4]) else []
            )
            for level in levels:
                if level not in helps:
                    done = subprocess.run(
                        [sys.executable, "-m", "labkit", *level, "--help"],
                        cwd=ROOT,
                        capture_output=True,
                        text=True,
                        timeout=120,
                        check=False,
                    )
                    helps[level] = done.stdout if done.returncode == 0 else ""
            if not helps[(command,)]:
                wrong.append(f"labkit command {command}")
            known = "".join(helps[level] for level in levels)
            wrong += [
                f"option {w} of `labkit {command}`"
                for w in words[4:]
                if re.fullmatch(r"--[a-z][a-z0-9-]*", w) and w not in known
            ]
    assert wrong == []


# ---------------------------------------------------------------------------------------------
# Every shell block of the pages is run by a test, or says on the page why not; every other block
# names what it holds (```text for a sample of output).


def test_every_block_of_the_pages_names_what_it_holds():
    assert [str(b) for b in doc_commands.blocks() if not b.language] == []


def test_every_command_a_page_tells_users_to_type_is_run_by_a_test():
    assert doc_commands.unrun() == []


PAGE = """```bash
make lab-3
make lab-9   # a comment
```

<!-- not run by the tests: needs a TPU VM -->
```bash
make tpu-thing
```

<!-- not run by the tests: `make test` is the suite itself -->
```bash
make lab-4
make test
```
"""


def test_a_command_no_test_takes_is_found_unless_its_page_says_why(tmp_path):
    page, tests = tmp_path / "page.md", tmp_path / "tests"
    page.write_text(PAGE)
    tests.mkdir()
    (tests / "test_some.py").write_text('typed("make lab-3")\n')
    assert doc_commands.unrun(tests, [page]) == [f"{page}:1: make lab-9", f"{page}:12: make lab-4"]
    (tests / "test_more.py").write_text('block("make lab-4")\nwith_values("make lab-9", CONFIGS="cpu-1")\n')
    assert doc_commands.unrun(tests, [page]) == []
