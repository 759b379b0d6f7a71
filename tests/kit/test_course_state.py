"""The course's state: the TA's inputs kept with the class's output, checked before anything is graded,
and shards merged into exactly one run's files whatever order they come in.

One small class is graded once (module fixture: lab 3 on cpu-1, resource limits only, to stay fast) with
a roster, a policy, overrides and extensions; the other runs start from copies of its folder, so that
they grade nothing, or only what the test asks to be graded again.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from notebook_variants import LAB_3_TESTS
from test_grade import ROOT, reference_nb, run_grade, write

from labkit.grading import slurm
from labkit.grading.intake import collect
from labkit.grading.publish import merge
from labkit.grading.running import progress, store
from labkit.grading.state import course, history

ARGS = ("--labs", "3", "--configs", "cpu-1", "--jobs", "2", "--timeout", "120", "--isolation", "limits-only")
ROSTER = "student,name\nalice,Alice\ndora,Dora\nzoe,Zoe\n"
POLICY = (
    '[grading]\ncombine = "all"\n\n[labs.3]\ndue = 2026-03-01T23:59:00Z\n\n'
    '[late]\nper_day = 0.1\naccept = ["mtime"]\n'
)
OVERRIDES = "student,lab,points,test,status,comment\ndora,3,4,,,partial credit by hand\n"
EXTENSIONS = "student,lab,days\nalice,3,2\n"
FILES = ("scoreboard.csv", "scoreboard.json", "scoreboard.md", "scoreboard.html", "grades.csv")


def inputs(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in (
        ("roster.csv", ROSTER),
        ("policy.toml", POLICY),
        ("overrides.csv", OVERRIDES),
        ("extensions.csv", EXTENSIONS),
    ):
        (folder / name).write_text(text)
        paths[name.split(".")[0]] = folder / name
    return paths


def flags(paths: dict[str, Path]) -> list[str]:
    return [a for name, path in paths.items() for a in (f"--{name}", str(path))]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """(submissions, out, the TA's input files, the kit's digest then): the class graded once, with every input."""
    folder = tmp_path_factory.mktemp("term")
    subs = folder / "submissions"
    write(subs / "alice" / "lab-3.ipynb", reference_nb())  # a day late, with an extension of two
    late = datetime.fromisoformat("2026-03-02T12:00:00+00:00").timestamp()
    os.utime(subs / "alice" / "lab-3.ipynb", (late, late))
    write(
        subs / "dora" / "lab-3.ipynb", (ROOT / "labs" / "lab-3.ipynb").read_text()
    )  # nothing done: overridden
    paths = inputs(folder / "ta")
    out = folder / "out"
    kit = store.kit_digest()
    done = run_grade("grade", "--submissions", str(subs), "--out", str(out), *flags(paths), *ARGS)
    assert done.returncode == 0, done.stderr
    return subs, out, paths, kit


def same_kit(graded) -> None:
    if store.kit_digest() != graded[3]:
        pytest.skip(
            "the kit's grading code changed since the class was graded, so every unit is graded again"
        )


def grades(out: Path) -> dict[tuple[str, str], dict]:
    with open(out / "grades.csv", newline="") as f:
        return {(r["student"], r["lab"]): r for r in csv.DictReader(f)}


def copy_run(out: Path, to: Path, *, state: bool = True) -> Path:
    """Another folder holding the class's graded units (and, with `state`, everything else it has)."""
    if state:
        shutil.copytree(out, to, symlinks=True)
    else:
        for part in ("units", "reference"):
            shutil.copytree(out / part, to / part)
    return to


def test_the_first_run_applies_every_input(graded):
    mine = grades(graded[1])
    assert (
        mine["alice", "3"]["points"] == str(LAB_3_TESTS) and not mine["alice", "3"]["late_penalty"]
    )  # the extension
    assert (mine["dora", "3"]["points"], mine["dora", "3"]["overridden"]) == ("4", "partial credit by hand")
    assert mine["zoe", "3"]["status"] == "missing"  # on the roster, nothing handed in


def test_a_later_run_without_the_flags_grades_with_the_kept_inputs(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), *ARGS)
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr
    for name in FILES:
        assert (again / name).read_text() == (out / name).read_text(), name
    assert "course state" in done.stderr and "changed:" not in done.stderr


def test_a_run_that_changes_an_input_says_what_changed(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    (tmp_path / "overrides.csv").write_text(OVERRIDES + "alice,3,5,,,a regrade\n")
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
    assert "1 line added (alice,3,5,,,a regrade), 0 removed" in done.stderr
    assert grades(again)["alice", "3"]["points"] == "5"
    assert (again / "course" / "overrides.csv").read_text() == (tmp_path / "overrides.csv").read_text()
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), "--forget", "overrides", *ARGS)
    assert done.returncode == 0 and "overrides: forgotten" in done.stderr, done.stderr
    assert grades(again)["dora", "3"]["points"] == "0" and not (again / "course" / "overrides.csv").exists()


def test_another_policy_is_refused_unless_asked_for_by_name(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    other = tmp_path / "other.toml"
    other.write_text(POLICY.replace("per_day = 0.1", "per_day = 0.5"))
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), "--policy", str(other), *ARGS)
    assert done.returncode == 2, done.stderr
    assert f"{other}, line 1: this policy differs from the policy this class was graded with" in done.stderr
    assert "--change-policy" in done.stderr and "reference solutions" not in done.stderr
    assert (again / "grades.csv").read_text() == (out / "grades.csv").read_text()  # nothing lost
    done = run_grade(
        "grade",
        "--submissions",
        str(subs),
        "--out",
        str(again),
        "--policy",
        str(other),
        "--change-policy",
        *ARGS,
    )
    assert done.returncode == 0 and "policy: changed, asked for with --change-policy" in done.stderr, (
        done.stderr
    )


BAD = {
    "roster": ("student,name\nalice,A\nalice,B\n", "line 3: the student id 'alice' is already on line 2"),
    "policy": ("[labs.3]\nweight = -2\n", "line 2: [labs.3] weight must not be negative"),
    "overrides": ("student,lab,points\nalice,3,1\nbob,3,1\n", "line 3: no student 'bob' in this class"),
    "extensions": ("student,lab,days\nalice,3,soon\n", "line 2: days must be a number, got 'soon'"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_input_exits_2_naming_its_line_before_any_reference_is_graded(graded, tmp_path, name):
    subs, _, paths = graded[:3]
    text, says = BAD[name]
    bad = tmp_path / f"bad-{name}"
    bad.write_text(text)
    out = tmp_path / "out"
    done = run_grade(
        "grade", "--submissions", str(subs), "--out", str(out), *flags(paths | {name: bad}), *ARGS
    )
    assert done.returncode == 2, done.stderr
    assert f"{bad}, {says}" in done.stderr
    assert "reference solutions" not in done.stderr and not out.exists()


def test_a_student_in_the_overrides_who_is_not_on_the_roster_is_refused(graded, tmp_path):
    subs, _, paths = graded[:3]
    (tmp_path / "roster.csv").write_text(
        "student\nalice\nzoe\n"
    )  # dora's folder is there, but not on the roster
    done = run_grade(
        "grade",
        "--submissions",
        str(subs),
        "--out",
        str(tmp_path / "out"),
        *flags(paths | {"roster": tmp_path / "roster.csv"}),
        *ARGS,
    )
    assert done.returncode == 2 and "line 2: no student 'dora' in this class" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_shards_merged_in_either_order_are_byte_for_byte_the_one_run(graded, tmp_path):
    same_kit(graded)
    subs, out, paths = graded[:3]
    assert collect.shard_of("alice", 2) != collect.shard_of(
        "dora", 2
    )  # the extension and the override: apart
    parts = []
    for i in (1, 2):
        part = copy_run(out, tmp_path / f"part{i}", state=False)
        done = run_grade(
            "grade", "--submissions", str(subs), "--out", str(part), "--shard", f"{i}/2", *flags(paths), *ARGS
        )
        assert done.returncode == 0 and "to grade" not in done.stderr, done.stderr
        parts.append(part)
    for order, merged in (((0, 1), tmp_path / "m12"), ((1, 0), tmp_path / "m21")):
        done = run_grade("scoreboard", "merge", *(str(parts[i]) for i in order), "--out", str(merged))
        assert done.returncode == 0, done.stderr
    for name in [
        *FILES,
        "course/manifest.json",
        "course/overrides.csv",
        "course/extensions.csv",
        "course/roster.csv",
        "course/policy.toml",
        *(f"feedback/{s}.md" for s in ("alice", "dora", "zoe")),
    ]:
        one = (out / name).read_bytes()
        assert (tmp_path / "m12" / name).read_bytes() == one, name
        assert (tmp_path / "m21" / name).read_bytes() == one, name
    kept = sorted(p.relative_to(out / "history") for p in (out / "history").rglob("*.ipynb"))
    assert (
        sorted(
            p.relative_to(tmp_path / "m21" / "history")
            for p in (tmp_path / "m21" / "history").rglob("*.ipynb")
        )
        == kept
    )


def test_a_merge_of_parts_graded_with_another_kit_or_policy_is_refused_and_writes_nothing(graded, tmp_path):
    out = graded[1]
    for key, value, what in (
        ("kit", "0" * 64, "version of the kit"),
        ("policy", {"combine": "any"}, "policy"),
    ):
        other = tmp_path / f"other-{key}"
        shutil.copytree(out, other)
        data = json.loads((other / "scoreboard.json").read_text())
        data[key] = value
        (other / "scoreboard.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        line = next(
            n
            for n, t in enumerate((other / "scoreboard.json").read_text().splitlines(), 1)
            if t.startswith(f' "{key}":')
        )
        done = run_grade("scoreboard", "merge", str(out), str(other), "--out", str(tmp_path / "merged"))
        assert done.returncode == 2, done.stderr
        assert f"scoreboard.json, line {line}: graded with another {what} than" in done.stderr
        assert str(other / "scoreboard.json") in done.stderr and str(out / "scoreboard.json") in done.stderr
        assert not (tmp_path / "merged").exists()


def test_retry_grades_a_kept_timeout_again_and_without_it_the_timeout_stays(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    unit = again / "units" / "alice" / "lab-3" / "cpu-1.json"
    kept = json.loads(unit.read_text())
    kept["row"].update(
        status="timeout",
        passed=0,
        message="the run took more than 120 s",  # as under load
        tests=[t | {"status": "failed", "message": "timeout"} for t in kept["row"]["tests"]],
    )
    unit.write_text(json.dumps(kept))
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), *ARGS)
    assert "to grade" not in done.stderr and grades(again)["alice", "3"]["points"] == "0"
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), "--retry", *ARGS)
    assert done.returncode == 0, done.stderr
    assert "grading 3 students: 1 to grade" in done.stderr and "alice lab-3 cpu-1: ok" in done.stderr
    assert grades(again)["alice", "3"]["points"] == str(LAB_3_TESTS)


def test_students_grades_only_the_named_students_again(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), "--students", "dora", *ARGS)
    assert done.returncode == 0, done.stderr
    graded_now = [ln.split("] ")[1].split(":")[0] for ln in done.stderr.splitlines() if ln.startswith("[")]
    assert graded_now == ["dora lab-3 cpu-1"]
    done = run_grade(
        "grade", "--submissions", str(subs), "--out", str(again), "--students", "dora,nobody", *ARGS
    )
    assert done.returncode == 2 and "--students names nobody: not in this class" in done.stderr


NOT_THE_TERM = ("--jobs", "2", "--timeout", "120", "--isolation", "limits-only")  # ARGS less the term's scope


def test_the_bare_command_grades_the_kept_sources_labs_and_configurations(graded, tmp_path):
    same_kit(graded)
    out = graded[1]
    again = copy_run(out, tmp_path / "again")
    done = run_grade("grade", "--out", str(again), *NOT_THE_TERM)  # no --submissions, --labs, --configs
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr and "term (" in done.stderr  # lab 3 on cpu-1, kept: nothing new
    for name in FILES:
        assert (again / name).read_text() == (out / name).read_text(), name


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_a_regrade_answered_with_a_test_override_on_the_review_page_is_in_the_next_grades(graded, tmp_path):
    """`make review`'s regrade request, answered by setting one of alice's tests failed: the next `labkit grade`
    (the kept inputs, nothing run again) applies it in grades.csv and puts the reply in her feedback."""
    from starlette.testclient import TestClient

    from labkit.grading.review import app
    from labkit.grading.review.guard import Gate

    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    rows = json.loads((again / "scoreboard.json").read_text())["rows"]
    test = next(r for r in rows if r["student"] == "alice")["tests"][0]["test"]
    gate = Gate("token", frozenset({"testserver"}), frozenset({"testclient"}))
    reply = "the mesh is right but the test's shape is not: this test does not pass"
    with TestClient(app.make(again, gate, "ta"), base_url="http://testserver") as c:
        c.get("/?token=token")
        headers = {"origin": "http://testserver"}
        asked = {"csrf": gate.csrf(), "student": "alice", "lab": "3", "words": "please look"}
        where = c.post("/regrades", data=asked, headers=headers, follow_redirects=False).headers["location"]
        answer = {"csrf": gate.csrf(), "reply": reply, "test": test, "status": "failed"}
        assert c.post(where, data=answer, headers=headers, follow_redirects=False).status_code == 303
    done = run_grade("grade", "--submissions", str(subs), "--out", str(again), *ARGS)
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr
    mine = grades(again)
    assert mine["alice", "3"]["points"] != grades(out)["alice", "3"]["points"]
    assert reply in mine["alice", "3"]["overridden"]
    assert mine["dora", "3"]["overridden"] == "partial credit by hand"  # the kept override, kept
    assert "the mesh is right" in (again / "feedback" / "alice.md").read_text()


def held_lab_5(folder: Path) -> None:
    """Make the graded class's state a term of labs 3 and 5, lab 5's rows a copy of lab 3's (nothing runs)."""
    results = json.loads((folder / "scoreboard.json").read_text())
    results["rows"] += [r | {"lab": 5} for r in results["rows"] if r["lab"] == 3]
    results["labs"] += [lab | {"number": 5, "name": "lab-5"} for lab in results["labs"] if lab["number"] == 3]
    for info in results["students"].values():
        if "3" in info.get("submissions", {}):
            info["submissions"]["5"] = info["submissions"]["3"]
    (folder / "scoreboard.json").write_text(json.dumps(results))
    kept = json.loads((folder / "course" / "term.json").read_text())
    (folder / "course" / "term.json").write_text(json.dumps(kept | {"labs": [3, 5]}))


def test_a_narrower_run_grades_only_its_units_and_holds_every_other_grade(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    held_lab_5(again)
    moved = tmp_path / "moved"
    shutil.copytree(subs, moved)
    write(
        moved / "alice" / "lab-3.ipynb", (ROOT / "labs" / "lab-3.ipynb").read_text()
    )  # alice's changed since
    done = run_grade(
        "grade",
        "--submissions",
        str(moved),
        "--out",
        str(again),
        "--labs",
        "3",
        "--students",
        "dora",
        *NOT_THE_TERM,
    )
    assert done.returncode == 0, done.stderr
    graded_now = [ln.split("] ")[1].split(":")[0] for ln in done.stderr.splitlines() if ln.startswith("[")]
    assert graded_now == ["dora lab-3 cpu-1"]
    assert "submissions: now" in done.stderr and "every other unit is held as it was" in done.stderr
    mine = grades(again)
    assert mine["alice", "3"]["points"] == str(LAB_3_TESTS)  # held: the notebook graded before, as it was
    assert mine["alice", "5"]["points"] == str(LAB_3_TESTS) and mine["zoe", "5"]["status"] == "missing"
    assert (mine["dora", "3"]["points"], mine["dora", "3"]["overridden"]) == ("4", "partial credit by hand")
    assert "lab-5" in (again / "feedback" / "alice.md").read_text()


def test_a_pinned_version_counts_though_a_later_one_was_handed_in(graded, tmp_path):
    same_kit(graded)
    subs, out = graded[:2]
    again = copy_run(out, tmp_path / "again")
    first = history.digest(subs / "alice" / "lab-3.ipynb")
    moved = tmp_path / "moved"
    shutil.copytree(subs, moved)
    write(moved / "alice" / "lab-3.ipynb", (ROOT / "labs" / "lab-3.ipynb").read_text())  # handed in again
    pinned = tmp_path / "pins.csv"
    pinned.write_text(f"student,lab,version,comment\nalice,3,{first[:12]},the resubmission was a mistake\n")
    done = run_grade("grade", "--submissions", str(moved), "--out", str(again), "--pins", str(pinned), *ARGS)
    assert done.returncode == 0, done.stderr
    assert "to grade" not in done.stderr  # the pinned bytes were graded before: nothing runs
    assert "alice lab-3: the version handed in" in done.stderr and "pinned by a TA" in done.stderr
    assert grades(again)["alice", "3"]["points"] == str(LAB_3_TESTS)
    assert "pinned by a TA" in (again / "feedback" / "alice.md").read_text()
    assert len(history.read(again, "alice", 3)) == 2  # the resubmission kept too, to be pinned instead
    bad = tmp_path / "bad-pins.csv"
    bad.write_text("student,lab,version,comment\nalice,3,00000000,\n")
    done = run_grade("grade", "--submissions", str(moved), "--out", str(again), "--pins", str(bad), *ARGS)
    assert done.returncode == 2 and f"{bad}, line 2: no kept version of alice's lab 3" in done.stderr, (
        done.stderr
    )
    assert "reference solutions" not in done.stderr
    assert (again / "course" / "pins.csv").read_text() == pinned.read_text()  # the kept pins as they were


# ----------------------------------------------------------------------------------------
# The other paths: Slurm, the container, progress; and the registry itself.
# ----------------------------------------------------------------------------------------


def make_plan(*args: str) -> str:
    return subprocess.run(
        ["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    ).stdout


def planned_words(plan: str) -> list[str]:
    """The words of the `python -m labkit ...` line of a `make -n` plan, as the shell splits them."""
    line = next(ln for ln in plan.replace("\\\n", " ").splitlines() if " -m labkit " in ln)
    return shlex.split(line.lstrip("@"))


def test_a_download_the_browser_renamed_and_odd_paths_reach_grade_and_slurm_grade_as_one_word_each():
    odd = {
        "SUBMISSIONS": "/tmp/x/submissions (1).zip",
        "ROSTER": "/tmp/x/roster (1).csv",
        "OUT": "/tmp/x/the TA's scoreboard",
        "COURSE": "/tmp/x/course; rm -rf x",
    }
    for target in ("grade", "slurm-grade"):
        words = planned_words(make_plan(target, "SHARDS=2", *(f"{k}={v}" for k, v in odd.items())))
        for flag, value in (
            ("--submissions", odd["SUBMISSIONS"]),
            ("--roster", odd["ROSTER"]),
            ("--out", odd["OUT"]),
            ("--course", odd["COURSE"]),
        ):
            assert words[words.index(flag) + 1] == value, (target, flag, words)


def test_make_slurm_grade_and_docker_grade_pass_every_ta_input():
    plan = make_plan(
        "slurm-grade",
        "SHARDS=2",
        "ROSTER=r.csv",
        "POLICY=p.toml",
        "OVERRIDES=o.csv",
        "EXTENSIONS=e.csv",
        "STUDENTS=a,b",
        "RETRY=1",
    )
    words = planned_words(plan)
    for flag in (
        ["--roster", "r.csv"],
        ["--policy", "p.toml"],
        ["--overrides", "o.csv"],
        ["--extensions", "e.csv"],
        ["--students", "a,b"],
        ["--retry"],
    ):
        assert any(words[i : i + len(flag)] == flag for i in range(len(words))), flag
    # docker-grade's: tests/kit/test_container.py, test_docker_grade_mounts_each_ta_file_given_...


def test_slurm_grade_checks_and_keeps_the_inputs_and_every_shard_reads_them(graded, tmp_path, monkeypatch):
    from labkit import cli

    subs, _, paths = graded[:3]
    submitted = []
    monkeypatch.setattr(slurm, "submit", lambda request: submitted.append(request) or ("1", "2"))
    out = tmp_path / "out"
    code = cli.main(
        [
            "slurm-grade",
            "--submissions",
            str(subs),
            "--out",
            str(out),
            "--shards",
            "2",
            "--labs",
            "3",
            "--configs",
            "cpu-1",
            "--no-wait",
            "--students",
            "dora",
            *flags(paths),
        ]
    )
    assert code == 0 and len(submitted) == 1
    shard = slurm.scripts(submitted[0], ROOT)["shard.sh"]
    assert f"--course {out / 'course'}" in shard and "--students dora" in shard
    kept = course.read_manifest(out / "course")["inputs"]
    assert sorted(kept) == ["extensions", "overrides", "policy", "roster"]
    assert kept["overrides"]["from"] == str(paths["overrides"])
    bad = tmp_path / "bad.csv"
    bad.write_text("student,lab,points\nnobody,3,1\n")
    code = cli.main(
        [
            "slurm-grade",
            "--submissions",
            str(subs),
            "--out",
            str(tmp_path / "o2"),
            "--shards",
            "2",
            "--no-wait",
            *flags(paths | {"overrides": bad}),
        ]
    )
    assert code == 2 and len(submitted) == 1  # refused before anything was submitted


def test_slurm_grade_refuses_an_out_that_holds_a_local_run(tmp_path):
    (tmp_path / "units").mkdir()
    with pytest.raises(slurm.SlurmError, match="holds a grading run made here"):
        slurm.check_out(tmp_path)


def test_progress_reads_a_local_run_started_after_a_slurm_run_not_the_stale_shards(tmp_path):
    for i in (1, 2):
        progress.record(
            tmp_path / "shards" / str(i), phase="grading 5 students", total=10, done=10, started=100.0
        )
        (tmp_path / "shards" / str(i) / "scoreboard.json").write_text("{}")
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.json").write_text(
        json.dumps({"array": "1", "merge": "2", "shards": 2, "submitted": 90.0})
    )
    progress.record(tmp_path, phase="grading 30 students", total=30, done=3, started=200.0)
    line = progress.summary(progress.parts(tmp_path), now=210.0)
    assert line.startswith("shards finished 0/1, units graded 3/30"), line


def test_progress_of_a_new_slurm_submission_takes_no_earlier_shard_for_finished(tmp_path):
    (tmp_path / "shards" / "1").mkdir(parents=True)
    (tmp_path / "shards" / "1" / "scoreboard.json").write_text("{}")  # left by the submission before
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.json").write_text(
        json.dumps({"array": "1", "merge": "2", "shards": 2, "submitted": 300.0})
    )
    line = progress.summary(progress.parts(tmp_path), now=310.0)
    assert line.startswith("shards finished 0/1"), line


def test_once_the_jobs_have_left_the_queue_a_shard_cancelled_while_it_ran_is_said_failed(tmp_path):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.json").write_text(
        json.dumps({"array": "1", "merge": "2", "shards": 2, "submitted": 90.0})
    )
    progress.record(tmp_path / "shards" / "1", phase="grading 2 students", total=2, done=2, started=100.0)
    (tmp_path / "shards" / "1" / "scoreboard.json").write_text("{}")
    (tmp_path / "slurm" / "shard-1.exit").write_text("0\n")
    progress.record(tmp_path / "shards" / "2", phase="reference solutions", total=1, done=0, started=100.0)
    while_queued = progress.summary(slurm.parts_with_exits(tmp_path, 2), now=200.0)
    assert "failed" not in while_queued, while_queued  # it may still be running
    ended = progress.summary(slurm.parts_with_exits(tmp_path, 2, ended=True), now=200.0)
    assert ended.endswith("; failed: shard 2"), ended


def test_the_makefile_takes_its_input_flags_from_the_registry():
    names = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "labkit.grading.state.course", "names"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert names == list(course.INPUTS)
    makefile = (ROOT / "Makefile").read_text()
    assert "$(shell $(PY) -m labkit.grading.state.course names" in makefile
    assert [n for n in names if f"\n{n.upper().replace('-', '_')} ?=\n" not in makefile] == []


def test_the_bare_make_grade_gives_no_sources_labs_or_configurations_so_the_term_decides():
    # a default for SUBMISSIONS anywhere in the Makefile (docker-grade's) made every bare `make grade` name
    # `submissions/`, which a class whose term is LMS downloads does not have: exit 2 instead of "the same again"
    plan = make_plan("grade", "OUT=scoreboard")
    assert "labkit grade" in plan
    for flag in ("--submissions", "--labs", "--configs"):
        assert flag not in plan, plan
    words = planned_words(make_plan("grade", "SUBMISSIONS=canvas.zip"))
    assert words[words.index("--submissions") + 1] == "canvas.zip"


def test_a_merge_is_the_same_whatever_order_the_parts_come_in():
    base = {"format": 1, "labs": [{"number": 3}], "configs": [{"name": "cpu-1"}], "kit": "k", "notes": ["n"]}
    one = base | {
        "students": {"a": {"notes": []}},
        "rows": [{"student": "a", "lab": 3, "config": "cpu-1"}],
        "notes": ["n", "only a's part says this"],
    }
    two = base | {
        "students": {"b": {"notes": []}},
        "rows": [{"student": "b", "lab": 3, "config": "cpu-1"}],
        "notes": ["only b's part says this", "n"],
    }
    assert merge.merge([one, two]) == merge.merge([two, one])
    assert json.dumps(merge.merge([one, two])) == json.dumps(merge.merge([two, one]))


def test_a_kept_input_whose_copy_is_gone_is_named(tmp_path):
    folder = tmp_path / "course"
    folder.mkdir()
    (folder / "manifest.json").write_text(
        json.dumps(
            {"format": 1, "inputs": {"overrides": {"file": "overrides.csv", "from": "o.csv", "sha256": "x"}}}
        )
    )
    with pytest.raises(course.InputError, match="the kept copy of the overrides is gone"):
        course.read(folder, {})
