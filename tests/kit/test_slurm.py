"""Grading on a Slurm cluster: an array job of shards and a merge job, against a real one-node Slurm.

The cluster is Debian's slurm-wlm and munge, started by `slurm_cluster` (root only; skipped with the
reason elsewhere). Each shard grades in the kit's sandbox exactly as `grade --shard i/N` does here.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import doc_commands
import psutil
import pytest
import slurm_cluster

from labkit.course import configs
from labkit.grading import slurm
from labkit.grading.intake import collect
from labkit.grading.running import progress

pytestmark = pytest.mark.machine_wide  # see conftest.py: one worker runs such modules in turn

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def _students_in_both_shards() -> list[str]:
    """Three student ids, at least one in each of two shards."""
    names = [f"student{i}" for i in range(20)]
    first = [n for n in names if collect.shard_of(n, 2) == 1][:2]
    second = [n for n in names if collect.shard_of(n, 2) == 2][:1]
    return first + second


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def klass(tmp_path_factory) -> Path:
    """Three students' lab 1: one right (the reference), two as handed out (their tests fail)."""
    folder = tmp_path_factory.mktemp("class") / "submissions"
    for i, student in enumerate(_students_in_both_shards()):
        (folder / student).mkdir(parents=True)
        source = ROOT / ("reference" if i == 0 else "labs") / "lab-1.ipynb"
        shutil.copy(source, folder / student / "lab-1.ipynb")
    return folder


def _slurm_grade(cluster, klass: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    return cluster.run(
        PY,
        "-m",
        "labkit",
        "slurm-grade",
        "--submissions",
        str(klass),
        "--out",
        str(out),
        "--shards",
        "2",
        "--labs",
        "1",
        "--configs",
        "cpu-1",
        "--jobs",
        "1",
        "--every",
        "2",
        *more,
        cwd=ROOT,
        timeout=900,
    )


def _rows(folder: Path) -> set[tuple]:
    with open(folder / "scoreboard.csv", newline="") as f:
        return {
            (r["student"], r["lab"], r["config"], r["passed"], r["total"], r["status"], r["points"])
            for r in csv.DictReader(f)
        }


def test_the_ta_guides_slurm_command_grades_a_class_as_one_local_run_does(cluster, klass, tmp_path):
    # The TA guide's line, with the class's and the scoreboard's folders and the partition this cluster
    # has in place of its own, two shards for three students, and one lab on one configuration.
    line = doc_commands.with_values(
        "make slurm-grade SHARDS=8 SUBMISSIONS=/shared/cs101/submissions OUT=/shared/cs101/scoreboard PARTITION=cpu",
        SHARDS="2",
        SUBMISSIONS=str(klass),
        OUT=str(tmp_path / "slurm"),
        PARTITION="grading",
        also={"LABS": "1", "CONFIGS": "cpu-1", "JOBS": "1"},
    )
    done = subprocess.run(
        line,
        cwd=ROOT,
        env=doc_commands.user_environment(cluster.env),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted: array job" in done.stdout
    assert "shards finished 2/2" in done.stderr
    local = subprocess.run(
        [
            PY,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(klass),
            "--out",
            str(tmp_path / "local"),
            "--labs",
            "1",
            "--configs",
            "cpu-1",
            "--jobs",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert local.returncode == 0, local.stderr
    assert _rows(tmp_path / "slurm") == _rows(tmp_path / "local")
    assert len(_rows(tmp_path / "slurm")) == 3
    # each shard ran in the kit's sandbox, as a local run does
    with open(tmp_path / "slurm" / "scoreboard.csv", newline="") as f:
        assert {r["isolation"] for r in csv.DictReader(f)} == {"bubblewrap"}


def test_a_shard_that_did_not_finish_is_named_by_the_merge(cluster, klass, tmp_path):
    out = tmp_path / "out"
    done = _slurm_grade(cluster, klass, out, "--no-wait")
    assert done.returncode == 0, done.stderr
    array, merge = _job_ids(done.stdout)
    cluster.run("scancel", f"{array}_2")  # shard 2 ends before it can grade anyone
    deadline = time.monotonic() + 600
    while (
        time.monotonic() < deadline
        and cluster.run("squeue", "--noheader", "--jobs", f"{array},{merge}").stdout.strip()
    ):
        time.sleep(2)
    notes = " ".join(grade_notes(out))
    assert "shard 2 of 2 did not finish" in notes
    students = {r[0] for r in _rows(out)}
    assert students == {s for s in _students_in_both_shards() if collect.shard_of(s, 2) == 1}
    assert "failed: shard 2" in progress.summary(slurm.parts_with_exits(out, 2, ended=True))


def _job_ids(printed: str) -> tuple[str, str]:
    return printed.split("array job ")[1].split()[0], printed.split("merge job ")[1].split()[0]


def grade_notes(out: Path) -> list[str]:
    import json

    return json.loads((out / "scoreboard.json").read_text()).get("notes", [])


def test_cancelling_the_jobs_leaves_nothing_of_the_run_running(cluster, klass, tmp_path):
    out = tmp_path / "out"
    done = _slurm_grade(cluster, klass, out, "--no-wait")
    assert done.returncode == 0, done.stderr
    array, merge = _job_ids(done.stdout)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(out.glob("shards/*/progress.json")):
        time.sleep(1)
    assert list(out.glob("shards/*/progress.json")), "no shard started grading"
    cluster.run("scancel", array, merge)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (_left(out) or cluster.run("squeue", "--noheader").stdout.strip()):
        time.sleep(1)
    assert _left(out) == []
    assert cluster.run("squeue", "--noheader").stdout.strip() == ""


def _left(out: Path) -> list[str]:
    """Processes whose command line or working folder names the run's folder."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        text = " ".join(p.info["cmdline"] or []) + " " + (p.info["cwd"] or "")
        if str(out) in text:
            found.append(f"{p.pid}: {text[:200]}")
    return found


def test_a_shard_asks_for_a_cpu_per_notebook_their_memory_and_a_gpu_for_the_gpu_configuration(tmp_path):
    request = slurm.Request(
        tmp_path, tmp_path, 4, configs="cpu-1,gpu", jobs=3, partition="gpu", account="cs101"
    )
    options = slurm.resources(request)
    assert "--cpus-per-task=3" in options and "--gres=gpu:1" in options
    assert "--partition=gpu" in options and "--account=cs101" in options
    assert f"--mem={(3 * 4 * 1024) + 1024}M" in options
    assert not any(o.startswith("--gres") for o in slurm.resources(slurm.Request(tmp_path, tmp_path, 2)))
    assert "gpu" in configs.CONFIGS


def test_the_tpu_configuration_is_refused_with_where_to_grade_it(tmp_path):
    with pytest.raises(slurm.SlurmError, match="grade it on the TPU VM"):
        slurm.resources(slurm.Request(tmp_path, tmp_path, 2, configs="tpu"))


def test_without_sbatch_submitting_says_where_to_run_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurm.SlurmError, match="sbatch is not on the PATH"):
        slurm.submit(slurm.Request(tmp_path, tmp_path / "out", 2))


def test_progress_sums_the_shards_and_names_the_slowest_shards_time_left(tmp_path):
    now = 1000.0
    parts = [
        progress.Part("1", "grading 2 students", total=4, done=2, started=now - 10),
        progress.Part("2", "grading 2 students", total=4, done=4, started=now - 10, finished=True),
        progress.Part("3", "reference solutions", total=1, done=0, started=now - 1),
    ]
    line = progress.summary(parts, now=now)
    assert line.startswith("shards finished 1/3, units graded 6/8")
    assert "(1 not grading students yet: reference solutions)" in line
    assert "about 10 s left" in line


def test_make_slurm_grade_takes_the_tas_inputs_and_keeps_them_for_every_shard(cluster, klass, tmp_path):
    """ROSTER, POLICY, OVERRIDES and EXTENSIONS reach every shard (they were dropped before) and stay in OUT/course."""
    students = _students_in_both_shards()
    (tmp_path / "roster.csv").write_text("student\n" + "".join(f"{s}\n" for s in [*students, "absent"]))
    (tmp_path / "policy.toml").write_text('[grading]\ncombine = "all"\n')
    (tmp_path / "overrides.csv").write_text(f"student,lab,points,comment\n{students[2]},1,3,by hand\n")
    (tmp_path / "extensions.csv").write_text(f"student,lab,days\n{students[1]},1,2\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "slurm-grade",
            "SHARDS=2",
            f"SUBMISSIONS={klass}",
            f"OUT={out}",
            "PARTITION=grading",
            "LABS=1",
            "CONFIGS=cpu-1",
            "JOBS=1",
            *(
                f"{n.upper()}={tmp_path / f}"
                for n, f in (
                    ("roster", "roster.csv"),
                    ("policy", "policy.toml"),
                    ("overrides", "overrides.csv"),
                    ("extensions", "extensions.csv"),
                )
            ),
        ],
        cwd=ROOT,
        env=doc_commands.user_environment(cluster.env),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out / "grades.csv", newline="") as f:
        labs = {r["student"]: r for r in csv.DictReader(f) if r["lab"] == "1"}
    assert labs["absent"]["status"] == "missing"  # on the roster: kept in grades.csv
    assert (labs[students[2]]["points"], labs[students[2]]["overridden"]) == ("3", "by hand")
    import json

    results = json.loads((out / "scoreboard.json").read_text())
    assert results["extensions"] == {students[1]: {"1": 2.0}}
    assert results["policy"]["source"] == str(tmp_path / "policy.toml")
    assert sorted(p.name for p in (out / "course").iterdir()) == [
        "extensions.csv",
        "manifest.json",
        "overrides.csv",
        "policy.toml",
        "roster.csv",
        "term.json",  # the term's sources, labs and configurations (labkit/grading/state/term.py)
    ]


def test_the_terms_class_graded_on_slurm_gets_the_rules_grades(cluster, tmp_path):
    """The class of tests/kit/test_term.py, every TA input given once to `make slurm-grade`: each shard grades
    with them, and the merged grades.csv is the one the rules give (computed there from the rows alone)."""
    import test_term as term

    inputs = term.ta_inputs()
    for name, text in inputs.items():
        (tmp_path / name).write_text(text)
    week2 = term.export(tmp_path / "week2.zip", week=2)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "slurm-grade",
            "SHARDS=2",
            f"SUBMISSIONS={week2}",
            f"OUT={out}",
            "PARTITION=grading",
            f"LABS={term.LAB}",
            "CONFIGS=cpu-1,cpu-8",
            "JOBS=1",
            *(f"{name.split('.')[0].upper()}={tmp_path / name}" for name in inputs),
        ],
        cwd=ROOT,
        env=doc_commands.user_environment(cluster.env),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    term.check_grades(out, week=2, overrides={("s17", term.LAB): 4.0})
    assert sorted(p.name for p in (out / "course").iterdir()) == sorted(
        [*inputs, "manifest.json", "term.json"]
    )


def test_two_weeks_of_the_term_and_the_bare_command_on_slurm_grade_by_the_rules(cluster, tmp_path):
    """The term of tests/kit/test_term_weeks.py on Slurm, by docs/grading.md's lines: week 1's Canvas download
    of lab 3 with the inputs, week 2's of lab 5, then the bare command; a class of three (both shards), on
    cpu-1. Each step's totals are the rules' (test_term_weeks.check_week); the bare command grades the term
    kept in OUT/course/term.json (it took `submissions/` before) and changes nothing."""
    import test_term_weeks as tw

    out, week_1, week_2 = tmp_path / "out", _term_week(tw, 1), _term_week(tw, 2)
    files = _term_inputs(tw, tmp_path, week_1["students"])
    settings = {"SHARDS": "2", "OUT": str(out), "PARTITION": "grading"}
    _term_step(
        cluster,
        doc_commands.with_values(
            "make slurm-grade SHARDS=8 SUBMISSIONS=canvas-lab3.zip ROSTER=roster.csv POLICY=policy.toml "
            "ADJUSTMENTS=adjustments.csv LABS=3 CONFIGS=cpu-1,cpu-8 OUT=/shared/cs101/scoreboard PARTITION=cpu",
            **settings,
            **files["week 1"],
        ),
    )
    tw.check_week(out, week_1)
    _term_step(
        cluster,
        doc_commands.with_values(
            "make slurm-grade SHARDS=8 SUBMISSIONS=canvas-lab5.zip LABS=5 OUT=/shared/cs101/scoreboard PARTITION=cpu",
            **settings,
            **files["week 2"],
        ),
    )
    tw.check_week(out, week_2)
    assert all(r["status"] != "missing" for (_, lab), r in tw.grades(out).items() if lab == "3")
    after_week_2 = (out / "grades.csv").read_text()
    done = _term_step(
        cluster,
        doc_commands.with_values(
            "make slurm-grade SHARDS=8 OUT=/shared/cs101/scoreboard PARTITION=cpu", **settings
        ),
    )
    assert "term (" in done.stderr and "labs 3, 5" in done.stderr, done.stderr[-4000:]
    tw.check_week(out, week_2)
    assert (out / "grades.csv").read_text() == after_week_2
    logs = " ".join(p.read_text() for p in sorted((out / "slurm").glob("shard-*.log")))
    assert tw.graded_now(subprocess.CompletedProcess([], 0, "", logs)) == [], logs[-4000:]


def _term_week(tw, week: int) -> dict:
    """test_term_weeks' rules for its week 1 or 2, for a class of ana and fay (shard 1) and ben (shard 2)."""
    students = ["ana", "ben", "fay"]
    assert {collect.shard_of(s, 2) for s in students} == {1, 2}
    rules = {**tw.WEEK_1, "students": students}
    return rules if week == 1 else {**rules, "labs": [3, 5], "late_days": {("fay", 5): 1}}


def _term_inputs(tw, folder: Path, students: list[str]) -> dict[str, dict[str, str]]:
    """Each step's files, as test_term_weeks makes them, for `students`, graded on cpu-1 alone."""
    others = tuple(s for s in tw.CANVAS_ID if s not in students)
    (folder / "roster.csv").write_text(tw.roster(without=others))
    (folder / "policy.toml").write_text(tw.policy().replace('["cpu-1", "cpu-8"]', '["cpu-1"]'))
    (folder / "adjustments.csv").write_text(
        "student,lab,points,comment,item,max\nana,3,0.5,a clear write-up,,\n"
    )
    right = {lab: {s: tw.distinct(tw.REFERENCE[lab], s) for s in students} for lab in (3, 5)}
    lab3 = {"ana": (right[3]["ana"], False), "ben": (right[3]["ben"], False), "fay": (tw.HANDOUT[3], False)}
    lab5 = {"ana": (right[5]["ana"], False), "ben": (tw.HANDOUT[5], False), "fay": (right[5]["fay"], True)}
    return {
        "week 1": {
            "SUBMISSIONS": str(tw.canvas(folder / "canvas-lab3.zip", 3, lab3)),
            **{
                n.split(".")[0].upper(): str(folder / n)
                for n in ("roster.csv", "policy.toml", "adjustments.csv")
            },
            "CONFIGS": "cpu-1",
        },
        "week 2": {"SUBMISSIONS": str(tw.canvas(folder / "canvas-lab5.zip", 5, lab5))},
    }


def _term_step(cluster, words: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [words[0], "--no-print-directory", *words[1:], "JOBS=1"],
        cwd=ROOT,
        env=doc_commands.user_environment(cluster.env),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, " ".join(words) + "\n" + done.stdout[-4000:] + done.stderr[-4000:]
    return done


def test_a_shard_ended_by_scancel_still_writes_its_exit_status(tmp_path, monkeypatch):
    # scancel sends SIGTERM to every process of the step, the batch shell too: the shell ended with its grade and
    # wrote no status, and the class's progress never said the shard had failed. A stand-in for the grade that
    # ends as the kit's does on SIGTERM (with a status of its own) shows what the shard's script records.
    ready = tmp_path / "ready"
    stand_in = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(3)); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    monkeypatch.setattr(slurm, "_grade_command", lambda request, python: [sys.executable, "-c", stand_in])
    out = tmp_path / "out"
    (out / "slurm").mkdir(parents=True)
    script = tmp_path / "shard.sh"
    script.write_text(slurm.scripts(slurm.Request(submissions=None, out=out, shards=2))["shard.sh"])
    step = subprocess.Popen(
        ["bash", str(script)],
        env={"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "2"},
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ready.exists():  # the stand-in's handler in place
        time.sleep(0.1)
    os.killpg(step.pid, signal.SIGTERM)  # as slurmstepd signals the step
    # the stand-in's failure, recorded: 3, or what the trap's own SIGTERM makes of its end when it reaches it again
    # as it ends (143; once, on a busy machine, 255). Not any failure: 1 or 127 would be the script's own.
    assert step.wait(timeout=30) in (3, 143, 255)
    assert slurm.shard_exits(out, 2) == {1: None, 2: step.returncode}
