"""A TA's overrides: checked against the class, applied after grading, marked wherever grades are shown."""

from __future__ import annotations

import csv
import io

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
