"""Points, lab weights and how configurations combine: the grading policy, on results written by hand.

Every test here is a pure function of scoreboard.json-shaped data or of a policy's TOML text:
nothing is graded, so the whole file runs in about a second.
"""

from __future__ import annotations

import csv
import io

import pytest

from labkit import checks
from labkit.checks import call, check
from labkit.grading.publish import markdown, pages, scoreboard
from labkit.grading.state import policy


def t(name, status, points=1, hidden=False):
    return {
        "test": f"test_{name}",
        "exercise": "f",
        "file": "t.py",
        "hidden": hidden,
        "status": status,
        "message": "",
        "points": points,
    }


def row(student, config, tests, lab=3, status=None):
    counted = [x for x in tests if x["status"] != "skipped"]
    passed = sum(x["status"] == "passed" for x in counted)
    return {
        "student": student,
        "lab": lab,
        "config": config,
        "status": status or "ok",
        "passed": passed,
        "total": len(counted),
        "message": "",
        "tests": tests,
        "cell_errors": [],
        "notes": [],
        "points": sum(x["points"] for x in counted if x["status"] == "passed"),
        "max_points": sum(x["points"] for x in counted),
    }


REFERENCE = [
    row("reference", "cpu-1", [t("doubles", "passed", 2), t("split", "passed", 3)]),
    row("reference", "cpu-8", [t("doubles", "passed", 2), t("split", "passed", 3)]),
    row("reference", "cpu-1", [t("mlp", "passed", 4)], lab=5),
    row("reference", "cpu-8", [t("mlp", "passed", 4)], lab=5),
]


def results(rows, pol: policy.Policy | None = None, students=None) -> dict:
    tests = policy.lab_tests(REFERENCE)
    names = sorted(students or {r["student"] for r in rows})
    return {
        "format": 1,
        "labs": [
            {
                "number": n,
                "name": f"lab-{n}",
                "title": f"Lab {n}",
                "tests": tests[n],
                "max_points": sum(x["points"] for x in tests[n].values()),
            }
            for n in (3, 5)
        ],
        "configs": [
            {"name": "cpu-1", "summary": "", "devices": 1},
            {"name": "cpu-8", "summary": "", "devices": 8},
        ],
        "students": {s: {"notes": []} for s in names},
        "notes": [],
        "rows": rows,
        "policy": (pol or policy.Policy()).to_json(),
    }


def bob_rows():
    """Bob's code passes everything on one device; `split` fails on eight. Lab 5 all passes."""
    return [
        row("bob", "cpu-1", [t("doubles", "passed", 2), t("split", "passed", 3)]),
        row("bob", "cpu-8", [t("doubles", "passed", 2), t("split", "failed", 3)], status="failed"),
        row("bob", "cpu-1", [t("mlp", "passed", 4)], lab=5),
        row("bob", "cpu-8", [t("mlp", "passed", 4)], lab=5),
    ]


# ----------------------------------------------------------------------------------------
# @check(points=...)
# ----------------------------------------------------------------------------------------


def test_a_check_is_worth_one_point_unless_it_says_otherwise():
    @check(got=call("f", 1))
    def test_plain(got):
        pass

    @check(points=2.5, got=call("f", 1))
    def test_heavy(got):
        pass

    assert test_plain.__labkit_points__ == 1 and test_heavy.__labkit_points__ == 2.5


@pytest.mark.parametrize("bad", [-1, "2", True])
def test_a_check_refuses_points_that_are_not_a_number_at_least_0(bad):
    with pytest.raises(TypeError, match="points"):
        checks.check(points=bad, got=call("f"))


# ----------------------------------------------------------------------------------------
# How configurations combine.
# ----------------------------------------------------------------------------------------


def test_by_default_a_test_earns_its_points_only_if_it_passes_on_every_configuration():
    g = policy.grades(results(bob_rows()))
    assert g["students"]["bob"]["labs"]["3"] == {
        "points": 2,
        "max_points": 5,
        "weight": 1,
        "status": "graded",
    }
    assert (g["students"]["bob"]["points"], g["students"]["bob"]["max_points"]) == (6, 9)


def test_combine_any_counts_a_test_passed_on_one_configuration():
    g = policy.grades(results(bob_rows(), policy.Policy(combine="any")))
    assert g["students"]["bob"]["labs"]["3"]["points"] == 5


def test_combine_mean_counts_the_share_of_configurations_passed():
    g = policy.grades(results(bob_rows(), policy.Policy(combine="mean")))
    assert g["students"]["bob"]["labs"]["3"]["points"] == 3.5


def test_lab_weights_scale_a_labs_points_in_the_total():
    g = policy.grades(results(bob_rows(), policy.Policy(weights={5: 2})))
    assert (g["students"]["bob"]["points"], g["students"]["bob"]["max_points"]) == (2 + 8, 5 + 8)


def test_a_test_skipped_on_a_configuration_by_the_reference_is_combined_over_the_others():
    ref = [
        row("reference", "cpu-1", [t("local", "passed")]),
        row("reference", "cpu-8", [t("local", "skipped")]),
    ]
    tests = policy.lab_tests(ref)[3]
    mine = {
        "cpu-1": row("amy", "cpu-1", [t("local", "passed")]),
        "cpu-8": row("amy", "cpu-8", [t("local", "skipped")]),
    }
    assert tests["test_local"]["configs"] == ["cpu-1"]
    assert policy.lab_points(policy.Policy(), tests, mine) == (1, 1)


def test_a_student_who_handed_in_nothing_has_0_of_the_labs_points_and_missing():
    missing = [row("dana", c, [], lab=n, status="missing") for n in (3, 5) for c in ("cpu-1", "cpu-8")]
    g = policy.grades(results(bob_rows() + missing))
    assert g["students"]["dana"]["labs"]["3"] == {
        "points": 0,
        "max_points": 5,
        "weight": 1,
        "status": "missing",
    }
    assert g["students"]["dana"]["max_points"] == 9


def test_a_run_that_errored_earns_nothing_on_that_lab():
    rows = [
        row("eve", "cpu-1", [t("doubles", "passed", 2), t("split", "passed", 3)]),
        row("eve", "cpu-8", [], status="timeout"),
    ]
    assert policy.grades(results(rows))["students"]["eve"]["labs"]["3"]["points"] == 0


def test_the_rule_is_stated_with_the_configurations_and_weights_that_made_the_grade():
    g = policy.grades(results(bob_rows(), policy.Policy(weights={5: 2}, source="tests/policy.toml")))
    assert "passes on every configuration graded (cpu-1, cpu-8)" in g["rule"]
    assert "lab 5 x2" in g["rule"] and "tests/policy.toml" in g["rule"]


def test_grades_csv_has_each_labs_points_and_a_total_per_student_with_the_rule():
    table = list(csv.DictReader(io.StringIO(scoreboard.grades_csv(results(bob_rows())))))
    assert [(r["lab"], r["points"], r["max_points"]) for r in table if r["student"] == "bob"] == [
        ("3", "2", "5"),
        ("5", "4", "4"),
        ("total", "6", "9"),
    ]
    assert all("every configuration" in r["rule"] for r in table)


def test_the_summary_and_the_page_show_points_per_lab_and_total():
    res = results(bob_rows())
    assert "| bob | 2/5 | 4/4 | 6/9 |" in markdown.to_markdown(res)
    assert '<td class="total">6/9</td>' in pages.to_html(res)


# ----------------------------------------------------------------------------------------
# The policy file.
# ----------------------------------------------------------------------------------------

GOOD = """
[grading]
combine = "any"
required = ["cpu-1", "cpu-8"]

[labs.3]
weight = 2
"""


def test_a_policy_file_gives_the_rule_the_required_configurations_and_the_weights():
    p = policy.parse(GOOD, "tests/policy.toml", known_labs=[3, 5])
    assert (p.combine, p.required, p.weight(3), p.weight(5)) == ("any", ("cpu-1", "cpu-8"), 2, 1)


@pytest.mark.parametrize(
    "text, says",
    [
        ('[grading]\nrequired = ["tpu-v9"]', "unknown configuration 'tpu-v9'"),
        ("[labs.3]\nweight = -1", "[labs.3] weight must not be negative"),
        ("[labs.42]\nweight = 1", "[labs.42] names no lab"),
        ('[grading]\ncombine = "best"', "combine = 'best' is not one of"),
        ("[grading]\nrequire = []", "unknown key 'require' in [grading]"),
        ("[labs.3]\nweight = 'heavy'", "must be a number"),
        ("[grading", "not valid TOML"),
    ],
)
def test_a_bad_policy_file_is_refused_naming_the_file_and_the_key(text, says):
    with pytest.raises(policy.PolicyError) as e:
        policy.parse(text, "tests/policy.toml", known_labs=[3, 5])
    assert says in str(e.value) and "tests/policy.toml" in str(e.value)


def test_grades_are_provisional_when_configs_leaves_out_a_required_configuration():
    p = policy.Policy(required=("cpu-1", "cpu-8"), source="tests/policy.toml")
    assert (
        policy.check_required(p, ["cpu-1"])
        == "provisional: tests/policy.toml requires cpu-8, which --configs left out"
    )
    assert policy.check_required(p, ["cpu-1", "cpu-8"]) == ""


def test_provisional_grades_say_so_in_their_rule():
    res = results(bob_rows()) | {
        "provisional": "provisional: tests/policy.toml requires cpu-8, which --configs left out"
    }
    assert policy.grades(res)["rule"].startswith("PROVISIONAL: tests/policy.toml requires cpu-8")


def test_grading_refuses_final_grades_when_a_required_configuration_cannot_run_here():
    from labkit.course import configs

    unavailable = [c for c in configs.CONFIGS.values() if not c.availability()[0]]
    if not unavailable:
        pytest.skip("every configuration runs on this machine")
    name = unavailable[0].name
    with pytest.raises(policy.PolicyError, match=f"requires {name}, which cannot run here"):
        policy.check_required(policy.Policy(required=(name,)), [name])


def test_the_courses_own_policy_file_is_valid():
    assert policy.load().source.endswith("policy.toml")
