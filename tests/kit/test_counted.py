"""Which submission counts (labkit/grading/intake/counted.py): the policy's `counts` rule, or a TA's pin.

A late resubmission silently replaced the graded on-time version (issue 58, defect 5), and the on-time one,
kept in OUT/history, could not be chosen. No notebook runs here; test_course_state.py grades with a pin.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from labkit.grading.intake import counted
from labkit.grading.intake.collect import Submissions
from labkit.grading.intake.handin import Class
from labkit.grading.state import history, pins
from labkit.grading.state import policy as policy_mod
from labkit.grading.state.errors import GradeError

ON_TIME, LATE = "2026-03-01T10:00:00-08:00", "2026-03-03T10:00:00-08:00"
POLICY = '[labs.3]\ndue = 2026-03-01T23:59:00-08:00\n\n[late]\nper_day = 0.1\naccept = ["gradescope"]\n'


def nb(tag: str) -> str:
    return json.dumps({"cells": [], "metadata": {"tag": tag}, "nbformat": 4, "nbformat_minor": 5})


def tag_of(path: Path) -> str:
    return json.loads(Path(path).read_text())["metadata"]["tag"]


def term_so_far(tmp_path: Path) -> tuple[Path, Class, str]:
    """alice's lab 3: an on-time version kept from week 1, and the late resubmission of week 2 handed in last."""
    out = tmp_path / "out"
    first = tmp_path / "week1" / "alice" / "lab-3.ipynb"
    first.parent.mkdir(parents=True)
    first.write_text(nb("on time"))
    kept = history.keep(
        out, "alice", 3, first, submitted_at=ON_TIME, source="gradescope", times={"gradescope": ON_TIME}
    )
    latest = tmp_path / "collected" / "alice" / "lab-3.ipynb"
    latest.parent.mkdir(parents=True)
    latest.write_text(nb("late"))
    info = {
        "submitted_at": LATE,
        "late": False,
        "source": "gradescope",
        "file": "x",
        "times": {"gradescope": LATE},
    }
    klass = Class(
        Submissions(students={"alice": {3: latest}}, notes={"alice": []}), {("alice", 3): info}, set()
    )
    return out, klass, kept["digest"]


def choose(out, klass, policy_text: str, pinned: str = "") -> str:
    said = io.StringIO()
    grading = policy_mod.parse(policy_text, "policy.toml", [3, 5])
    chosen = pins.parse_pins(pinned, "pins.csv", {"alice"}, {3, 5}) if pinned else {}
    counted.choose(out, klass, grading, chosen, {}, [3, 5], said)
    return said.getvalue()


def test_by_default_the_latest_counts_and_is_charged_by_the_policys_time(tmp_path):
    out, klass, _ = term_so_far(tmp_path)
    assert choose(out, klass, POLICY) == ""
    assert (
        tag_of(klass.subs.students["alice"][3]) == "late"
        and klass.times["alice", 3]["times"]["gradescope"] == LATE
    )
    assert [v["times"]["gradescope"] for v in history.read(out, "alice", 3)] == [ON_TIME]  # not graded yet


def test_last_on_time_grades_the_on_time_version_and_says_so(tmp_path):
    out, klass, digest = term_so_far(tmp_path)
    said = choose(out, klass, POLICY.replace("due =", 'counts = "last-on-time"\ndue ='))
    assert tag_of(klass.subs.students["alice"][3]) == "on time"
    assert klass.times["alice", 3]["times"] == {"gradescope": ON_TIME}  # charged by its own time: on time
    assert ON_TIME in said and LATE in said and digest[:12] in said
    assert any("counts" in n and LATE in n for n in klass.subs.notes["alice"])
    kept = history.read(out, "alice", 3)  # the late one kept too, with its time, to be pinned later
    assert [v["times"]["gradescope"] for v in kept] == [ON_TIME, LATE]


def test_last_on_time_takes_the_latest_where_no_version_was_on_time(tmp_path):
    out, klass, _ = term_so_far(tmp_path)
    early = POLICY.replace("2026-03-01T23:59:00", "2026-02-20T23:59:00").replace(
        "due =", 'counts = "last-on-time"\ndue ='
    )
    assert choose(out, klass, early) == "" and tag_of(klass.subs.students["alice"][3]) == "late"


def test_a_ta_pins_a_kept_version_for_one_student(tmp_path):
    out, klass, digest = term_so_far(tmp_path)
    said = choose(
        out, klass, POLICY, f"student,lab,version,comment\nalice,3,{digest[:10]},the late one was a mistake\n"
    )
    assert tag_of(klass.subs.students["alice"][3]) == "on time" and "pinned by a TA" in said


def test_a_pin_that_names_no_kept_version_stops_the_run_naming_the_line(tmp_path):
    out, klass, digest = term_so_far(tmp_path)
    with pytest.raises(
        GradeError, match=r"pins.csv, line 2: no kept version .* starts 00000000.*" + digest[:12]
    ):
        choose(out, klass, POLICY, "student,lab,version,comment\nalice,3,00000000,\n")
    with pytest.raises(pins.PinError, match="pins.csv, line 2: version 'later' is not the start of a sha256"):
        pins.parse_pins("student,lab,version\nalice,3,later\n", "pins.csv", {"alice"}, {3})
    with pytest.raises(GradeError, match="pins.csv, line 2: alice handed in no lab 5"):
        choose(out, klass, POLICY, "student,lab,version\nalice,5,abcdef12\n")


def test_the_policy_names_which_submission_counts_per_lab_or_course():
    course = policy_mod.parse(
        '[grading]\ncounts = "last-on-time"\n[labs.5]\ncounts = "latest"\n', "p.toml", [3, 5]
    )
    assert (course.counts_for(3), course.counts_for(5)) == ("last-on-time", "latest")
    assert policy_mod.Policy.from_json(course.to_json()) == course
    assert "counts" not in policy_mod.parse("", "p.toml", [3]).to_json()  # a class graded before is unchanged
    with pytest.raises(
        policy_mod.PolicyError, match="counts = 'best': grading every kept version .* not built"
    ):
        policy_mod.parse('[grading]\ncounts = "best"\n', "p.toml", [3])
    with pytest.raises(policy_mod.PolicyError, match=r"\[labs.3\] counts = 'first' is not one of latest"):
        policy_mod.parse('[labs.3]\ncounts = "first"\n', "p.toml", [3])


def test_a_bad_pin_is_found_before_anything_is_kept(tmp_path):
    out, klass, digest = term_so_far(tmp_path)
    good = pins.parse_pins(f"student,lab,version\nalice,3,{digest[:8]}\n", "pins.csv", {"alice"}, {3})
    counted.check_pins(out, klass, good)
    bad = pins.parse_pins("student,lab,version\nalice,3,deadbeef\n", "pins.csv", {"alice"}, {3})
    with pytest.raises(GradeError, match="pins.csv, line 2: no kept version"):
        counted.check_pins(out, klass, bad)
    assert len(history.read(out, "alice", 3)) == 1  # nothing kept by the check


def test_slurm_grades_check_refuses_a_bad_pin_before_any_shard_and_keeps_nothing(tmp_path):
    from labkit.grading import grade

    subs = tmp_path / "submissions"
    (subs / "alice").mkdir(parents=True)
    (subs / "alice" / "lab-3.ipynb").write_text(nb("handed in"))
    bad = tmp_path / "pins.csv"
    bad.write_text("student,lab,version,comment\nalice,3,deadbeef,\n")
    out = tmp_path / "out"
    with pytest.raises(GradeError, match=f"{bad}, line 2: no kept version of alice's lab 3"):
        grade.prepare(subs, out, inputs={"pins": bad}, labs="3", config_names="cpu-1", stream=io.StringIO())
    assert not (out / "course" / "pins.csv").exists()
