"""LMS files: gradebook exports from graded results, and Canvas and Gradescope downloads read into the class.

Results are written by hand (scoreboard.json-shaped) and downloads are made here as small zips
and folders, so nothing is graded: the file runs in seconds.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from labkit.grading.intake import lms
from labkit.grading.publish import gradebook, scoreboard
from labkit.grading.state import policy, roster

ROOT = Path(__file__).resolve().parents[2]
NB = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
ROSTER = roster.parse(
    "student,name,email,lms_id,section\n"
    "alice,Alice Liddell,alice@u.edu,4411,A\n"
    "bob,Bob Marley,bob@u.edu,4412,B\n"
    "=cmd,Mallory,m@u.edu,4413,A\n"
    "dana,Dana Scully,dana@u.edu,4414,B\n",
    "roster.csv",
)


def t(name, status, points=1):
    return {
        "test": f"test_{name}",
        "exercise": "f",
        "file": "t.py",
        "hidden": False,
        "status": status,
        "message": "",
        "points": points,
    }


def row(student, config, tests, status="ok"):
    return {
        "student": student,
        "lab": 3,
        "config": config,
        "status": status,
        "passed": sum(x["status"] == "passed" for x in tests),
        "total": len(tests),
        "message": "",
        "tests": tests,
        "cell_errors": [],
        "notes": [],
    }


def results() -> dict:
    ref = [
        row("reference", c, [t("doubles", "passed", 2), t("split", "passed", 3)]) for c in ("cpu-1", "cpu-8")
    ]
    rows = [row("alice", c, [t("doubles", "passed", 2), t("split", "passed", 3)]) for c in ("cpu-1", "cpu-8")]
    rows += [
        row("bob", "cpu-1", [t("doubles", "passed", 2), t("split", "passed", 3)]),
        row("bob", "cpu-8", [t("doubles", "passed", 2), t("split", "failed", 3)], "failed"),
    ]
    rows += [row("dana", c, [], "missing") for c in ("cpu-1", "cpu-8")]
    rows += [
        row("=cmd", c, [t("doubles", "passed", 2), t("split", "failed", 3)], "failed")
        for c in ("cpu-1", "cpu-8")
    ]
    return {
        "format": 1,
        "labs": [
            {
                "number": 3,
                "name": "lab-3",
                "title": "Lab 3 · shard_map basics",
                "tests": policy.lab_tests(ref)[3],
                "max_points": 5,
            }
        ],
        "configs": [
            {"name": "cpu-1", "summary": "", "devices": 1},
            {"name": "cpu-8", "summary": "", "devices": 8},
        ],
        "students": {s: {"notes": [], **ROSTER.students[s]} for s in sorted(ROSTER.students)},
        "notes": [],
        "rows": rows,
        "policy": policy.Policy().to_json(),
    }


# ----------------------------------------------------------------------------------------
# Export.
# ----------------------------------------------------------------------------------------


def test_the_canvas_export_has_canvas_columns_a_points_possible_row_and_one_row_per_student():
    table = list(csv.reader(io.StringIO(gradebook.export(results(), "canvas"))))
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 3 · shard_map basics"]
    assert table[1][0].strip() == "Points Possible" and table[1][5] == "5"
    assert ["Alice Liddell", "4411", "alice", "alice@u.edu", "A", "5"] in table
    assert ["Bob Marley", "4412", "bob", "bob@u.edu", "B", "2"] in table
    assert len(table) == 2 + 4


def test_a_canvas_assignment_id_in_the_policy_heads_its_column_as_canvas_matches_it():
    res = results() | {"policy": policy.Policy(canvas={3: 123456}).to_json()}
    header = next(csv.reader(io.StringIO(gradebook.export(res, "canvas"))))
    assert header[5] == "Lab 3 · shard_map basics (123456)"
    with pytest.raises(policy.PolicyError, match="canvas_id must be the assignment's number"):
        policy.parse('[labs.3]\ncanvas_id = "abc"\n', "tests/policy.toml", known_labs=[3])


def test_work_not_handed_in_is_left_blank_for_canvas_so_a_grade_entered_there_is_kept():
    table = list(csv.reader(io.StringIO(gradebook.export(results(), "canvas"))))
    assert ["Dana Scully", "4414", "dana", "dana@u.edu", "B", ""] in table
    wide = {r["student"]: r for r in csv.DictReader(io.StringIO(gradebook.export(results(), "wide")))}
    assert (wide["dana"]["lab-3"], wide["dana"]["lab-3 status"]) == ("0", "missing")


def test_work_not_handed_in_is_marked_excused_when_the_ta_asks(tmp_path):
    table = list(csv.reader(io.StringIO(gradebook.export(results(), "canvas", missing="excused"))))
    assert ["Dana Scully", "4414", "dana", "dana@u.edu", "B", "EX"] in table
    assert ["Alice Liddell", "4411", "alice", "alice@u.edu", "A", "5"] in table
    graded = tmp_path / "graded"
    graded.mkdir()
    (graded / "scoreboard.json").write_text(json.dumps(results()))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "scoreboard",
            "export",
            "--format",
            "canvas",
            "--missing",
            "excused",
            "--out",
            str(tmp_path / "c.csv"),
            str(graded),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "dana@u.edu,B,EX" in (tmp_path / "c.csv").read_text()


def test_a_lab_a_ta_gave_points_is_exported_with_them_even_when_not_handed_in():
    res = results() | {"overrides": [{"student": "dana", "lab": 3, "points": 4, "comment": "emailed it"}]}
    table = list(csv.reader(io.StringIO(gradebook.export(res, "canvas"))))
    assert ["Dana Scully", "4414", "dana", "dana@u.edu", "B", "4"] in table


def test_the_canvas_export_keeps_the_policys_weights_as_grades_csv_does():
    res = results() | {"policy": policy.Policy(weights={3: 2}).to_json()}
    table = list(csv.reader(io.StringIO(gradebook.export(res, "canvas"))))
    assert table[1][5] == "10"
    assert ["Bob Marley", "4412", "bob", "bob@u.edu", "B", "4"] in table
    totals = {
        r["student"]: r
        for r in csv.DictReader(io.StringIO(scoreboard.grades_csv(res)))
        if r["lab"] == "total"
    }
    assert (totals["bob"]["points"], totals["bob"]["max_points"]) == ("4", "10")


# A gradebook as Canvas exports it (Grades > Export): sortable names, a Manual Posting row, the
# Points Possible row, read-only score columns, and the test student of Canvas's student view.
CANVAS_GRADEBOOK = (
    "Student,ID,SIS User ID,SIS Login ID,Section,Lab 3 · shard_map basics (123456),Current Score,Final Score\n"
    ",,,,,Manual Posting,,\n"
    "    Points Possible,,,,,10.00,(read only),(read only)\n"
    '"Liddell, Alice",4411,alice,alice@u.edu,A,,0.00,0.00\n'
    '"Marley, Bob",4412,bob,bob@u.edu,B,7.00,70.00,70.00\n'
    '"Scully, Dana",4414,dana,dana@u.edu,B,8.00,80.00,80.00\n'
    '"Student, Test",4499,,8f14e45fceea167a5a36dedd4bea2543,,,,\n'
)


def test_a_canvas_gradebook_round_trips_through_roster_grades_and_export_with_weights():
    people = roster.parse(CANVAS_GRADEBOOK, "gradebook.csv")
    res = results() | {
        "policy": policy.Policy(weights={3: 2}, canvas={3: 123456}).to_json(),
        "students": {s: {"notes": [], **info} for s, info in people.students.items()},
        "rows": [r for r in results()["rows"] if r["student"] in people.students],
    }
    exported = gradebook.export(res, "canvas")
    sent = list(csv.reader(io.StringIO(exported)))
    original = list(csv.reader(io.StringIO(CANVAS_GRADEBOOK)))
    assert sent[0][:6] == original[0][:6]  # the same columns: Canvas updates assignment 123456
    assert sent[1][5] == "10" and float(original[2][5]) == 10
    by_id = {line[1]: line for line in sent[2:]}
    assert {i: (line[2], line[5]) for i, line in by_id.items()} == {
        "4411": ("alice", "10"),
        "4412": ("bob", "4"),
        "4414": ("dana", ""),
    }  # dana's 8.00 in Canvas is kept
    totals = {
        r["student"]: r["points"]
        for r in csv.DictReader(io.StringIO(scoreboard.grades_csv(res)))
        if r["lab"] == "total"
    }
    assert totals["alice"] == by_id["4411"][5] and totals["bob"] == by_id["4412"][5]
    assert (
        roster.parse(exported, "canvas.csv").students == people.students
    )  # the export reads back as the class


def test_the_wide_export_has_points_possible_points_total_and_the_rule():
    wide = {r["student"]: r for r in csv.DictReader(io.StringIO(gradebook.export(results(), "wide")))}
    assert (
        wide["bob"]["lab-3"],
        wide["bob"]["lab-3 max"],
        wide["bob"]["total"],
        wide["bob"]["total max"],
    ) == ("2", "5", "2", "5")
    assert "every configuration graded" in wide["bob"]["rule"]


def test_an_export_never_hands_a_spreadsheet_a_formula():
    for fmt in ("canvas", "wide"):
        text = gradebook.export(results(), fmt)
        assert "'=cmd" in text and ",=cmd" not in text and not text.startswith("=")


def test_provisional_grades_are_not_exported():
    res = results() | {
        "provisional": "provisional: tests/policy.toml requires cpu-8, which --configs left out"
    }
    with pytest.raises(lms.LmsError, match="requires cpu-8"):
        gradebook.export(res, "canvas")


def test_scoreboard_export_writes_the_file_from_a_graded_folder_without_grading(tmp_path):
    graded = tmp_path / "graded"
    graded.mkdir()
    (graded / "scoreboard.json").write_text(json.dumps(results()))
    out = tmp_path / "canvas.csv"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "scoreboard",
            "export",
            "--format",
            "canvas",
            "--out",
            str(out),
            str(graded),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == gradebook.export(results(), "canvas")
    assert sorted(p.name for p in graded.iterdir()) == ["scoreboard.json"]


def test_scoreboard_export_of_a_folder_that_was_never_graded_exits_2(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "scoreboard",
            "export",
            "--format",
            "wide",
            "--out",
            str(tmp_path / "x.csv"),
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "scoreboard.json does not exist" in done.stderr
    assert not (tmp_path / "x.csv").exists()


# ----------------------------------------------------------------------------------------
# Import: Canvas.
# ----------------------------------------------------------------------------------------


def make_zip(path: Path, files: dict[str, str | bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def nb(tag: str) -> str:
    return json.dumps({"cells": [], "metadata": {"tag": tag}, "nbformat": 4, "nbformat_minor": 5})


def tag_of(path: Path) -> str:
    return json.loads(path.read_text())["metadata"]["tag"]


CANVAS = {
    "liddellalice_4411_90001_lab-3.ipynb": nb("alice first"),
    "liddellalice_4411_90001_lab-3-1.ipynb": nb("alice resubmitted"),
    "marleybob_LATE_4412_90002_Lab_3.ipynb": nb("bob"),
    "scullydana_4414_90003_lab-5.ipynb": nb("dana lab 5"),
    "strangerx_9999_90004_lab-3.ipynb": nb("not on the roster"),
    "liddellalice_4411_90005_notes.txt": "my notes",
    "my-homework.ipynb": nb("no pattern"),
}


def test_a_canvas_download_is_read_into_the_kits_layout_through_the_roster(tmp_path):
    found = lms.collect(make_zip(tmp_path / "canvas.zip", CANVAS), ROSTER, tmp_path / "into", [3, 5])
    assert found.layout == "canvas"
    assert sorted(
        p.relative_to(tmp_path / "into").as_posix() for p in (tmp_path / "into").rglob("*.ipynb")
    ) == ["alice/lab-3.ipynb", "bob/lab-3.ipynb", "dana/lab-5.ipynb"]


def test_the_latest_canvas_resubmission_is_the_one_graded(tmp_path):
    lms.collect(make_zip(tmp_path / "canvas.zip", CANVAS), ROSTER, tmp_path / "into", [3, 5])
    assert tag_of(tmp_path / "into" / "alice" / "lab-3.ipynb") == "alice resubmitted"


def test_canvas_late_marks_are_kept(tmp_path):
    found = lms.collect(make_zip(tmp_path / "canvas.zip", CANVAS), ROSTER, tmp_path / "into", [3, 5])
    assert found.files["bob", 3]["late"] and not found.files["alice", 3]["late"]


def test_every_file_not_graded_is_listed_with_its_reason(tmp_path):
    found = lms.collect(make_zip(tmp_path / "canvas.zip", CANVAS), ROSTER, tmp_path / "into", [3, 5])
    reasons = dict(found.unmatched)
    assert "Canvas user id 9999 is on no roster line" in reasons["strangerx_9999_90004_lab-3.ipynb"]
    assert "matches no pattern" in reasons["my-homework.ipynb"]
    assert "not a notebook" in reasons["liddellalice_4411_90005_notes.txt"]
    assert "later resubmission" in reasons["liddellalice_4411_90001_lab-3.ipynb"]
    assert len(found.unmatched) == 4


def test_a_canvas_folder_is_read_like_its_zip(tmp_path):
    folder = tmp_path / "download"
    folder.mkdir()
    for name, data in CANVAS.items():
        (folder / name).write_text(data)
    assert lms.is_download(folder)
    found = lms.collect(folder, ROSTER, tmp_path / "into", [3, 5])
    assert sorted(found.files) == [("alice", 3), ("bob", 3), ("dana", 5)]


def test_a_download_without_a_roster_is_refused():
    with pytest.raises(lms.LmsError, match="add --roster FILE"):
        lms.collect(Path("x.zip"), None, Path("into"), [3])


def test_the_kits_own_folder_layout_is_not_a_download(tmp_path):
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "lab-3.ipynb").write_text(NB)
    assert not lms.is_download(tmp_path)


# ----------------------------------------------------------------------------------------
# Import: Gradescope.
# ----------------------------------------------------------------------------------------

GRADESCOPE_META = """\
submission_111:
  :submitters:
  - :name: Alice Liddell
    :sid: '4411'
    :email: alice@u.edu
  :created_at: 2026-03-01 10:00:00.000000000 -08:00
  :score: 0.0
submission_222:
  :submitters:
  - :name: Bob Marley
    :sid: ''
    :email: BOB@u.edu
  :created_at: 2026-03-02 09:30:00.000000000 -08:00
submission_333:
  :submitters:
  - :name: Zed
    :sid: '7777'
    :email: zed@u.edu
  :created_at: 2026-03-02 09:30:00.000000000 -08:00
"""


def test_a_gradescope_export_is_matched_by_sid_or_email_with_its_submission_time(tmp_path):
    z = make_zip(
        tmp_path / "gs.zip",
        {
            "assignment_42_export/submission_metadata.yml": GRADESCOPE_META,
            "assignment_42_export/submission_111/lab-3.ipynb": nb("alice"),
            "assignment_42_export/submission_222/lab-3.ipynb": nb("bob"),
            "assignment_42_export/submission_333/lab-3.ipynb": nb("zed"),
            "assignment_42_export/stray.ipynb": nb("stray"),
        },
    )
    found = lms.collect(z, ROSTER, tmp_path / "into", [3])
    assert found.layout == "gradescope"
    assert sorted(found.files) == [("alice", 3), ("bob", 3)]
    assert found.files["alice", 3]["submitted_at"].startswith("2026-03-01 10:00:00")
    reasons = dict(found.unmatched)
    assert "sid 7777" in reasons["assignment_42_export/submission_333/lab-3.ipynb"]
    assert "no submission_<id> folder" in reasons["assignment_42_export/stray.ipynb"]
    assert tag_of(tmp_path / "into" / "bob" / "lab-3.ipynb") == "bob"


TWO_VERSIONS_META = """\
submission_501:
  :submitters:
  - :sid: '4411'
  :created_at: 2026-03-04 09:00:00.000000000 -08:00
submission_502:
  :submitters:
  - :email: Alice@u.edu
  :created_at: 2026-03-05 09:00:00.000000000 -08:00
submission_503:
  :created_at: 2026-03-05 10:00:00.000000000 -08:00
"""


def test_of_two_gradescope_submissions_of_a_student_the_later_is_kept_and_the_earlier_named(tmp_path):
    z = make_zip(
        tmp_path / "gs.zip",
        {
            "submission_metadata.yml": TWO_VERSIONS_META,
            "submission_502/lab-3.ipynb": nb("later"),
            "submission_501/lab-3.ipynb": nb("earlier"),
            "submission_503/lab-3.ipynb": nb("nobody's"),
        },
    )
    found = lms.collect(z, ROSTER, tmp_path / "into", [3])
    assert sorted(found.files) == [("alice", 3)]
    assert found.files["alice", 3]["member"] == "submission_502/lab-3.ipynb"
    assert tag_of(tmp_path / "into" / "alice" / "lab-3.ipynb") == "later"
    reasons = dict(found.unmatched)
    assert reasons["submission_501/lab-3.ipynb"] == (
        "an earlier version for alice: submission_502/lab-3.ipynb is later"
    )
    assert reasons["submission_503/lab-3.ipynb"] == "no submitter in submission_metadata.yml"


GROUP_META = """\
submission_444:
  :submitters:
  - :name: Alice Liddell
    :sid: '4411'
    :email: alice@u.edu
  - :name: Dana Scully
    :sid: ''
    :email: dana@u.edu
  - :name: Zed
    :sid: '7777'
    :email: zed@u.edu
  :created_at: 2026-03-03 11:00:00.000000000 -08:00
"""


def test_a_gradescope_group_submission_credits_every_member_with_a_note(tmp_path):
    z = make_zip(
        tmp_path / "gs.zip",
        {"submission_metadata.yml": GROUP_META, "submission_444/lab-3.ipynb": nb("alice and dana")},
    )
    found = lms.collect(z, ROSTER, tmp_path / "into", [3])
    assert sorted(found.files) == [("alice", 3), ("dana", 3)]
    for student in ("alice", "dana"):
        assert tag_of(tmp_path / "into" / student / "lab-3.ipynb") == "alice and dana"
        assert found.files[student, 3]["submitted_at"].startswith("2026-03-03 11:00:00")
    assert found.files["dana", 3]["group"] == ["alice", "dana"]
    assert any("group" in n and "alice" in n for n in found.files["dana", 3]["notes"])
    assert any("group" in n and "dana" in n for n in found.files["alice", 3]["notes"])
    reasons = dict(found.unmatched)
    assert (
        "sid 7777" in reasons["submission_444/lab-3.ipynb"]
        and "not credited" in reasons["submission_444/lab-3.ipynb"]
    )


# ----------------------------------------------------------------------------------------
# Zips that would write outside their folder, or unpack to far more than they hold.
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../escape_4411_1_lab-3.ipynb", "/abs_4411_1_lab-3.ipynb", "sub/../../x_4411_1_lab-3.ipynb"]
)
def test_a_zip_with_a_path_leaving_its_folder_is_refused_whole(tmp_path, name):
    z = make_zip(tmp_path / "evil.zip", {"liddellalice_4411_90001_lab-3.ipynb": NB, name: NB})
    with pytest.raises(lms.LmsError, match="path traversal") as e:
        lms.collect(z, ROSTER, tmp_path / "out" / "into", [3])
    assert "evil.zip" in str(e.value)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.zip"]


def test_a_zip_with_a_symbolic_link_is_refused(tmp_path):
    info = zipfile.ZipInfo("liddellalice_4411_90001_lab-3.ipynb")
    info.external_attr = 0o120777 << 16
    with zipfile.ZipFile(tmp_path / "link.zip", "w") as z:
        z.writestr(info, "/etc/passwd")
    with pytest.raises(lms.LmsError, match="symbolic link"):
        lms.collect(tmp_path / "link.zip", ROSTER, tmp_path / "into", [3])


def test_a_zip_bomb_is_refused_before_anything_is_unpacked(tmp_path):
    bomb = tmp_path / "bomb.zip"
    with (
        zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z,
        z.open("liddellalice_4411_90001_lab-3.ipynb", "w", force_zip64=True) as f,
    ):
        for _ in range(50):
            f.write(b"\0" * (1 << 20))
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(lms.LmsError, match="zip bomb"):
        lms.collect(bomb, ROSTER, tmp_path / "into", [3])
    assert not (tmp_path / "into").exists()


def test_a_file_that_is_not_a_zip_nor_a_folder_is_named(tmp_path):
    (tmp_path / "x.zip").write_text("not a zip")
    with pytest.raises(lms.LmsError, match="x.zip: not a zip file"):
        lms.collect(tmp_path / "x.zip", ROSTER, tmp_path / "into", [3])


def test_nothing_is_written_outside_the_folder_given(tmp_path):
    z = make_zip(tmp_path / "canvas.zip", CANVAS)
    before = set(os.listdir(tmp_path))
    lms.collect(z, ROSTER, tmp_path / "into", [3, 5])
    assert set(os.listdir(tmp_path)) - before == {"into"}


# ----------------------------------------------------------------------------------------
# Student work never committed by accident.
# ----------------------------------------------------------------------------------------


def _default_folders() -> set[str]:
    """The folders the kit reads student work from or writes grades to when no option names one."""
    import re

    from labkit import cli
    from labkit.grading.state import term

    found = {str(term.DEFAULT_SUBMISSIONS)}  # where a term with no source kept reads from
    for action in cli.parser()._subparsers._group_actions[0].choices["grade"]._actions:
        if action.dest in ("submissions", "out") and action.default is not None:
            found.add(str(action.default))
    makefile = (ROOT / "Makefile").read_text()
    found |= set(re.findall(r"^(?:SUBMISSIONS|GRADES) \?= (\S+)$", makefile, re.MULTILINE))
    return found


def test_the_default_folders_of_student_work_and_grades_are_ignored_by_git():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    folders = _default_folders()
    assert {"submissions", "scoreboard", "grades"} <= folders, folders
    for folder in sorted(folders):
        for inside in (
            f"{folder}/alice/lab-3.ipynb",
            f"{folder}/grades.csv",
            f"{folder}/collected/a/lab-1.ipynb",
        ):
            done = subprocess.run(["git", "check-ignore", "-q", "--no-index", inside], cwd=ROOT, check=False)
            assert done.returncode == 0, (
                f"{inside} is not in .gitignore: a `git add .` would commit student work"
            )


def test_a_group_members_note_reaches_the_class_read_for_grading(tmp_path):
    from labkit.grading.intake import handin

    z = make_zip(
        tmp_path / "gs.zip",
        {"submission_metadata.yml": GROUP_META, "submission_444/lab-3.ipynb": nb("alice and dana")},
    )
    subs, times = handin.submissions_of(z, tmp_path / "out", ROSTER, io.StringIO())
    assert subs.students["dana"][3].read_text() == subs.students["alice"][3].read_text()
    assert any(
        n.startswith("lab-3: handed in on Gradescope as a group with alice") for n in subs.notes["dana"]
    )
    assert times["dana", 3]["times"] == times["alice", 3]["times"] and times["dana", 3]["times"]["gradescope"]


# ----------------------------------------------------------------------------------------
# Canvas's real submission times (its API), not a flat day for _LATE.
# ----------------------------------------------------------------------------------------


def test_a_canvas_time_counts_the_days_late_where_the_flag_alone_counts_one():
    from labkit.grading.state import deadlines

    late = {"per_day": 0.1, "cap": 0.5, "accept": ["gradescope", "canvas"]}
    due = "2026-03-01T23:59:00-08:00"
    timed = deadlines.charge({"times": {"canvas": "2026-03-04T10:00:00Z"}, "late": True}, due, late)
    assert (timed["late_days"], timed["late_penalty"], timed["time_source"]) == (3, 0.3, "canvas"), timed
    on_time = deadlines.charge({"times": {"canvas": "2026-03-01T20:00:00-08:00"}, "late": False}, due, late)
    assert "late_days" not in on_time
    extended = deadlines.charge({"times": {"canvas": "2026-03-04T10:00:00Z"}, "late": True}, due, late, 5)
    assert "late_days" not in extended, extended
    flag = deadlines.charge({"times": {"canvas": None}, "late": True}, due, late)
    assert flag["late_days"] == 1 and "labkit canvas collect" in flag["late_note"]


def test_a_folder_canvas_collect_wrote_is_read_with_each_notebooks_canvas_time(tmp_path):
    folder = tmp_path / "canvas"
    for student in ("alice", "bob"):
        (folder / student).mkdir(parents=True)
        (folder / student / "lab-3.ipynb").write_text(nb(student))
    (folder / "bob" / "lab-5.ipynb").write_text(nb("bob 5"))
    (folder / "canvas_submissions.json").write_text(
        json.dumps(
            {
                "format": 1,
                "source": "canvas-api",
                "submissions": {
                    "alice/lab-3.ipynb": {
                        "user_id": "4411",
                        "submitted_at": "2026-03-04T10:00:00Z",
                        "late": True,
                    },
                    "bob/lab-3.ipynb": {
                        "user_id": "4411",
                        "submitted_at": "2026-03-01T10:00:00Z",
                        "late": False,
                    },
                },
            }
        )
    )
    assert lms.is_download(folder)
    found = lms.collect(folder, ROSTER, tmp_path / "into", [3, 5])
    assert found.layout == "canvas-api" and sorted(found.files) == [("alice", 3)]
    assert found.files["alice", 3]["times"] == {"canvas": "2026-03-04T10:00:00Z"}
    reasons = dict(found.unmatched)
    assert "is not bob on the roster" in reasons["bob/lab-3.ipynb"]
    assert "not collected from Canvas" in reasons["bob/lab-5.ipynb"]


# ----------------------------------------------------------------------------------------
# Downloads add up: what one download does not hold is kept from the earlier ones.
# ----------------------------------------------------------------------------------------


def gradescope_zip(path: Path, lab: int, versions: dict[str, tuple[str, str]]) -> Path:
    """A Gradescope export of one lab: sid -> (the notebook's tag, :created_at:)."""
    meta = "".join(
        f"submission_{i}:\n  :submitters:\n  - :sid: '{sid}'\n  :created_at: {when}\n"
        for i, (sid, (_, when)) in enumerate(versions.items(), 100)
    )
    files = {f"submission_{i}/lab-{lab}.ipynb": nb(tag) for i, (tag, _) in enumerate(versions.values(), 100)}
    return make_zip(path, {"submission_metadata.yml": meta, **files})


def test_a_download_of_another_lab_keeps_what_earlier_downloads_collected(tmp_path):
    """Week 2's lab 5 download left lab 3 `missing` for everyone and the late mark gone (issue 58)."""
    from labkit.grading.intake import handin

    out = tmp_path / "out"
    week1 = make_zip(tmp_path / "canvas-lab3.zip", {k: v for k, v in CANVAS.items() if "lab-5" not in k})
    handin.submissions_of(week1, out, ROSTER, io.StringIO())
    week2 = make_zip(tmp_path / "canvas-lab5.zip", {"scullydana_4414_90009_lab-5.ipynb": nb("dana lab 5")})
    said = io.StringIO()
    subs, times = handin.submissions_of(week2, out, ROSTER, said)
    assert (
        tag_of(subs.students["alice"][3]) == "alice resubmitted" and tag_of(subs.students["bob"][3]) == "bob"
    )
    assert tag_of(subs.students["dana"][5]) == "dana lab 5"
    assert times["bob", 3]["late"] and any("marked it late" in n for n in subs.notes["bob"])
    assert "replaced" not in said.getvalue()


def test_a_newer_version_replaces_the_kept_one_an_older_one_does_not_and_both_are_named(tmp_path):
    from labkit.grading.intake import handin

    out, early, late = tmp_path / "out", "2026-03-01 10:00:00-08:00", "2026-03-03 10:00:00-08:00"
    first = gradescope_zip(tmp_path / "gs1.zip", 3, {"4411": ("alice v1", early), "4412": ("bob v2", late)})
    handin.submissions_of(first, out, ROSTER, io.StringIO())
    said = io.StringIO()
    second = gradescope_zip(tmp_path / "gs2.zip", 3, {"4411": ("alice v2", late), "4412": ("bob v1", early)})
    subs, times = handin.submissions_of(second, out, ROSTER, said)
    assert tag_of(subs.students["alice"][3]) == "alice v2" and times["alice", 3]["submitted_at"] == late
    assert tag_of(subs.students["bob"][3]) == "bob v2" and times["bob", 3]["submitted_at"] == late
    lines = said.getvalue().splitlines()
    (alice,) = [line for line in lines if line.startswith("alice lab-3: replaced")]
    assert early in alice and late in alice and "gs1.zip" in alice and "gs2.zip" in alice
    (bob,) = [line for line in lines if line.startswith("bob lab-3: kept")]
    assert early in bob and late in bob
    kept = json.loads((out / "collected.json").read_text())
    (entry,) = [e for e in kept if e["student"] == "alice"]
    assert entry["replaced"][0]["submitted_at"] == early and entry["submitted_at"] == late


def test_the_bare_command_grades_every_kept_download_and_reads_again_only_one_that_changed(tmp_path):
    """With an LMS class the bare `make grade` exited 2 (no submissions/): the downloads are the term's now."""
    from labkit.grading.intake import handin
    from labkit.grading.state import term

    def the_term(submissions=None):
        return term.resolve(
            tmp_path / "out" / "course",
            submissions=submissions,
            labs=None,
            configs=None,
            forget=[],
            all_labs=[3, 5],
            default_configs=["cpu-1"],
            is_download=lms.is_download,
        )

    out = tmp_path / "out"
    week1 = make_zip(tmp_path / "canvas-lab3.zip", {"liddellalice_4411_90001_lab-3.ipynb": nb("alice first")})
    week2 = make_zip(
        tmp_path / "canvas-lab5.zip",
        {
            "liddellalice_4411_90007_lab-3.ipynb": nb(
                "alice resubmitted"
            ),  # no time: the later download wins
            "scullydana_4414_90009_lab-5.ipynb": nb("dana lab 5"),
            "my-homework.ipynb": nb("no pattern"),
        },
    )
    for given in (week1, week2):
        kept = the_term(given)
        handin.of_term(kept, out, ROSTER, io.StringIO())
        kept.save()
    said = io.StringIO()
    bare = the_term()
    subs, _ = handin.of_term(bare, out, ROSTER, said)
    assert [Path(s["path"]).name for s in bare.sources] == ["canvas-lab3.zip", "canvas-lab5.zip"]
    assert tag_of(subs.students["alice"][3]) == "alice resubmitted"  # week 1 not read over it again
    assert tag_of(subs.students["dana"][5]) == "dana lab 5" and said.getvalue() == ""
    assert any("my-homework.ipynb" in n for n in subs.class_notes)  # what each download said, every run
    week1.unlink()
    subs, _ = handin.of_term(the_term(), out, ROSTER, io.StringIO())
    assert tag_of(subs.students["alice"][3]) == "alice resubmitted"
    assert any("canvas-lab3.zip: the download is no longer there" in n for n in subs.class_notes)
