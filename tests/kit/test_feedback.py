"""Each student's feedback, in Markdown and in HTML, drawn from one context (labkit/grading/publish/context.py).

Drawn from hand-made results (what `grade` writes): a class of two labs, the first with a
leaderboard (lab 9) and a later one without (lab 10), a late submission and a TA's adjustments.
"""

from __future__ import annotations

import csv
import io

import pytest

from labkit.grading.publish import markdown, pages, scoreboard
from labkit.grading.state import policy
from tests.kit.test_leaderboard import SPEC, card

DUE = "2026-03-01T23:59:00+00:00"


def lab_row(
    student: str, lab: int, config: str, passes: bool, message: str = "", costs: dict | None = None
) -> dict:
    tests = [
        {
            "test": "test_sums",
            "exercise": "e",
            "file": "t.py",
            "hidden": False,
            "status": "passed" if passes else "failed",
            "message": "" if passes else message,
            "points": 2,
        },
        {
            "test": "test_hidden_shape",
            "exercise": "e",
            "file": "h.py",
            "hidden": True,
            "status": "passed",
            "message": "",
            "points": 1,
        },
    ]
    return {
        "student": student,
        "lab": lab,
        "config": config,
        "status": "ok" if passes else "failed",
        "passed": 2 if passes else 1,
        "total": 2,
        "message": "" if passes else "1 of 2 tests did not pass",
        "tests": tests,
        "cell_errors": [],
        "notes": [],
        **({"costs": costs} if costs else {}),
    }


def lab_tests() -> dict:
    return {
        "test_sums": {"points": 2, "hidden": False, "configs": ["cpu-8"]},
        "test_hidden_shape": {"points": 1, "hidden": True, "configs": ["cpu-8"]},
    }


def make_results() -> dict:
    """alice passes both labs, lab 10 two days late; bob fails lab 10's public test."""
    rows = [
        lab_row("alice", 9, "cpu-8", True, costs=card(5000)),
        lab_row("alice", 10, "cpu-8", True),
        lab_row("bob", 9, "cpu-8", True, costs=card(9000)),
        lab_row(
            "bob", 10, "cpu-8", False, "expected shape <N> on /home/ta/course/submissions/bob/lab-10.ipynb"
        ),
    ]
    late = {"times": {"gradescope": "2026-03-03T20:00:00+00:00"}, "late": False}
    return {
        "format": 1,
        "labs": [
            {
                "number": 9,
                "name": "lab-9",
                "title": "Lab 9 · Tensor parallelism and FSDP",
                "leaderboard": SPEC.to_json(),
                "reference_costs": {"cpu-8": card(7392)},
                "tests": lab_tests(),
            },
            {"number": 10, "name": "lab-10", "title": "Lab 10 · Pipelines", "tests": lab_tests()},
        ],
        "configs": [{"name": "cpu-8", "summary": "eight simulated CPU devices", "devices": 8}],
        "students": {
            "alice": {"notes": [], "section": "A", "submissions": {"10": late}},
            "bob": {"notes": [], "section": "B"},
        },
        "notes": [],
        "rows": rows,
        "policy": policy.Policy(due={10: DUE}, late={"per_day": 0.1, "cap": 0.5}).to_json(),
    }


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


# ----------------------------------------------------------------------------------------
# A TA's adjustments and rubric items (labkit/grading/state/adjustments.py).
# ----------------------------------------------------------------------------------------

ADJUSTED = (
    "student,lab,points,comment,item,max\n"
    'bob,10,-0.5,"the write-up swaps the mesh axes",,\n'
    'alice,10,4,"the bubble is explained; no cost estimate",design write-up,5\n'
)


def adjusted(results: dict) -> dict:
    from labkit.grading.state import adjustments

    return results | {
        "adjustments": adjustments.parse(ADJUSTED, "adjustments.csv", {"alice", "bob"}, {9, 10})
    }


def test_adjustments_and_rubric_items_are_summed_in_grades_csv(results):
    table = {
        (r["student"], r["lab"]): r
        for r in csv.DictReader(io.StringIO(scoreboard.grades_csv(adjusted(results))))
    }
    assert (table["alice", "10"]["points"], table["alice", "10"]["max_points"]) == (
        "6.4",
        "8",
    )  # 2.4 + 4 of 3 + 5
    assert (table["bob", "10"]["points"], table["bob", "10"]["max_points"]) == (
        "0.5",
        "8",
    )  # 1 - 0.5; item: 0 of 5
    assert (table["alice", "total"]["points"], table["alice", "total"]["max_points"]) == ("9.4", "11")
    assert table["bob", "10"]["adjustments"] == (
        "'-0.5 (the write-up swaps the mesh axes); design write-up: 0/5 (not graded)"
    )
    assert (
        "design write-up: 4/5 (the bubble is explained; no cost estimate)"
        in table["alice", "10"]["adjustments"]
    )


@pytest.mark.parametrize("render", [markdown.feedback, pages.feedback_html])
def test_adjustments_are_shown_with_their_comment_in_both_renderings(results, render):
    text = render(adjusted(results), "bob")
    assert "the write-up swaps the mesh axes" in text and "-0.5" in text
    assert "design write-up" in render(adjusted(results), "alice")


@pytest.mark.parametrize(
    "text, said",
    [
        ("student,lab,points\nbob,10,1\n", "adjustments.csv, line 1: missing column comment"),
        ("student,lab,points,comment\neve,10,1,x\n", "adjustments.csv, line 2: no student 'eve'"),
        ("student,lab,points,comment\nbob,11,1,x\n", "adjustments.csv, line 2: no lab '11'"),
        ("student,lab,points,comment\nbob,10,one,x\n", "adjustments.csv, line 2: points must be a number"),
        ("student,lab,points,comment\nbob,10,1,\n", "adjustments.csv, line 2: a comment is required"),
        ("student,lab,points,comment,item,max\nbob,10,6,x,design,5\n", "line 2: points must be between 0"),
        (
            "student,lab,points,comment,item,max\nbob,10,1,x,design,\n",
            "line 2: the rubric item 'design' needs its max",
        ),
        (
            "student,lab,points,comment,item,max\nbob,10,1,x,design,5\nalice,10,1,x,design,4\n",
            "line 3: the rubric item 'design' of lab 10 is worth 4 here but 5 on line 2",
        ),
        (
            "student,lab,points,comment,item,max\nbob,10,1,x,design,5\nbob,10,2,y,design,5\n",
            "line 3: grades the same rubric item as line 2",
        ),
        ("student,lab,points,comment,grade\nbob,10,1,x,3\n", "line 1: unknown column grade"),
    ],
)
def test_a_bad_adjustments_file_is_refused_naming_its_line(text, said):
    from labkit.grading.state import adjustments

    with pytest.raises(adjustments.AdjustmentError, match=None) as e:
        adjustments.parse(text, "adjustments.csv", {"alice", "bob"}, {9, 10})
    assert said in str(e.value)


# ----------------------------------------------------------------------------------------
# One context, two renderings: escaping and the TA's paths.
# ----------------------------------------------------------------------------------------


def test_the_markdown_escapes_markup_with_backslashes_never_html_entities(results):
    results["students"]["bob"]["notes"] = ["no notebook named lab-<N>.ipynb in this folder"]
    md = markdown.feedback(results, "bob") + markdown.to_markdown(results)
    assert "&lt;" not in md and "&gt;" not in md
    assert "lab-\\<N\\>.ipynb" in md and "expected shape \\<N\\>" in md


TA_PATHS = (
    "/home/ta/course/submissions/bob/lab-10.ipynb",
    "/home/ta/course/.venv/lib/python3.11/site-packages/jax/_src/numpy/lax_numpy.py",
    "/home/ta/course/labkit/run/harness.py",
)


@pytest.mark.parametrize("render", [markdown.feedback, pages.feedback_html])
def test_feedback_never_shows_the_tas_own_paths(results, render):
    bob = next(r for r in results["rows"] if (r["student"], r["lab"]) == ("bob", 10))
    bob["cell_errors"] = [{"cell": 3, "type": "TypeError", "message": f"in {TA_PATHS[1]}, line 4: bad shape"}]
    bob["notes"] = [f"{TA_PATHS[2]} converted the notebook to nbformat 4"]
    text = render(results, "bob")
    assert "/home/ta" not in text
    assert "lab-10.ipynb" in text and "jax/_src/numpy/lax_numpy.py" in text and "harness.py" in text


def test_the_markdown_and_the_page_show_the_same_labs_points_notes_and_adjustments(results):
    from labkit.grading.publish import context

    f = context.feedback(adjusted(results), "alice")
    md, page = markdown.feedback(adjusted(results), "alice"), pages.feedback_html(adjusted(results), "alice")
    for lab in f["labs"]:
        said = [
            f"Points: {lab['points']['points']}/{lab['points']['max_points']}",
            lab["points"]["late_note"],
            *lab["points"]["adjustments"],
        ]
        assert all(s in md for s in said if s) and all(s.replace("'", "&#39;") in page for s in said if s)


# ----------------------------------------------------------------------------------------
# Final points per lab and section, and the anonymised class page (labkit/grading/classwide/stats.py).
# ----------------------------------------------------------------------------------------


def test_final_points_are_summarised_per_lab_and_per_section(results):
    from labkit.grading.classwide import stats

    st = stats.final_points(adjusted(results))
    lab10 = next(r for r in st["class"] if r["lab"] == 10)  # alice 6.4, bob 0.5, of 8
    assert (
        lab10["students"],
        lab10["mean"],
        lab10["median"],
        lab10["stdev"],
        lab10["low"],
        lab10["high"],
    ) == (2, 3.45, 3.45, 2.95, 0.5, 6.4)
    assert lab10["bins"] == [
        1,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        1,
        0,
    ]  # 0.5/8 in the first tenth, 6.4/8 = 80% in the ninth
    assert [s["section"] for s in st["sections"]] == ["A", "B"]
    assert next(r for r in st["sections"][1]["labs"] if r["lab"] == "total")["mean"] == 3.5
    md, page = markdown.to_markdown(adjusted(results)), pages.to_html(adjusted(results))
    assert (
        "| lab-10 | 2 | 3.45/8 | 3.45 | 2.95 | 0.5 | 6.4 | 1 0 0 0 0 0 0 0 1 0 |" in md
        and "### Section B" in md
    )
    assert '<table class="final-points" data-section="B">' in page


def test_a_class_without_sections_is_one_group(results):
    from labkit.grading.classwide import stats

    for info in results["students"].values():
        info.pop("section")
    assert stats.final_points(results)["sections"] == []


def test_the_anonymised_class_page_names_no_student(results, tmp_path):
    ids = ("stu_quokka41", "stu_narwhal77")
    renamed = make_results()
    for old, new in zip(("alice", "bob"), ids):
        renamed["students"][new] = renamed["students"].pop(old) | {
            "name": f"{new} Fullname",
            "email": f"{new}@uni.edu",
        }
        for r in renamed["rows"]:
            if r["student"] == old:
                r["student"] = new
    renamed["notes"] = [f"{ids[0]}: a submission folder not on the roster"]
    scoreboard.write(renamed, tmp_path)
    page = (tmp_path / "class-anonymous.html").read_text()
    assert '<h2 id="final-points">' in page and 'class="spread"' in page
    assert not any(i in page for i in ids)
    assert all(i in (tmp_path / "scoreboard.html").read_text() for i in ids)  # the TA's page does name them


def test_grade_refuses_a_bad_adjustments_file_before_anything_is_graded(tmp_path):
    import shutil
    import subprocess
    import sys

    from labkit.course import catalog

    (tmp_path / "class" / "alice").mkdir(parents=True)
    shutil.copy(catalog.ROOT / "labs" / "lab-3.ipynb", tmp_path / "class" / "alice" / "lab-3.ipynb")
    (tmp_path / "adjustments.csv").write_text(
        "student,lab,points,comment\nalice,3,1,a clear write-up\nnobody,3,1,x\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(tmp_path / "class"),
            "--out",
            str(tmp_path / "out"),
            "--labs",
            "3",
            "--configs",
            "cpu-1",
            "--adjustments",
            str(tmp_path / "adjustments.csv"),
        ],
        cwd=catalog.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert (
        done.returncode == 2 and "adjustments.csv, line 3: no student 'nobody' in this class" in done.stderr
    )
    assert not (tmp_path / "out").exists()  # nothing graded, nothing written
