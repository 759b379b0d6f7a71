"""Due dates, the late policy and extensions, on submission times written by hand."""

from __future__ import annotations

import pytest
from test_policy import bob_rows, results

from labkit import deadlines, policy, scoreboard

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
    p = policy.parse('[labs.3]\ndue = 2026-03-01T23:59:00-08:00\n[late]\nper_day = 0.1\ncap = 0.3\n',
                     "tests/policy.toml", known_labs=[3])
    assert p.due == {3: DUE} and p.late == {"per_day": 0.1, "cap": 0.3}
    with pytest.raises(policy.PolicyError, match="due must be a date and time with its offset"):
        policy.parse("[labs.3]\ndue = 2026-03-01T23:59:00\n", "tests/policy.toml", known_labs=[3])


def test_a_late_lab_loses_its_share_of_points_and_says_so():
    res = results(bob_rows(), policy.Policy(due={3: DUE}, late=LATE))
    res["students"]["bob"]["submissions"] = {"3": {"digest": "x", "submitted_at": "2026-03-02T12:00:00-08:00"}}
    lab = policy.grades(res)["students"]["bob"]["labs"]["3"]
    assert (lab["points"], lab["late_days"], lab["late_penalty"]) == (1.8, 1, 0.1)
    assert "2/5" not in scoreboard.to_markdown(res) and "1.8/5 (late 1d, -10%)" in scoreboard.to_markdown(res)


def test_extensions_name_students_and_labs_of_the_class():
    text = "student,lab,days\nbob,3,2\n"
    assert deadlines.parse_extensions(text, "ext.csv", {"bob"}, {3}) == {"bob": {"3": 2.0}}
    with pytest.raises(deadlines.DeadlineError, match="ext.csv, line 2: no student 'zed'"):
        deadlines.parse_extensions("student,lab,days\nzed,3,2\n", "ext.csv", {"bob"}, {3})
    with pytest.raises(deadlines.DeadlineError, match="ext.csv, line 2: no lab '9'"):
        deadlines.parse_extensions("student,lab,days\nbob,9,2\n", "ext.csv", {"bob"}, {3})
    with pytest.raises(deadlines.DeadlineError, match="missing column days"):
        deadlines.parse_extensions("student,lab\nbob,3\n", "ext.csv", {"bob"}, {3})

