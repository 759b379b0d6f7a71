"""Each student's feedback, in Markdown and in HTML, drawn from one context (labkit/grading/context.py).

Drawn from hand-made results (what `grade` writes): a class of two labs, the first with a
leaderboard (lab 9) and a later one without (lab 10), a late submission and a TA's adjustments.
"""

from __future__ import annotations

import csv
import io

import pytest

from labkit.grading import markdown, pages, policy, scoreboard
from tests.kit.test_leaderboard import SPEC, card

DUE = "2026-03-01T23:59:00+00:00"


def lab_row(student: str, lab: int, config: str, passes: bool, message: str = "", costs: dict | None = None) -> dict:
    tests = [{"test": "test_sums", "exercise": "e", "file": "t.py", "hidden": False,
              "status": "passed" if passes else "failed", "message": "" if passes else message, "points": 2},
             {"test": "test_hidden_shape", "exercise": "e", "file": "h.py", "hidden": True, "status": "passed",
              "message": "", "points": 1}]
    return {"student": student, "lab": lab, "config": config, "status": "ok" if passes else "failed",
            "passed": 2 if passes else 1, "total": 2, "message": "" if passes else "1 of 2 tests did not pass",
            "tests": tests, "cell_errors": [], "notes": [], **({"costs": costs} if costs else {})}


def lab_tests() -> dict:
    return {"test_sums": {"points": 2, "hidden": False, "configs": ["cpu-8"]},
            "test_hidden_shape": {"points": 1, "hidden": True, "configs": ["cpu-8"]}}


def make_results() -> dict:
    """alice passes both labs, lab 10 two days late; bob fails lab 10's public test."""
    rows = [lab_row("alice", 9, "cpu-8", True, costs=card(5000)), lab_row("alice", 10, "cpu-8", True),
            lab_row("bob", 9, "cpu-8", True, costs=card(9000)),
            lab_row("bob", 10, "cpu-8", False, "expected shape <N> on /home/ta/course/submissions/bob/lab-10.ipynb")]
    late = {"times": {"gradescope": "2026-03-03T20:00:00+00:00"}, "late": False}
    return {"format": 1,
            "labs": [{"number": 9, "name": "lab-9", "title": "Lab 9 · Tensor parallelism and FSDP",
                      "leaderboard": SPEC.to_json(), "reference_costs": {"cpu-8": card(7392)}, "tests": lab_tests()},
                     {"number": 10, "name": "lab-10", "title": "Lab 10 · Pipelines", "tests": lab_tests()}],
            "configs": [{"name": "cpu-8", "summary": "eight simulated CPU devices", "devices": 8}],
            "students": {"alice": {"notes": [], "section": "A", "submissions": {"10": late}},
                         "bob": {"notes": [], "section": "B"}},
            "notes": [], "rows": rows,
            "policy": policy.Policy(due={10: DUE}, late={"per_day": 0.1, "cap": 0.5}).to_json()}


@pytest.fixture
def results() -> dict:
    return make_results()


def lab_part(md: str, lab: int) -> str:
    start = md.index(f"## Lab {lab} ")
    end = md.find("\n## ", start + 1)
    return md[start:] if end < 0 else md[start:end]


def test_feedback_over_several_labs_with_a_leaderboard_lab_not_last_is_written(results):
    """The default whole-class run (every lab, lab 9's board before lab 10) died here, writing no feedback."""
    for student in ("alice", "bob"):
        assert f"# Feedback: {student}" in markdown.feedback(results, student)


def test_the_markdown_shows_every_labs_points_and_late_penalty(results):
    md = markdown.feedback(results, "alice")
    assert "Points: 3/3" in lab_part(md, 9)
    assert "Points: 2.4/3" in lab_part(md, 10)  # 2 days late at 10% a day
    assert "2 days late" in lab_part(md, 10)
    bob = markdown.feedback(results, "bob")
    assert "Points: 1/3" in lab_part(bob, 10)
