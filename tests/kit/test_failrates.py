"""Each test's failure rate per configuration (labkit/grading/classwide/failrates.py), from results written by hand."""

from __future__ import annotations

from labkit.grading.classwide import failrates


def outcome(name, status, hidden=False):
    return {"test": f"test_{name}", "hidden": hidden, "status": status, "message": ""}


def row(student, config, tests, status="ok"):
    return {"student": student, "lab": 3, "config": config, "status": status, "tests": list(tests)}


def results(rows, configs=(("cpu-1", 1), ("cpu-8", 8))):
    return {
        "labs": [{"number": 3, "name": "lab-3"}],
        "configs": [{"name": n, "devices": d} for n, d in configs],
        "rows": list(rows),
    }


def cell(found, test, config):
    lab = found[0]
    t = next(t for t in lab["tests"] if t["test"] == f"test_{test}")
    return next(c for c in t["cells"] if c["config"] == config)


CLASS = [
    row("ann", "cpu-1", [outcome("doubles", "passed"), outcome("is_split", "passed")]),
    row("ann", "cpu-8", [outcome("doubles", "passed"), outcome("is_split", "failed")], "failed"),
    row("ben", "cpu-1", [outcome("doubles", "passed"), outcome("is_split", "passed")]),
    row("ben", "cpu-8", [outcome("doubles", "passed"), outcome("is_split", "failed")], "failed"),
    row("cy", "cpu-1", [outcome("doubles", "failed"), outcome("is_split", "failed")], "failed"),
    row("cy", "cpu-8", [outcome("doubles", "failed"), outcome("is_split", "error")], "error"),
    row("dee", "cpu-1", [outcome("doubles", "passed"), outcome("is_split", "todo")], "failed"),
    row("dee", "cpu-8", [outcome("doubles", "passed"), outcome("is_split", "todo")], "failed"),
    row("eve", "cpu-1", [], "missing"),
    row("eve", "cpu-8", [], "missing"),
]


def test_the_rate_is_the_share_of_judged_units_that_did_not_pass():
    found = failrates.rates(results(CLASS))
    assert [t["test"] for t in found[0]["tests"]] == ["test_doubles", "test_is_split"]
    assert (cell(found, "doubles", "cpu-1")["failed"], cell(found, "doubles", "cpu-1")["judged"]) == (1, 4)
    assert cell(found, "doubles", "cpu-1")["rate"] == 0.25
    # on eight devices is_split fails for ann and ben and errs for cy; dee has not written it yet, eve handed nothing in
    assert (cell(found, "is_split", "cpu-8")["failed"], cell(found, "is_split", "cpu-8")["judged"]) == (3, 3)
    assert cell(found, "is_split", "cpu-1")["rate"] == round(1 / 3, 4)


def test_a_test_failed_on_several_devices_and_passed_on_one_names_who():
    found = failrates.rates(results(CLASS))
    assert cell(found, "is_split", "cpu-8")["several_only"] == ["ann", "ben"]
    assert cell(found, "is_split", "cpu-1")["several_only"] == []
    assert cell(found, "doubles", "cpu-8")["several_only"] == []  # cy fails it on one device too


def test_a_configuration_where_nothing_was_judged_has_no_rate():
    rows = [row("ann", "cpu-1", [outcome("doubles", "passed")]), row("ann", "cpu-8", [], "skipped")]
    found = failrates.rates(results(rows))
    assert cell(found, "doubles", "cpu-8") == {
        "config": "cpu-8",
        "judged": 0,
        "failed": 0,
        "rate": None,
        "several_only": [],
    }


def test_tests_come_in_the_order_they_ran_then_those_no_row_has_by_name():
    res = results(
        [row("ann", "cpu-1", [outcome("extra", "passed"), outcome("doubles", "failed")])],
        configs=(("cpu-1", 1),),
    )
    res["labs"][0]["tests"] = {"test_is_split": {"hidden": True}, "test_doubles": {"hidden": False}}
    tests = failrates.rates(res)[0]["tests"]
    assert [(t["test"], t["hidden"]) for t in tests] == [
        ("test_extra", False),
        ("test_doubles", False),
        ("test_is_split", True),
    ]


def test_the_drawn_bars_are_as_long_as_the_rate_and_mark_the_several_device_rows():
    lab = failrates.layout(failrates.rates(results(CLASS))[0])
    split = next(r for r in lab["rows"] if r["test"] == "test_is_split")
    doubles = next(r for r in lab["rows"] if r["test"] == "test_doubles")
    assert split["several_only"] and not doubles["several_only"]
    eight = next(c for c in split["cells"] if c["config"] == "cpu-8")
    assert eight["length"] == failrates.BAR_LENGTH and eight["text"] == "100%"
    assert "2 of them pass it on one device: ann, ben" in eight["title"]
    one = next(c for c in doubles["cells"] if c["config"] == "cpu-1")
    assert one["length"] == failrates.BAR_LENGTH // 4 and one["text"] == "25%"


def test_tests_are_drawn_in_the_order_they_ran_whatever_order_the_results_were_read_back_in():
    # A lab's tests as a grading run records them, and as JSON with sorted keys gives them back.
    ran = results(CLASS)
    ran["labs"][0]["tests"] = {"test_is_split": {"hidden": False}, "test_doubles": {"hidden": False}}
    read_back = {
        **ran,
        "labs": [{**ran["labs"][0], "tests": dict(sorted(ran["labs"][0]["tests"].items()))}],
        "rows": list(reversed(ran["rows"])),
    }
    for found in (failrates.rates(ran), failrates.rates(read_back)):
        assert [t["test"] for t in found[0]["tests"]] == ["test_doubles", "test_is_split"]
