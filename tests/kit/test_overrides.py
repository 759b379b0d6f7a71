"""A TA's overrides: checked against the class, applied after grading, marked wherever grades are shown."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from test_policy import bob_rows, results

from labkit.grading.publish import gradebook, markdown, pages, scoreboard
from labkit.grading.state import overrides, policy

TESTS = {3: {"test_doubles", "test_split"}, 5: {"test_mlp"}}


def with_overrides(text: str) -> dict:
    res = results(bob_rows())
    res["overrides"] = overrides.parse(text, "overrides.csv", {"bob"}, TESTS)
    return res


def test_a_points_override_sets_the_labs_points_and_is_marked_with_its_comment():
    res = with_overrides("student,lab,points,comment\nbob,3,4.5,regraded by hand\n")
    lab = policy.grades(res)["students"]["bob"]["labs"]["3"]
    assert (lab["points"], lab["overridden"]) == (4.5, "regraded by hand")
    assert policy.grades(res)["students"]["bob"]["points"] == 8.5


def test_a_test_override_changes_its_outcome_on_every_configuration_before_the_rule():
    res = with_overrides("student,lab,test,status,comment\nbob,3,split,passed,accepted after the dispute\n")
    assert policy.grades(res)["students"]["bob"]["labs"]["3"]["points"] == 5


def test_overrides_are_marked_in_grades_csv_the_summary_and_the_page():
    res = with_overrides("student,lab,points,comment\nbob,3,4,by hand\n")
    row = next(r for r in csv.DictReader(io.StringIO(scoreboard.grades_csv(res))) if r["lab"] == "3")
    assert row["overridden"] == "by hand" and row["points"] == "4"
    assert "4/5 (overridden: by hand)" in markdown.to_markdown(res)
    assert 'class="overridden">4/5 (overridden: by hand)</td>' in pages.to_html(res)


def test_overrides_reach_the_lms_exports():
    res = with_overrides("student,lab,points,comment\nbob,3,4,by hand\n")
    table = list(csv.reader(io.StringIO(gradebook.export(res, "wide"))))
    assert table[1][table[0].index("lab-3")] == "4"


@pytest.mark.parametrize(
    "text, says",
    [
        ("student,lab,points\nzed,3,1\n", "overrides.csv, line 2: no student 'zed' in this class"),
        ("student,lab,points\nbob,9,1\n", "overrides.csv, line 2: no lab '9' graded here"),
        ("student,lab,test,status\nbob,3,nope,passed\n", "overrides.csv, line 2: lab 3 has no test 'nope'"),
        ("student,lab,test,status\nbob,3,split,maybe\n", "status must be passed or failed"),
        ("student,lab,points\nbob,3,-1\n", "points must not be negative"),
        ("student,lab,points\nbob,3,1\nbob,3,2\n", "overrides.csv, line 3: overrides the same as line 2"),
        ("student,points\nbob,1\n", "overrides.csv, line 1: missing column lab"),
        ("student,lab\nbob,3\n", "give points, or a test and its status"),
    ],
)
def test_a_bad_overrides_line_is_refused_naming_it(text, says):
    with pytest.raises(overrides.OverrideError) as e:
        overrides.parse(text, "overrides.csv", {"bob"}, TESTS)
    assert says in str(e.value)


# ----------------------------------------------------------------------------------------
# The one schema of a TA's files: bounds, every field on every line, ids in NFC.
# ----------------------------------------------------------------------------------------

POINTS = {3: 5, 5: 4}


def test_a_points_override_above_the_labs_points_is_refused_naming_the_field_and_the_fix():
    with pytest.raises(overrides.OverrideError) as e:
        overrides.parse("student,lab,points\nbob,3,500\n", "overrides.csv", {"bob"}, TESTS, POINTS)
    assert str(e.value).startswith("overrides.csv, line 2: points must be at most 5, got '500'")
    assert "field points" in str(e.value) and "[labs.3] extra_credit" in str(e.value)


def test_extra_credit_named_in_the_policy_lets_an_override_go_that_far_and_no_further():
    text = "student,lab,points\nbob,3,7\n"
    assert overrides.parse(text, "o.csv", {"bob"}, TESTS, POINTS, {3: 2})[0]["points"] == 7
    with pytest.raises(overrides.OverrideError, match="points must be at most 7"):
        overrides.parse("student,lab,points\nbob,3,7.5\n", "o.csv", {"bob"}, TESTS, POINTS, {3: 2})
    assert policy.parse("[labs.3]\nextra_credit = 2\n", "p.toml", [3]).extra == {3: 2}


@pytest.mark.parametrize(
    "text, says",
    [
        (
            "student,lab,points,test,status,comment\nbob,3,4,,,regraded, the mesh was right\n",
            "overrides.csv, line 2: 7 fields where the header has 6",
        ),
        (
            "student,lab,points,test,status,comment\nbob,3,4,,\n",
            "overrides.csv, line 2: 5 fields where the header has 6",
        ),
        ("student,lab,points,comments\nbob,3,4,x\n", "overrides.csv, line 1: unknown column comments"),
        ("student,lab,points\nbob,3,nan\n", "points must be a finite number"),
    ],
)
def test_a_line_with_a_field_too_many_or_too_few_or_an_unknown_column_is_refused(text, says):
    with pytest.raises(overrides.OverrideError) as e:
        overrides.parse(text, "overrides.csv", {"bob"}, TESTS, POINTS)
    assert says in str(e.value) and "fix: " in str(e.value)


def test_an_id_written_in_nfd_is_the_same_student_as_the_classes_nfc_id():
    nfc, nfd = "jos\u00e9", "jose\u0301"
    (entry,) = overrides.parse(f"student,lab,points\n{nfd},3,4\n", "o.csv", {nfc}, TESTS, POINTS)
    assert entry["student"] == nfc


def test_the_course_state_bounds_overrides_by_the_points_of_the_labs_own_tests():
    from labkit.course import catalog
    from labkit.grading.state import course

    context = course.Context(labs=[3], students={"bob"})
    worth = sum(course.test_points(catalog.lab(3)).values())
    ok = f"student,lab,points\nbob,3,{worth}\n"
    assert course.INPUTS["overrides"].check(ok, "o.csv", context)[0]["points"] == worth
    with pytest.raises(overrides.OverrideError, match=f"points must be at most {worth:g}"):
        course.INPUTS["overrides"].check("student,lab,points\nbob,3,500\n", "o.csv", context)


def test_an_adjustment_takes_or_adds_at_most_the_labs_points():
    from labkit.grading.state import adjustments

    text = "student,lab,points,comment\nbob,3,-40,a typo for -4\n"
    with pytest.raises(adjustments.AdjustmentError, match="line 2: points must be at least -5") as e:
        adjustments.parse(text, "adjustments.csv", {"bob"}, {3}, POINTS)
    assert "field points" in str(e.value)


def test_a_student_dropped_from_the_roster_keeps_their_kept_override_inactive_and_named(tmp_path):
    from labkit.grading.state import course

    ta = tmp_path / "ta"
    ta.mkdir()
    (ta / "roster.csv").write_text("student\nbob\ndora\n")
    (ta / "overrides.csv").write_text("student,lab,test,status,comment\ndora,3,test_doubles,passed,by hand\n")
    (ta / "extensions.csv").write_text("student,lab,days\ndora,3,2\n")
    folder = tmp_path / "course"

    def checked(given: dict) -> course.State:
        state = course.read(folder, given, labs=[3])
        context = course.Context(labs=[3], tests={3: {"test_doubles"}}, points={3: 5})
        state.check(context, needs_class=False)
        state.check(context, needs_class=True)
        return state

    checked({n: ta / f"{n}.csv" for n in ("roster", "overrides", "extensions")}).save()
    (ta / "roster.csv").write_text("student\nbob\n")  # dora dropped the course
    state = checked({"roster": ta / "roster.csv"})
    assert state.values["overrides"] == [] and state.values["extensions"] == {}
    said = "\n".join(state.lines())
    assert "overrides.csv, line 2: 'dora' is not in the class now" in said and "inactive" in said
    assert "extensions.csv, line 2: 'dora' is not in the class now" in said
    state.save()
    assert "dora" in (folder / "overrides.csv").read_text()  # kept, to apply again if she returns
    with pytest.raises(course.InputError, match="no student 'dora' in this class"):
        checked({"overrides": ta / "overrides.csv"})  # a file given now that names her: a typo, refused


def test_one_override_is_added_without_retyping_the_others_and_the_replaced_copy_is_kept(tmp_path):
    from labkit.grading.state import course

    ta, folder = tmp_path / "ta", tmp_path / "course"
    ta.mkdir()
    (ta / "overrides.csv").write_text("student,lab,points,test,status,comment\nbob,3,4,,,by hand\n")
    (ta / "more.csv").write_text('student,lab,points,test,status,comment\ndora,3,2,,,"a regrade, by hand"\n')

    def checked(given: dict) -> course.State:
        state = course.read(folder, given, labs=[3])
        state.check(course.Context(labs=[3], students={"bob", "dora"}, tests={3: set()}, points={3: 5}), True)
        state.save()
        return state

    checked({"overrides": ta / "overrides.csv"})
    first = (folder / "overrides.csv").read_text()
    state = checked({"overrides": Path(f"+{ta / 'more.csv'}")})
    assert [(o["student"], o["points"]) for o in state.values["overrides"]] == [("bob", 4), ("dora", 2)]
    assert any("1 line added" in c for c in state.changes)
    (kept,) = (folder / "history").iterdir()
    assert kept.read_text() == first and any(str(kept) in c for c in state.changes)
    (ta / "other.csv").write_text("student,lab,points\nbob,3,1\n")
    with pytest.raises(course.InputError, match="other.csv, line 1: its header"):
        checked({"overrides": Path(f"+{ta / 'other.csv'}")})


def test_a_bad_policy_is_refused_in_the_same_shape_as_every_other_ta_file():
    from labkit.grading.state import course

    with pytest.raises(policy.PolicyError) as e:
        course.INPUTS["policy"].check(
            "[grading]\n\n[labs.3]\nweight = -2\n", "p.toml", course.Context(labs=[3])
        )
    said = str(e.value)
    assert said.startswith("p.toml, line 4: [labs.3] weight must not be negative")
    assert "(field [labs.3] weight; fix: " in said
