"""`nox -s grade` end to end: a small class graded through the real pipeline, with every bad input of the issue.

One class is graded once (module fixture) and the tests read what it wrote; the tests
that need another run (regrade, a changed submission, shards, a stopped run) start from a
copy of its graded units, so that they grade little or nothing again.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from notebook_variants import LAB_3_TESTS, with_code

from labkit.course import catalog, configs
from labkit.grading import grade
from labkit.grading.intake import collect
from labkit.grading.running import engine, store
from labkit.grading.running import progress as progress_mod
from labkit.grading.running import rows as grade_rows
from labkit.grading.state import history
from labkit.judge import judge
from labkit.run import allowance, execute

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "reference" / "lab-3.ipynb"
TIMEOUT = "120"  # seconds per notebook: generous, the machine may be busy (a timeout has its own test)
ARGS = ("--labs", "3", "--configs", "cpu-1,cpu-8", "--jobs", "2", "--timeout", TIMEOUT)
EVIL = "<img src=x onerror=alert(1)>"
ONE_DEVICE_MESH = (
    'Mesh(np.array(jax.devices()), ("data",))\n    double',
    'Mesh(np.array(jax.devices()[:1]), ("data",))\n    double',
)


def run_grade(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="160", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "labkit", *args],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


# ----------------------------------------------------------------------------------------
# Notebooks for the class, made from the reference.
# ----------------------------------------------------------------------------------------


def reference_nb() -> dict:
    return json.loads(REFERENCE.read_text())


def code_cell(source: str) -> dict:
    return nbformat.v4.new_code_cell(source)


def exercise_index(nb: dict) -> int:
    return next(i for i, c in enumerate(nb["cells"]) if "def shard_map_double" in "".join(c["source"]))


def as_nbformat_3(nb: dict) -> dict:
    cells = [
        {
            "cell_type": "code",
            "input": "".join(c["source"]),
            "language": "python",
            "outputs": [],
            "metadata": {},
        }
        if c["cell_type"] == "code"
        else {"cell_type": "markdown", "source": "".join(c["source"]), "metadata": {}}
        for c in nb["cells"]
    ]
    return {
        "nbformat": 3,
        "nbformat_minor": 0,
        "metadata": {"name": "lab-3"},
        "worksheets": [{"cells": cells, "metadata": {}}],
    }


def write(path: Path, nb: dict | str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, dict):
        path.write_text(json.dumps(nb))
    elif isinstance(nb, bytes):
        path.write_bytes(nb)
    else:
        path.write_text(nb)


WHERE_AM_I = (
    "import os\nraise RuntimeError('ran in ' + os.getcwd() + ' from ' + os.path.abspath('lab-3.ipynb'))"
)


def make_class(folder: Path) -> Path:
    subs = folder / "submissions"
    write(subs / "alice" / "lab-3.ipynb", reference_nb())
    write(subs / "bob" / "lab-3.ipynb", with_code(reference_nb(), ONE_DEVICE_MESH))
    write(subs / "carol" / "lab-3.ipynb", (ROOT / "labs" / "lab-3.ipynb").read_text())
    write(subs / "dave" / "README.txt", "I will hand in later")
    write(subs / "erin" / "lab-3.ipynb", "")
    write(subs / "erin" / "Lab3.ipynb", reference_nb())
    write(subs / "frank" / "lab-3.ipynb", '{"cells": [{"cell_type": "code", "source": "x = ')
    write(subs / "gina" / "lab-3.ipynb", as_nbformat_3(reference_nb()))
    (subs / "hank" / "lab-3.ipynb").mkdir(parents=True)
    big = reference_nb()
    big["cells"][1]["outputs"] = [
        {"output_type": "display_data", "metadata": {}, "data": {"text/plain": "x" * 30_000_000}}
    ]
    write(subs / "ivan" / "lab-3.ipynb", big)
    nb = reference_nb()
    del nb["cells"][exercise_index(nb)]
    write(subs / "judy" / "lab-3.ipynb", nb)
    nb = reference_nb()  # stray cells that raise, before and after the exercise, one with markup
    at = exercise_index(nb)
    nb["cells"].insert(at + 1, code_cell("raise RuntimeError(\"<script>document.title='pwned'</script>\")"))
    nb["cells"].insert(at, code_cell("raise KeyError('left over before the exercise')"))
    write(subs / EVIL / "lab-3.ipynb", nb)
    # the same bytes from two students: one run, judged for each, each row naming its own files only
    nb = reference_nb()
    nb["cells"].insert(exercise_index(nb) + 1, code_cell(WHERE_AM_I))
    write(subs / "olga" / "lab-3.ipynb", nb)
    write(subs / "pete" / "lab-3.ipynb", nb)
    write(subs / "notes.txt", "a stray file at the top of the folder")
    # links, as `git clone`, `tar` or `cp -a` keep them: a notebook linked to the reference, a folder linked to /etc
    (subs / "kate").mkdir()
    (subs / "kate" / "lab-3.ipynb").symlink_to(REFERENCE)
    (subs / "liam").symlink_to("/etc", target_is_directory=True)
    return subs


STUDENTS = [
    "alice",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "gina",
    "hank",
    "ivan",
    "judy",
    EVIL,
    "kate",
    "liam",
    "olga",
    "pete",
]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class, graded once: (submissions, out, the finished process, the kit's digest then)."""
    folder = tmp_path_factory.mktemp("class")
    subs = make_class(folder)
    out = folder / "out"
    kit = store.kit_digest()
    done = run_grade("grade", "--submissions", str(subs), "--out", str(out), *ARGS)
    return subs, out, done, kit


def same_kit(graded) -> None:
    """Tests that reuse the class's graded units need the kit's code unchanged since (a change regrades all)."""
    if store.kit_digest() != graded[3]:
        pytest.skip(
            "the kit's grading code changed since the class was graded, so every unit is graded again"
        )


@pytest.fixture(scope="module")
def rows(graded) -> dict:
    out, done = graded[1], graded[2]
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out / "scoreboard.csv", newline="") as f:
        return {(r["student"].removeprefix("'"), r["config"]): r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def results(graded) -> dict:
    return json.loads((graded[1] / "scoreboard.json").read_text())


def row_of(results: dict, student: str, config: str) -> dict:
    return next(r for r in results["rows"] if r["student"] == student and r["config"] == config)


def copy_cache(src: Path, dst: Path) -> Path:
    for part in ("units", "reference"):
        shutil.copytree(src / part, dst / part)
    return dst


# ----------------------------------------------------------------------------------------
# The scoreboard's rows: the interface of the issue.
# ----------------------------------------------------------------------------------------


def test_the_run_completes_with_exit_status_0_whatever_the_students_scored(graded):
    assert graded[2].returncode == 0, graded[2].stdout + graded[2].stderr


def test_the_csv_starts_with_the_fixed_columns_and_has_one_row_per_student_lab_and_configuration(
    graded, rows
):
    header = (graded[1] / "scoreboard.csv").read_text().splitlines()[0]
    assert header.startswith("student,lab,config,passed,total,status")
    assert set(rows) == {(s, c) for s in STUDENTS for c in ("cpu-1", "cpu-8")}
    assert {r["status"] for r in rows.values()} <= set(grade_rows.ROW_STATUSES)


def test_passed_and_total_count_public_and_hidden_tests(rows, results):
    assert rows["alice", "cpu-1"]["status"] == "ok"
    assert rows["alice", "cpu-1"]["passed"] == rows["alice", "cpu-1"]["total"] == str(LAB_3_TESTS)
    tests = row_of(results, "alice", "cpu-8")["tests"]
    assert {t["hidden"] for t in tests} == {True, False} and len(tests) == LAB_3_TESTS


def test_a_one_device_mesh_passes_on_cpu_1_and_fails_on_cpu_8(rows):
    assert rows["bob", "cpu-1"]["status"] == "ok"
    assert rows["bob", "cpu-8"]["status"] == "failed"
    assert "all 8 devices" in rows["bob", "cpu-8"]["message"]


def test_an_unmodified_student_notebook_fails_as_not_implemented(rows):
    assert rows["carol", "cpu-1"]["status"] == "failed"
    assert (
        rows["carol", "cpu-1"]["passed"] == "0" and "not implemented yet" in rows["carol", "cpu-1"]["message"]
    )


def test_a_student_folder_without_notebooks_is_missing_with_a_message(rows, results):
    assert rows["dave", "cpu-1"]["status"] == "missing"
    assert rows["dave", "cpu-1"]["total"] == str(LAB_3_TESTS)  # the tests the lab has, none passed
    assert "not handed in" in rows["dave", "cpu-1"]["message"]
    assert any("no notebook" in n for n in results["students"]["dave"]["notes"])


def test_a_misnamed_notebook_is_reported_and_ignored(results):
    notes = results["students"]["erin"]["notes"]
    assert any(n.startswith("Lab3.ipynb") and "rename it lab-3.ipynb" in n for n in notes)


def test_an_empty_file_is_an_error_with_a_message(rows):
    assert rows["erin", "cpu-1"]["status"] == "error"
    assert "empty" in rows["erin", "cpu-1"]["message"]


def test_a_file_that_is_not_json_is_an_error_named_relative_to_the_class(rows, graded):
    message = rows["frank", "cpu-8"]["message"]
    assert rows["frank", "cpu-8"]["status"] == "error"
    assert "not valid notebook JSON" in message and "frank/lab-3.ipynb" in message
    assert str(graded[0]) not in message


def test_an_old_nbformat_notebook_is_converted_graded_and_noted(rows, results):
    assert rows["gina", "cpu-8"]["status"] == "ok"
    assert any("old nbformat 3" in n for n in row_of(results, "gina", "cpu-8")["notes"])


def test_a_folder_named_like_a_notebook_is_an_error(rows):
    assert rows["hank", "cpu-1"]["status"] == "error"
    assert "is a folder" in rows["hank", "cpu-1"]["message"]


def test_a_notebook_tens_of_megabytes_large_is_graded_with_a_note(rows, results):
    assert rows["ivan", "cpu-1"]["status"] == "ok"
    assert any("30 MB" in n for n in row_of(results, "ivan", "cpu-1")["notes"])


def test_a_deleted_exercise_cell_fails_its_tests_saying_the_function_is_not_defined(rows):
    assert rows["judy", "cpu-1"]["status"] == "failed"
    assert "is not defined" in rows["judy", "cpu-1"]["message"]


def test_stray_cells_that_raise_before_and_after_the_exercise_do_not_stop_its_grading(rows, results):
    assert rows[EVIL, "cpu-8"]["status"] == "ok"
    raised = {e["type"] for e in row_of(results, EVIL, "cpu-8")["cell_errors"]}
    assert raised == {"KeyError", "RuntimeError"}


def test_two_students_with_the_same_notebook_share_one_run_and_each_row_names_only_its_own_files(
    rows, results, graded
):
    out = graded[1]
    ran = {s for s in ("olga", "pete") if (out / "work" / s / "lab-3").exists()}
    assert len(ran) == 1, ran  # one run of those bytes on each configuration, not one per student
    for config in ("cpu-1", "cpu-8"):
        olga, pete = row_of(results, "olga", config), row_of(results, "pete", config)
        assert olga["status"] == pete["status"] == "ok" and olga["passed"] == pete["passed"] == LAB_3_TESTS
        assert olga["cell_errors"] and pete["cell_errors"], (olga, pete)
        for mine, other in ((olga, "pete"), (pete, "olga")):
            said = json.dumps(mine)
            assert other not in said, f"{mine['student']}'s row names {other}: {said[:600]}"
        assert [e["message"].replace("olga", "pete") for e in olga["cell_errors"]] == [
            e["message"] for e in pete["cell_errors"]
        ]


def test_a_shared_run_is_copied_with_every_mention_of_the_first_students_files_made_the_others(tmp_path):
    kept = store.Store(tmp_path / "out")
    first = collect.Unit("olga", 3, "cpu-8", tmp_path / "subs" / "olga" / "lab-3.ipynb")
    twin = collect.Unit("pete", 3, "cpu-8", tmp_path / "subs" / "pete" / "lab-3.ipynb")
    record = execute.RunRecord(
        "cpu-8",
        "ok",
        f"see {kept.workdir(first)}/executed.ipynb",
        cell_errors=[{"type": "RuntimeError", "message": f"in {first.path}"}],
        results={"c1": {"value": {"kind": "str", "value": str(kept.workdir(first))}}},
        workdir=str(kept.workdir(first)),
    )
    copy = engine._shared_run(record, first, twin, kept)
    assert "olga" not in json.dumps(copy.to_json())
    assert copy.workdir == str(kept.workdir(twin)) and copy.cell_errors[0]["message"] == f"in {twin.path}"
    assert "olga" in json.dumps(record.to_json())  # the first student's own record is left as it was


def test_a_notebook_that_never_ends_is_a_timeout(tmp_path):
    from labkit.course import catalog, configs

    nb = reference_nb()
    nb["cells"].insert(1, code_cell("import time\nwhile True:\n    time.sleep(1)"))
    write(tmp_path / "lab-3.ipynb", nb)
    with engine.Grader(
        tmp_path / "out", [catalog.lab(3)], configs.parse("cpu-1"), jobs=1, timeout=10, stream=io.StringIO()
    ) as grader:  # its warm server is stopped when it is done, as `grade` stops its own
        [row] = grader.run(
            [collect.Unit("lena", 3, "cpu-1", tmp_path / "lab-3.ipynb")], store.Store(tmp_path / "out"), "t"
        )
    assert row["status"] == "timeout" and row["passed"] == 0
    assert "did not finish within 10 s" in row["message"]


def test_a_notebook_that_is_a_symbolic_link_is_refused_and_its_row_says_why(rows, results):
    for config in ("cpu-1", "cpu-8"):
        assert rows[("kate", config)]["status"] == "error"
        assert rows[("kate", config)]["message"].startswith(
            "refused: symlink: lab-3.ipynb is a symbolic link"
        )
        assert rows[("kate", config)]["passed"] == "0"
    assert row_of(results, "kate", "cpu-1")["tests"] == []  # nothing of it ran


def test_a_student_folder_that_is_a_symbolic_link_is_refused_and_never_listed(rows, graded):
    assert rows[("liam", "cpu-1")]["message"].startswith("refused: symlink: the student folder")
    everything = "".join(
        p.read_text(errors="replace")
        for p in graded[1].rglob("*")
        if p.is_file() and p.suffix in (".csv", ".json", ".md", ".html")
    )
    assert "passwd" not in everything and "shadow" not in everything  # /etc's listing appears nowhere


def test_a_stray_file_next_to_the_student_folders_is_noted(results):
    assert any(n.startswith("notes.txt") for n in results["notes"])


def test_the_json_has_every_tests_outcome_and_message(results):
    bob = row_of(results, "bob", "cpu-8")
    split = next(t for t in bob["tests"] if t["test"] == "test_result_is_split_across_every_device")
    assert split["status"] == "failed" and "jax.devices()[:1]" in split["message"]


def test_the_summary_names_the_multi_device_bug_most_often_hit(graded):
    md = (graded[1] / "scoreboard.md").read_text()
    bugs = md.split("## Multi-device bugs most often hit")[1]
    assert "result is split across every device" in bugs and "cpu-8" in bugs


def test_feedback_gives_public_messages_and_hidden_tests_by_name_and_outcome_only(graded, results):
    text = (graded[1] / "feedback" / "bob.md").read_text()
    assert "all 8 devices" in text  # the public test's message
    hidden = next(
        t for t in row_of(results, "bob", "cpu-8")["tests"] if t["hidden"] and t["status"] == "failed"
    )
    assert hidden["test"].removeprefix("test_").replace("_", " ") in text
    assert hidden["message"] and hidden["message"] not in text
    assert "Each device should double its own block" not in text


def test_every_student_gets_a_feedback_file_even_with_markup_in_the_name(graded):
    assert sorted(p.stem for p in (graded[1] / "feedback").glob("*.md")) == sorted(STUDENTS)


def test_markup_from_a_submission_is_escaped_in_the_html(graded):
    page = (graded[1] / "scoreboard.html").read_text()
    assert "<img src=x" not in page and "<script>document" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in page


def test_the_reference_is_graded_first(graded):
    err = graded[2].stderr
    assert err.index("reference") < err.index("alice")
    assert sorted(
        p.name for p in (graded[1] / "reference" / "units" / "reference" / "lab-3").glob("*.json")
    ) == ["cpu-1.json", "cpu-1.run.json", "cpu-8.json", "cpu-8.run.json"]


def test_progress_is_plain_lines_with_an_eta_when_output_is_not_a_terminal(graded):
    lines = [ln for ln in graded[2].stderr.splitlines() if ln.startswith("[")]
    assert lines and all("eta" in ln for ln in lines)
    assert any("bob lab-3 cpu-8: failed" in ln for ln in lines)


# ----------------------------------------------------------------------------------------
# Grading again: unchanged, changed, sharded, stopped half way.
# ----------------------------------------------------------------------------------------


def test_regrading_an_unchanged_class_grades_nothing_and_writes_the_same_scoreboard(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_cache(out, tmp_path / "again")
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), *ARGS)
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr and "unchanged since the last run" in done.stderr
    for name in ("scoreboard.csv", "scoreboard.json", "scoreboard.md", "scoreboard.html"):
        assert (again / name).read_text() == (out / name).read_text(), name


def test_a_changed_submission_is_the_only_one_graded_again(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    mine = tmp_path / "submissions"
    shutil.copytree(subs, mine, symlinks=True)
    nb = reference_nb()
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "I added a note."})
    write(mine / "alice" / "lab-3.ipynb", nb)
    again = copy_cache(out, tmp_path / "again")
    done = run_grade("grade", "--submissions", str(mine), "--out", str(again), *ARGS)
    graded_now = [ln for ln in done.stderr.splitlines() if ln.startswith("[")]
    assert [ln.split(":")[0].split("] ")[1] for ln in graded_now] == [
        "alice lab-3 cpu-1",
        "alice lab-3 cpu-8",
    ]


def test_shards_partition_the_class_and_merge_into_the_single_runs_scoreboard(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    parts = []
    for i in (1, 2):
        part = copy_cache(out, tmp_path / f"part{i}")
        done = run_grade("grade", "--submissions", str(subs), "--out", str(part), "--shard", f"{i}/2", *ARGS)
        assert done.returncode == 0 and "to grade" not in done.stderr, done.stderr
        parts.append(part)
    students = [set(json.loads((p / "scoreboard.json").read_text())["students"]) for p in parts]
    assert students[0] and students[1] and not students[0] & students[1]
    assert students[0] | students[1] == set(STUDENTS)
    merged = tmp_path / "merged"
    done = run_grade("scoreboard", "merge", *map(str, parts), "--out", str(merged))
    assert done.returncode == 0, done.stderr
    for name in ("scoreboard.csv", "scoreboard.json", "scoreboard.md", "scoreboard.html"):
        assert (merged / name).read_text() == (out / name).read_text(), name
    for student in STUDENTS:
        name = f"{student}.md"
        assert (merged / "feedback" / name).read_text() == (out / "feedback" / name).read_text()


def test_a_run_stopped_half_way_keeps_what_it_graded_and_the_next_grades_only_the_rest(graded, tmp_path):
    subs = tmp_path / "submissions"
    write(subs / "amy" / "lab-3.ipynb", reference_nb())
    for s in ("ben", "cal"):  # slow, so the stop comes while they run however fast the machine is
        nb = reference_nb()
        nb["cells"].insert(1, code_cell("import time\ntime.sleep(15)"))
        write(subs / s / "lab-3.ipynb", nb)
    out = tmp_path / "out"
    shutil.copytree(graded[1] / "reference", out / "reference")  # the reference is graded already
    kit = store.kit_digest()
    args = (
        "grade",
        "--submissions",
        str(subs),
        "--out",
        str(out),
        "--labs",
        "3",
        "--configs",
        "cpu-1",
        "--jobs",
        "1",
        "--timeout",
        TIMEOUT,
    )
    env = dict(os.environ, NO_COLOR="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "labkit", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while not list((out / "units").glob("*/lab-3/cpu-1.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "what was graded is kept" in err
    kept = {p.parts[-3]: p.stat().st_mtime_ns for p in (out / "units").glob("*/lab-3/cpu-1.json")}
    assert 1 <= len(kept) < 3
    if store.kit_digest() != kit:
        pytest.skip("the kit's grading code changed while this test ran, so every unit is graded again")
    done = run_grade(*args)
    assert done.returncode == 0, done.stderr
    assert f"{len(kept)} of 3 unchanged since the last run" in done.stderr
    assert {
        p.parts[-3]: p.stat().st_mtime_ns
        for p in (out / "units").glob("*/lab-3/cpu-1.json")
        if p.parts[-3] in kept
    } == kept
    with open(out / "scoreboard.csv", newline="") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["ok", "ok", "ok"]


def test_a_stop_that_comes_while_the_scoreboard_is_written_leaves_it_whole_and_ends_as_a_stop(
    graded, tmp_path, monkeypatch
):
    same_kit(graded)
    out = tmp_path / "out"
    shutil.copytree(
        graded[1], out, ignore=shutil.ignore_patterns(".warm")
    )  # every unit graded: straight to the scoreboard
    (out / "scoreboard.csv").unlink()
    written = grade.scoreboard.write

    def write_while_stopped(results, folder):
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` from another terminal, half-way through the step
        written(results, folder)

    monkeypatch.setattr(grade.scoreboard, "write", write_while_stopped)

    class Killed(Exception):
        """What this test's process does on SIGTERM outside the kit's handler (the interpreter would die)."""

    def killed(signum, frame):
        raise Killed

    before = signal.signal(signal.SIGTERM, killed)
    try:
        with pytest.raises(KeyboardInterrupt):
            request = grade.Request(graded[0], out, labs="3", configs="cpu-1,cpu-8", jobs=1)
            grade.grade(request, stream=io.StringIO())
        assert signal.getsignal(signal.SIGTERM) is killed  # the kit's handler does not outlive the run
    finally:
        signal.signal(signal.SIGTERM, before)
    assert (out / "scoreboard.csv").read_text() == (graded[1] / "scoreboard.csv").read_text()


# ----------------------------------------------------------------------------------------
# When the kit itself cannot grade.
# ----------------------------------------------------------------------------------------


def test_a_reference_failing_its_own_tests_stops_the_run_and_names_the_test(tmp_path):
    root = tmp_path / "kit"
    for part in ("tests/public/lab_3", "tests/hidden/lab_3"):
        shutil.copytree(ROOT / part, root / part)
    write(root / "reference" / "lab-3.ipynb", with_code(reference_nb(), ("block * 2.0", "block * 3.0")))
    write(tmp_path / "submissions" / "alice" / "lab-3.ipynb", reference_nb())
    env = dict(os.environ, LABKIT_ROOT=str(root), NO_COLOR="1")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(tmp_path / "submissions"),
            "--out",
            str(tmp_path / "out"),
            "--configs",
            "cpu-1",
            "--timeout",
            TIMEOUT,
        ],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1
    assert "reference/lab-3.ipynb on cpu-1: test_doubles_every_element" in done.stderr
    assert not (tmp_path / "out" / "scoreboard.csv").exists()
    assert not (tmp_path / "out" / "units").exists()  # no student was graded


@pytest.mark.parametrize(
    "args, says",
    [
        (("--labs", "99"), "no lab '99'"),
        (("--configs", "gpu-8"), "gpu-8"),
        (("--shard", "3/2"), "--shard"),
        (("--jobs", "0"), "--jobs"),
    ],
    ids=["unknown lab", "unknown configuration", "bad shard", "no jobs"],
)
def test_bad_arguments_exit_2_before_grading_anything(tmp_path, args, says):
    (tmp_path / "submissions").mkdir()
    done = run_grade(
        "grade", "--submissions", str(tmp_path / "submissions"), "--out", str(tmp_path / "out"), *args
    )
    assert done.returncode == 2 and says in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_submissions_folder_that_does_not_exist_exits_2(tmp_path):
    done = run_grade("grade", "--submissions", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "does not exist" in done.stderr


# ----------------------------------------------------------------------------------------
# Pieces, without running notebooks.
# ----------------------------------------------------------------------------------------


def test_a_shard_is_fixed_by_the_student_id_alone():
    ids = [f"student{i:03d}" for i in range(200)]
    first = [collect.shard_of(s, 4) for s in ids]
    assert first == [collect.shard_of(s, 4) for s in reversed(ids)][::-1]
    assert set(first) == {1, 2, 3, 4}
    assert all(collect.shard_of(s, 1) == 1 for s in ids)


def test_a_run_that_timed_out_or_failed_to_start_maps_to_its_row_status():
    def outcome(status):
        return [judge.Outcome("test_x", "f", "s/cpu-1", "cpu-1", status, "m", file="t.py")]

    timeout = execute.RunRecord("cpu-1", "timeout", "the notebook did not finish within 5 s")
    assert grade_rows.make_row("s", 3, "cpu-1", timeout, outcome("timeout"))["status"] == "timeout"
    skipped = execute.RunRecord("tpu", "skipped", "no TPU on this machine")
    row = grade_rows.make_row("s", 3, "tpu", skipped, outcome("skipped"))
    assert (row["status"], row["total"], row["message"]) == ("skipped", 0, "no TPU on this machine")
    ok = execute.RunRecord("cpu-1", "ok")
    assert grade_rows.make_row("s", 3, "cpu-1", ok, outcome("todo"))["status"] == "failed"
    assert grade_rows.make_row("s", 3, "cpu-1", ok, outcome("passed"))["status"] == "ok"


def test_the_key_changes_with_the_submission_the_configuration_and_the_timeout(tmp_path):
    from labkit.course import catalog, configs

    a, b = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
    a.write_text("one")
    b.write_text("two")
    grader = engine.Grader(tmp_path, [catalog.lab(3)], configs.parse("cpu-1,cpu-8"), jobs=1, timeout=10)
    key = grader.key(collect.Unit("s", 3, "cpu-1", a))
    assert key == grader.key(collect.Unit("someone else", 3, "cpu-1", a))
    assert key != grader.key(collect.Unit("s", 3, "cpu-1", b))
    assert key != grader.key(collect.Unit("s", 3, "cpu-8", a))
    longer = engine.Grader(tmp_path, [catalog.lab(3)], configs.parse("cpu-1,cpu-8"), jobs=1, timeout=20)
    assert key != longer.key(collect.Unit("s", 3, "cpu-1", a))


def test_a_terminal_gets_a_progress_bar_with_an_eta(tmp_path):
    import io

    stream = io.StringIO()
    progress = progress_mod.Progress(3, "grading", stream, terminal=True)
    progress.advance(collect.Unit("alice", 3, "cpu-1", None), {"status": "ok", "passed": 6, "total": 6})
    progress.close()
    text = stream.getvalue()
    assert "1/3" in text and "eta" in text and "alice lab-3 cpu-1: ok 6/6" in text


def test_the_calls_grading_makes_are_the_ones_the_labs_tests_declare():
    from labkit.course import catalog

    calls = judge.collect_calls(catalog.lab(3).test_dirs(hidden=True))
    assert calls and {c["function"] for c in calls} == {"shard_map_double", "row_softmax"}
    assert len({c["id"] for c in calls}) == len(calls)


def test_every_graded_run_records_its_isolation_in_the_csv(rows):
    ran = [r for r in rows.values() if r["status"] in ("ok", "failed", "timeout")]
    assert ran and {r["isolation"] for r in ran} == {"bubblewrap"}
    # a notebook that never ran (missing, unreadable) had no isolation to record
    assert {r["isolation"] for r in rows.values()} <= {"bubblewrap", ""}


def test_the_limits_are_flags_of_grade_and_part_of_each_units_key(tmp_path):
    lab = catalog.lab(3)
    config = [configs.CONFIGS["cpu-1"]]
    unit = collect.Unit("alice", 3, "cpu-1", lab.reference)
    small = engine.Grader(
        tmp_path, [lab], config, jobs=1, timeout=60, limits=allowance.Limits(memory=1 << 30)
    )
    default = engine.Grader(tmp_path, [lab], config, jobs=1, timeout=60)
    assert small.key(unit) != default.key(unit), "a regrade with other limits grades again"
    help_text = run_grade("grade", "--help").stdout
    assert "--memory" in help_text and "--max-processes" in help_text and "--max-output" in help_text


# ----------------------------------------------------------------------------------------
# Points, the roster, LMS downloads and exports, on the class graded above (nothing graded again).
# ----------------------------------------------------------------------------------------

ROSTER = (
    "student,name,email,lms_id,section\nalice,Alice L,alice@u.edu,4411,A\nbob,Bob M,bob@u.edu,4412,A\n"
    "zoe,Zoe Z,zoe@u.edu,4419,B\n"
)


def test_each_unit_has_its_points_and_the_labs_points_possible(rows):
    assert (rows["alice", "cpu-8"]["points"], rows["alice", "cpu-8"]["max_points"]) == (str(LAB_3_TESTS),) * 2
    assert int(rows["bob", "cpu-8"]["points"]) < LAB_3_TESTS and rows["bob", "cpu-8"]["max_points"] == str(
        LAB_3_TESTS
    )
    assert (rows["dave", "cpu-1"]["points"], rows["dave", "cpu-1"]["max_points"]) == ("0", str(LAB_3_TESTS))


def test_grades_combine_the_configurations_by_the_courses_policy(graded):
    with open(graded[1] / "grades.csv", newline="") as f:
        totals = {r["student"]: r for r in csv.DictReader(f) if r["lab"] == "total"}
    assert (totals["alice"]["points"], totals["alice"]["max_points"]) == (str(LAB_3_TESTS),) * 2
    bob_one_device = next(
        r
        for r in csv.DictReader(io.StringIO((graded[1] / "scoreboard.csv").read_text()))
        if r["student"] == "bob" and r["config"] == "cpu-8"
    )
    assert totals["bob"]["points"] == bob_one_device["points"]  # passing on cpu-1 alone earns nothing more
    assert "every configuration graded (cpu-1, cpu-8)" in totals["bob"]["rule"]
    assert "tests/policy.toml" in totals["bob"]["rule"]


def test_the_scoreboard_names_the_digest_it_graded_and_history_keeps_those_bytes(graded, results):
    subs, out = graded[:2]
    digest = row_of(results, "alice", "cpu-1")["digest"]
    assert digest == history.digest(subs / "alice" / "lab-3.ipynb")
    assert (out / "history" / "alice" / "lab-3" / f"{digest}.ipynb").read_bytes() == (
        subs / "alice" / "lab-3.ipynb"
    ).read_bytes()
    kept = json.loads((out / "history" / "alice" / "lab-3" / "history.json").read_text())
    assert [e["digest"] for e in kept] == [digest] and kept[0]["collected_at"]


def test_with_a_roster_every_student_on_it_has_rows_and_folders_not_on_it_are_reported(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_cache(out, tmp_path / "again")
    (tmp_path / "roster.csv").write_text(ROSTER)
    done = run_grade(
        "grade",
        "--submissions",
        str(subs),
        "--out",
        str(again),
        "--roster",
        str(tmp_path / "roster.csv"),
        *ARGS,
    )
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr
    mine = json.loads((again / "scoreboard.json").read_text())
    assert sorted(mine["students"]) == ["alice", "bob", "zoe"]
    zoe = [r for r in mine["rows"] if r["student"] == "zoe"]
    assert [(r["config"], r["status"], r["points"], r["max_points"]) for r in zoe] == [
        ("cpu-1", "missing", 0, LAB_3_TESTS),
        ("cpu-8", "missing", 0, LAB_3_TESTS),
    ]
    assert any(n.startswith("carol: a submission folder not on the roster") for n in mine["notes"])
    assert mine["students"]["alice"]["lms_id"] == "4411"


def test_a_canvas_download_is_graded_through_the_roster_and_exported_for_canvas(graded, tmp_path):
    import zipfile

    same_kit(graded)
    subs, out = graded[:2]
    again = copy_cache(out, tmp_path / "again")
    (tmp_path / "roster.csv").write_text(ROSTER)
    download = tmp_path / "canvas-download.zip"
    with zipfile.ZipFile(download, "w") as z:
        z.writestr("la_4411_900_lab-3.ipynb", (subs / "bob" / "lab-3.ipynb").read_bytes())
        z.writestr("la_4411_900_lab-3-1.ipynb", (subs / "alice" / "lab-3.ipynb").read_bytes())  # resubmitted
        z.writestr("mb_LATE_4412_901_Lab3.ipynb", (subs / "bob" / "lab-3.ipynb").read_bytes())
        z.writestr("xx_5555_902_lab-3.ipynb", b"{}")
    done = run_grade(
        "grade",
        "--submissions",
        str(download),
        "--out",
        str(again),
        "--roster",
        str(tmp_path / "roster.csv"),
        *ARGS,
    )
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr  # the same bytes as the class's alice and bob: graded already
    assert "xx_5555_902_lab-3.ipynb: not graded, Canvas user id 5555 is on no roster line" in done.stderr
    mine = json.loads((again / "scoreboard.json").read_text())
    statuses = {(r["student"], r["config"]): r["status"] for r in mine["rows"]}
    assert statuses["alice", "cpu-8"] == "ok" and statuses["bob", "cpu-8"] == "failed"
    assert statuses["zoe", "cpu-1"] == "missing"
    assert "lab-3: Canvas marked it late (mb_LATE_4412_901_Lab3.ipynb)" in mine["students"]["bob"]["notes"]
    export = tmp_path / "canvas.csv"
    done = run_grade("scoreboard", "export", "--format", "canvas", "--out", str(export), str(again))
    assert done.returncode == 0, done.stderr
    table = list(csv.reader(io.StringIO(export.read_text())))
    assert table[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert ["Alice L", "4411", "alice", "alice@u.edu", "A", str(LAB_3_TESTS)] in table
    assert [
        "Zoe Z",
        "4419",
        "zoe",
        "zoe@u.edu",
        "B",
        "",
    ] in table  # not handed in: blank, Canvas keeps its grade


@pytest.mark.parametrize(
    "file, text, says",
    [
        (
            "roster.csv",
            "student\nalice\nalice\n",
            "roster.csv, line 3: the student id 'alice' is already on line 2",
        ),
        ("roster.csv", "name\nAlice\n", "roster.csv, line 1: the header has no `student` column"),
        ("policy.toml", '[grading]\nrequired = ["cpu-99"]\n', "unknown configuration 'cpu-99'"),
        ("policy.toml", "[labs.3]\nweight = -2\n", "[labs.3] weight must not be negative"),
    ],
    ids=["duplicate id", "no student column", "unknown configuration", "negative weight"],
)
def test_a_bad_roster_or_policy_exits_2_before_grading_anything(tmp_path, file, text, says):
    (tmp_path / "submissions").mkdir()
    (tmp_path / file).write_text(text)
    flag = "--roster" if file == "roster.csv" else "--policy"
    done = run_grade(
        "grade",
        "--submissions",
        str(tmp_path / "submissions"),
        "--out",
        str(tmp_path / "out"),
        flag,
        str(tmp_path / file),
        *ARGS,
    )
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_zip_with_a_path_leaving_its_folder_exits_2_and_writes_nothing(tmp_path):
    import zipfile

    (tmp_path / "roster.csv").write_text(ROSTER)
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as z:
        z.writestr("../../la_4411_900_lab-3.ipynb", "{}")
    done = run_grade(
        "grade",
        "--submissions",
        str(tmp_path / "evil.zip"),
        "--out",
        str(tmp_path / "out"),
        "--roster",
        str(tmp_path / "roster.csv"),
        *ARGS,
    )
    assert done.returncode == 2 and "path traversal" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)) == ["evil.zip", "roster.csv"]


def test_overrides_are_applied_after_grading_and_marked_and_a_bad_line_is_refused(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_cache(out, tmp_path / "again")
    (tmp_path / "overrides.csv").write_text(
        "student,lab,points,test,status,comment\n"
        "bob,3,,result_is_split_across_every_device,passed,accepted\n"
        "carol,3,2.5,,,partial credit by hand\n"
    )
    done = run_grade(
        "grade",
        "--submissions",
        str(subs),
        "--out",
        str(again),
        "--overrides",
        str(tmp_path / "overrides.csv"),
        *ARGS,
    )
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr  # overrides regrade nothing
    with open(again / "grades.csv", newline="") as f:
        labs = {r["student"]: r for r in csv.DictReader(f) if r["lab"] == "3"}
    assert (labs["carol"]["points"], labs["carol"]["overridden"]) == ("2.5", "partial credit by hand")
    assert labs["bob"]["overridden"] == "accepted"
    (tmp_path / "bad.csv").write_text("student,lab,points\nalice,3,1\nnobody,3,1\n")
    done = run_grade(
        "grade",
        "--submissions",
        str(subs),
        "--out",
        str(again),
        "--overrides",
        str(tmp_path / "bad.csv"),
        *ARGS,
    )
    assert done.returncode == 2 and "bad.csv, line 3: no student 'nobody' in this class" in done.stderr
