"""Due dates, the late policy and extensions; and where each submission's time comes from.

The first part works on submission times written by hand. The second reads real downloads and
folders (a Canvas zip, a Gradescope export, a git repository, files with set modification times)
through the grading run's own collection code, and grades the results under a policy: no notebook
is run, so the file takes seconds.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import zipfile
from datetime import datetime

import pytest
from test_policy import bob_rows, results, row, t

from labkit.course import catalog
from labkit.grading.intake import handin
from labkit.grading.publish import markdown, scoreboard
from labkit.grading.state import deadlines, policy, roster

DUE = "2026-03-01T23:59:00-08:00"
LATE = {"per_day": 0.1, "cap": 0.3, "grace_minutes": 15}


def test_a_submission_before_the_due_date_keeps_every_point():
    assert deadlines.penalty("2026-03-01T20:00:00-08:00", DUE, LATE) == (0.0, 0.0)


def test_a_submission_within_the_grace_period_is_on_time():
    assert deadlines.penalty("2026-03-02T00:10:00-08:00", DUE, LATE) == (0.0, 0.0)


def test_each_day_or_part_of_a_day_late_takes_its_share():
    assert deadlines.penalty("2026-03-02T00:30:00-08:00", DUE, LATE) == (0.1, 1)
    assert deadlines.penalty("2026-03-03T12:00:00-08:00", DUE, LATE) == (0.2, 2)


def test_the_penalty_never_passes_its_cap():
    assert deadlines.penalty("2026-03-20T00:00:00-08:00", DUE, LATE) == (0.3, 19)


def test_an_extension_moves_the_due_date():
    assert deadlines.penalty("2026-03-03T12:00:00-08:00", DUE, LATE, extension_days=2) == (0.0, 0.0)


def test_times_in_other_zones_and_gradescopes_format_compare_as_instants():
    assert deadlines.penalty("2026-03-02 08:10:00.000000000 +00:00", DUE, LATE) == (0.0, 0.0)  # 11 min late
    assert deadlines.penalty("2026-03-02T08:30:00Z", DUE, LATE) == (0.1, 1)


def test_a_time_without_an_offset_is_refused():
    with pytest.raises(deadlines.DeadlineError, match="no time zone"):
        deadlines.parse_time("2026-03-02 08:30:00")


def test_the_policy_file_takes_due_dates_with_an_offset_and_the_late_policy():
    p = policy.parse(
        "[labs.3]\ndue = 2026-03-01T23:59:00-08:00\n[late]\nper_day = 0.1\ncap = 0.3\n",
        "tests/policy.toml",
        known_labs=[3],
    )
    assert p.due == {3: DUE} and p.late == {"per_day": 0.1, "cap": 0.3}
    with pytest.raises(policy.PolicyError, match="due must be a date and time with its offset"):
        policy.parse("[labs.3]\ndue = 2026-03-01T23:59:00\n", "tests/policy.toml", known_labs=[3])


def test_a_late_lab_loses_its_share_of_points_and_says_so():
    res = results(bob_rows(), policy.Policy(due={3: DUE}, late=LATE))
    res["students"]["bob"]["submissions"] = {
        "3": {
            "digest": "x",
            "submitted_at": "2026-03-02T12:00:00-08:00",
            "times": {"gradescope": "2026-03-02T12:00:00-08:00"},
        }
    }
    lab = policy.grades(res)["students"]["bob"]["labs"]["3"]
    assert (lab["points"], lab["late_days"], lab["late_penalty"]) == (1.8, 1, 0.1)
    assert "2/5" not in markdown.to_markdown(res)
    assert "1.8/5 (late 1d, -10%, by Gradescope's submission time)" in markdown.to_markdown(res)


def test_extensions_name_students_and_labs_of_the_class():
    text = "student,lab,days\nbob,3,2\n"
    assert deadlines.parse_extensions(text, "ext.csv", {"bob"}, {3}) == {"bob": {"3": 2.0}}
    with pytest.raises(deadlines.DeadlineError, match="ext.csv, line 2: no student 'zed'"):
        deadlines.parse_extensions("student,lab,days\nzed,3,2\n", "ext.csv", {"bob"}, {3})
    with pytest.raises(deadlines.DeadlineError, match="ext.csv, line 2: no lab '9'"):
        deadlines.parse_extensions("student,lab,days\nbob,9,2\n", "ext.csv", {"bob"}, {3})
    with pytest.raises(deadlines.DeadlineError, match="missing column days"):
        deadlines.parse_extensions("student,lab\nbob,3\n", "ext.csv", {"bob"}, {3})


# ----------------------------------------------------------------------------------------
# Where a submission's time comes from, and which sources a late penalty may count from.
# ----------------------------------------------------------------------------------------

PAST_DUE = "2026-03-01T23:59:00-08:00"  # long before any test collects a file: collection is always "late"
ROSTER = roster.parse("student,name,email,lms_id\nalice,Alice L,alice@u.edu,4411\nbob,Bob M,bob@u.edu,4412\n")
NB = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def graded(submissions, tmp_path, late=None, people=ROSTER) -> dict:
    """Lab 3's grades when everyone passed every test: the times recorded by the grading run's own
    collection code (an LMS download read in, the history kept), under a policy with a past due date."""
    out = tmp_path / "out"
    subs, lms_times = handin.submissions_of(submissions, out, people, io.StringIO())
    labs = [lab for lab in catalog.labs() if lab.number == 3]
    pol = policy.Policy(due={3: PAST_DUE}, late={"per_day": 0.1, "cap": 0.5, **(late or {})})
    handed = handin.keep(out, subs, sorted(subs.students), labs, lms_times)
    rows = [
        row(s, c, [t("doubles", "passed", 2), t("split", "passed", 3)])
        for s in subs.students
        for c in ("cpu-1", "cpu-8")
    ]
    res = results(rows, pol)
    for (student, lab), info in handed.items():
        res["students"][student].setdefault("submissions", {})[str(lab)] = info
    return res


def lab3(res, student):
    return policy.grades(res)["students"][student]["labs"]["3"]


def canvas_zip(tmp_path):
    path = tmp_path / "canvas.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("liddellalice_4411_90001_lab-3.ipynb", NB)
        z.writestr("mbob_LATE_4412_90002_lab-3.ipynb", NB)
    return path


def test_a_canvas_file_not_marked_late_is_on_time_whenever_the_kit_collected_it(tmp_path):
    alice = lab3(graded(canvas_zip(tmp_path), tmp_path), "alice")
    assert (alice["points"], alice.get("late_days"), alice.get("late_penalty")) == (5, None, None)
    assert alice["time_source"] == "canvas"


def test_a_file_canvas_marked_late_is_charged_one_day_and_says_canvas_flagged_it(tmp_path):
    res = graded(canvas_zip(tmp_path), tmp_path)
    bob = lab3(res, "bob")
    assert (bob["points"], bob["late_days"], bob["late_penalty"], bob["time_source"]) == (
        4.5,
        1,
        0.1,
        "canvas",
    )
    assert "by Canvas's late flag (_LATE in the file's name)" in markdown.to_markdown(res)
    assert "Canvas marked it late (_LATE), which carries no time: charged as 1 day late" in markdown.feedback(
        res, "bob"
    )


def test_a_notebook_collected_through_canvas_api_is_charged_the_days_it_was_late(tmp_path):
    folder = tmp_path / "canvas-subs"
    (folder / "bob").mkdir(parents=True)
    (folder / "bob" / "lab-3.ipynb").write_text(NB)
    (folder / "canvas_submissions.json").write_text(
        json.dumps(
            {
                "format": 1,
                "source": "canvas-api",
                "submissions": {
                    "bob/lab-3.ipynb": {
                        "user_id": "4412",
                        "submitted_at": "2026-03-04T10:00:00Z",
                        "late": True,
                    }
                },
            }
        )
    )
    bob = lab3(graded(folder, tmp_path), "bob")
    assert (bob["points"], bob["late_days"], bob["late_penalty"], bob["time_source"]) == (
        3.5,
        3,
        0.3,
        "canvas",
    ), bob


def test_canvas_flag_is_not_charged_when_the_policy_does_not_accept_it(tmp_path):
    bob = lab3(graded(canvas_zip(tmp_path), tmp_path, late={"accept": ["gradescope"]}), "bob")
    assert (bob["points"], bob.get("late_days"), bob["time_source"]) == (5, None, "canvas")
    assert "does not accept" in bob["late_note"]


GRADESCOPE_META = {
    "submission_1": {
        ":submitters": [{":sid": "4411", ":email": "alice@u.edu"}],
        ":created_at": "2026-03-01 20:00:00.000000000 -08:00",
    },
    "submission_2": {
        ":submitters": [{":sid": "4412", ":email": "bob@u.edu"}],
        ":created_at": "2026-03-03 12:00:00.000000000 -08:00",
    },
}


@pytest.mark.parametrize("metadata", ["submission_metadata.yml", "submission_metadata.json"])
def test_a_penalty_counts_from_gradescopes_submission_time(tmp_path, metadata):
    path = tmp_path / "gradescope.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"export/{metadata}", json.dumps(GRADESCOPE_META))  # JSON is YAML too
        z.writestr("export/submission_1/lab-3.ipynb", NB)
        z.writestr("export/submission_2/lab-3.ipynb", NB)
    res = graded(path, tmp_path)
    alice, bob = lab3(res, "alice"), lab3(res, "bob")
    assert (alice["points"], alice.get("late_days"), alice["time_source"]) == (5, None, "gradescope")
    assert (bob["points"], bob["late_days"], bob["time_source"]) == (4.0, 2, "gradescope")


def test_gradescopes_autograder_metadata_in_a_students_folder_dates_its_notebook(tmp_path):
    (tmp_path / "subs" / "bob").mkdir(parents=True)
    (tmp_path / "subs" / "bob" / "lab-3.ipynb").write_text(NB)
    (tmp_path / "subs" / "bob" / "submission_metadata.json").write_text(
        json.dumps(
            {"id": 1, "created_at": "2026-03-02T12:00:00.000000-08:00", "users": [{"email": "bob@u.edu"}]}
        )
    )
    bob = lab3(graded(tmp_path / "subs", tmp_path, people=None), "bob")
    assert (bob["points"], bob["late_days"], bob["time_source"]) == (4.5, 1, "gradescope")


def plain_folder(tmp_path, when: str):
    folder = tmp_path / "subs" / "bob"
    folder.mkdir(parents=True)
    (folder / "lab-3.ipynb").write_text(NB)
    stamp = datetime.fromisoformat(when).timestamp()
    os.utime(folder / "lab-3.ipynb", (stamp, stamp))
    return tmp_path / "subs"


def test_a_plain_folders_file_time_is_recorded_but_not_charged_by_default(tmp_path):
    bob = lab3(graded(plain_folder(tmp_path, "2026-03-03T12:00:00-08:00"), tmp_path, people=None), "bob")
    assert (bob["points"], bob.get("late_days"), bob["time_source"]) == (5, None, "mtime")
    assert "late by the file's modification time, which the policy does not accept" in bob["late_note"]


def test_a_plain_folders_file_time_is_charged_when_the_policy_accepts_it(tmp_path):
    res = graded(
        plain_folder(tmp_path, "2026-03-03T12:00:00-08:00"), tmp_path, late={"accept": ["mtime"]}, people=None
    )
    bob = lab3(res, "bob")
    assert (bob["points"], bob["late_days"], bob["time_source"]) == (4.0, 2, "mtime")
    assert "by the file's modification time" in markdown.to_markdown(res)


def test_a_git_commit_time_dates_a_students_repository_when_the_policy_accepts_it(tmp_path):
    subs = plain_folder(tmp_path, "2026-02-01T12:00:00-08:00")  # the file's own time says on time
    env = {
        **os.environ,
        "GIT_COMMITTER_DATE": "2026-03-02T12:00:00-08:00",
        "GIT_AUTHOR_DATE": "2026-03-02T12:00:00-08:00",
    }
    for cmd in (
        ["init", "-q"],
        ["add", "lab-3.ipynb"],
        ["-c", "user.name=Bob", "-c", "user.email=bob@u.edu", "commit", "-q", "-m", "lab 3"],
    ):
        subprocess.run(["git", "-C", str(subs / "bob"), *cmd], env=env, check=True, capture_output=True)
    bob = lab3(graded(subs, tmp_path, late={"accept": ["git", "mtime"]}, people=None), "bob")
    assert (bob["points"], bob["late_days"], bob["time_source"]) == (4.5, 1, "git")


def test_the_collection_time_is_recorded_but_never_charged(tmp_path):
    res = graded(plain_folder(tmp_path, "2026-02-01T12:00:00-08:00"), tmp_path, people=None)
    kept = list(tmp_path.rglob("history.json"))
    assert kept and json.loads(kept[0].read_text())[0]["collected_at"] > "2026-03"  # in OUT/history
    assert "collected" not in res["students"]["bob"]["submissions"]["3"]["times"]  # not in the results
    assert lab3(res, "bob").get("late_days") is None
    with pytest.raises(
        policy.PolicyError, match="accept names 'collected', which a late penalty can never count"
    ):
        policy.parse('[late]\naccept = ["collected"]\n', "tests/policy.toml", known_labs=[3])
    with pytest.raises(policy.PolicyError, match="unknown time source 'email'"):
        policy.parse('[late]\naccept = ["email"]\n', "tests/policy.toml", known_labs=[3])


def test_grades_csv_names_each_labs_time_source(tmp_path):
    table = list(csv.DictReader(io.StringIO(scoreboard.grades_csv(graded(canvas_zip(tmp_path), tmp_path)))))
    assert {(r["student"], r["lab"], r["time_source"]) for r in table if r["lab"] == "3"} == {
        ("alice", "3", "canvas"),
        ("bob", "3", "canvas"),
    }


@pytest.mark.parametrize(
    "text, says",
    [
        ("student,lab,days\nbob,3,nan\n", "days must be a finite number"),
        ("student,lab,days\nbob,3,5000\n", "days must be at most 365"),
        ("student,lab,days\nbob,3,2\nbob,3,4\n", "line 3: extends lab 3 for bob again (line 2)"),
        ("student,lab,days\nbob,3\n", "line 2: 2 fields where the header has 3"),
        ("student,lab,days,why\nbob,3,2,ill\n", "line 1: unknown column why"),
    ],
)
def test_an_extension_out_of_range_twice_or_short_of_a_field_is_refused(text, says):
    with pytest.raises(deadlines.DeadlineError) as e:
        deadlines.parse_extensions(text, "ext.csv", {"bob"}, {3})
    assert says in str(e.value) and "field " in str(e.value)
