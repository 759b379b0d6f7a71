"""The roster: the class list a grade is given for, and every way a roster file can be wrong."""

from __future__ import annotations

import pytest

from labkit.grading.state import roster

GOOD = "student,name,email,lms_id,section\nalice,Alice L,alice@u.edu,4411,A\nbob,Bob M,bob@u.edu,4412,B\n"


def test_a_roster_lists_each_student_with_the_optional_columns():
    r = roster.parse(GOOD, "roster.csv")
    assert r.ids() == ["alice", "bob"]
    assert r.students["alice"] == {
        "name": "Alice L",
        "email": "alice@u.edu",
        "lms_id": "4411",
        "section": "A",
    }
    assert r.by("lms_id") == {"4411": "alice", "4412": "bob"}


def test_only_the_student_column_is_required_in_any_order_and_case():
    r = roster.parse("Section,Student\nA,alice\n", "roster.csv")
    assert r.students["alice"] == {"name": "", "email": "", "lms_id": "", "section": "A"}


def test_a_spreadsheets_byte_order_mark_is_not_part_of_the_first_column():
    assert roster.parse("\ufeffstudent\nalice\n").ids() == ["alice"]


@pytest.mark.parametrize(
    "text, says",
    [
        ("name,email\nAlice,a@u.edu\n", "roster.csv, line 1: the header has no `student` column"),
        ("student\nalice\nbob\nalice\n", "roster.csv, line 4: the student id 'alice' is already on line 2"),
        ("student,lms_id\nalice,1\nbob,1\n", "roster.csv, line 3: lms_id '1' is already on line 2"),
        ("student,name\nalice\n", "roster.csv, line 2: 1 fields where the header has 2"),
        ("student,name\n,Nobody\n", "roster.csv, line 2: the student id is empty"),
        ("student\n../etc\n", "roster.csv, line 2: '../etc' cannot be a student id"),
        ("student,student\nalice,bob\n", "roster.csv, line 1: the column student appears twice"),
        ("", "roster.csv: empty"),
        ("student\n", "roster.csv: no students"),
    ],
)
def test_a_bad_roster_is_refused_naming_the_line(text, says):
    with pytest.raises(roster.RosterError) as e:
        roster.parse(text, "roster.csv")
    assert says in str(e.value)


def test_a_roster_file_that_is_not_there_is_named(tmp_path):
    with pytest.raises(roster.RosterError, match="nowhere.csv: cannot be read"):
        roster.load(tmp_path / "nowhere.csv")


CANVAS_GRADEBOOK = (
    "Student,ID,SIS User ID,SIS Login ID,Section,Lab 3 (123456),Lab 3 (123457),Current Score\n"
    "    Points Possible,,,,,10.00,10.00,(read only)\n"
    '"Liddell, Alice",4411,alice,alice@u.edu,A,9.00,,90.00\n'
    '"Marley, Bob",4412,,bmarley,B,,,\n'
    '"Student, Test",4499,,8f14e45fceea167a5a36dedd4bea2543,,,,\n'
)


def test_a_canvas_gradebook_export_is_read_as_one_without_points_possible_or_the_test_student():
    r = roster.parse(CANVAS_GRADEBOOK, "gradebook.csv")
    assert r.ids() == ["alice", "bmarley"]
    assert r.students["alice"] == {
        "name": "Liddell, Alice",
        "email": "alice@u.edu",
        "lms_id": "4411",
        "section": "A",
    }
    assert r.students["bmarley"] == {"name": "Marley, Bob", "email": "", "lms_id": "4412", "section": "B"}


def test_a_canvas_gradebook_line_with_no_sis_id_is_refused_with_the_reason():
    text = CANVAS_GRADEBOOK.replace('"Marley, Bob",4412,,bmarley', '"Marley, Bob",4412,,')
    with pytest.raises(
        roster.RosterError,
        match="gradebook.csv, line 4: Canvas gives Marley, Bob \\(ID 4412\\) "
        "neither a SIS User ID nor a SIS Login ID",
    ):
        roster.parse(text, "gradebook.csv")


# ----------------------------------------------------------------------------------------
# Groups: a `group` column for courses that collect group work outside Gradescope.
# ----------------------------------------------------------------------------------------

GROUPS = (
    "student,name,group\nalice,Alice,team-1\nbob,Bob,team-1\ncarol,Carol,team-2\ndan,Dan,team-2\n"
    "erin,Erin,team-2\nfay,Fay,\n"
)


def test_a_group_column_gives_each_group_its_members():
    people = roster.parse(GROUPS)
    assert people.groups() == {"team-1": ["alice", "bob"], "team-2": ["carol", "dan", "erin"]}
    assert people.students["alice"]["group"] == "team-1" and "group" not in people.students["fay"]


def test_a_groups_one_submission_is_credited_to_every_member_with_a_note(tmp_path):
    people = roster.parse(GROUPS)
    nb = tmp_path / "alice-lab-3.ipynb"
    nb.write_text("{}")
    students = {
        "alice": {3: nb},
        "bob": {},
        "carol": {3: tmp_path / "c"},
        "dan": {3: tmp_path / "d"},
        "erin": {},
        "fay": {},
    }
    notes = {s: [] for s in students}
    notes["bob"] = ["no submission: nothing was handed in for this student"]
    times = {("alice", 3): {"times": {"gradescope": "2026-03-01T10:00:00Z"}}}
    roster.credit_groups(people, students, notes, times)
    assert students["bob"][3] == nb and times["bob", 3] == times["alice", 3]
    assert notes["bob"] == ["lab-3: credited with the submission of alice, in group team-1 on the roster"]
    assert "erin" not in [s for s, labs in students.items() if 3 in labs] and 3 not in students["erin"]
    assert any("carol and dan both handed in lab-3" in n for n in notes["erin"]), notes["erin"]
    assert students["fay"] == {}


def test_ids_are_compared_in_nfc_so_one_name_typed_two_ways_is_one_student():
    nfc, nfd = "jos\u00e9", "jose\u0301"
    assert roster.parse(f"student\n{nfd}\n").ids() == [nfc]
    with pytest.raises(roster.RosterError, match="line 3: the student id 'jos\u00e9' is already on line 2"):
        roster.parse(f"student\n{nfc}\n{nfd}\n", "roster.csv")


def test_a_roster_line_with_an_unquoted_comma_is_refused_with_the_fix():
    with pytest.raises(roster.RosterError) as e:
        roster.parse("student,name\nalice,Liddell, Alice\n", "roster.csv")
    assert "line 2: 3 fields where the header has 2" in str(e.value) and "double quotes" in str(e.value)


def test_a_folder_named_in_nfd_is_the_roster_student_named_in_nfc(tmp_path):
    from labkit.grading.intake import collect, handin

    (tmp_path / "jose\u0301").mkdir()
    (tmp_path / "jose\u0301" / "lab-3.ipynb").write_text("{}")
    subs = collect.discover(tmp_path, [3])
    handin.with_roster(subs, roster.parse("student\njos\u00e9\n"))
    assert list(subs.students) == ["jos\u00e9"] and 3 in subs.students["jos\u00e9"]
    assert not subs.class_notes


def test_two_folders_of_one_id_in_two_unicode_forms_are_refused_not_picked(tmp_path):
    from labkit.grading.intake import collect

    for name in ("jos\u00e9", "jose\u0301"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lab-3.ipynb").write_text("{}")
    subs = collect.discover(tmp_path, [3])
    assert "two Unicode forms" in subs.refused["jos\u00e9", 3]


def test_students_named_in_nfd_on_the_command_line_are_the_classes_nfc_ids():
    from labkit.grading.intake import handin

    assert handin.named_students("jose\u0301, bob", {"jos\u00e9", "bob"}) == {"jos\u00e9", "bob"}
