"""How often each test fails, per configuration: where a class's code breaks when there are more devices.

For each lab, test and configuration of a graded run, the share of graded units that failed the
test: of the students whose notebook ran there and got a verdict on the test (passed, failed, an
error or a timeout), those that did not pass it. A test not written yet (`todo`) or skipped there
is in neither count; a notebook not handed in, or a configuration that did not run here, neither.

The course's own lesson is in the gaps between configurations: a test the class passes on one
device and fails on eight is one where the code is right for one device and wrong for several
(the sum of one shard, a result left on one device). A test is marked `several_only` on a
configuration of several devices where some student fails it there and passes it on a
configuration of one device (the rule of the scoreboard's "multi-device bugs"); the page draws
those rows out.

`rates(results)` is the data, a pure function of the results; `layout(lab)` turns one lab's into
the bars the page draws as inline SVG (labkit/grading/publish/templates/failrates.html.j2).
"""

from __future__ import annotations

JUDGED = ("passed", "failed", "error", "timeout")
BAR_LENGTH, BAR_HEIGHT = 120, 12


def _single(config: dict) -> bool:
    return config.get("devices") == 1


def rates(results: dict) -> list[dict]:
    """Per lab: its tests, in the order they ran, each with one cell per configuration.

    Each lab: {lab, lab_name, configs: [names], tests: [{test, hidden, cells: [{config, judged,
    failed, rate (0..1, or None where nothing was judged), several_only (students)}]}]}.
    """
    configs = results.get("configs", [])
    singles = [c["name"] for c in configs if _single(c)]
    rows = results.get("rows", [])
    out = []
    for lab in results.get("labs", []):
        of_lab = [r for r in rows if r["lab"] == lab["number"]]
        outcome = {
            (r["student"], r["config"], t["test"]): t["status"] for r in of_lab for t in r.get("tests", [])
        }
        students = sorted({r["student"] for r in of_lab})
        tests = [
            {
                "test": name,
                "hidden": hidden,
                "cells": [_cell(c, name, students, outcome, singles) for c in configs],
            }
            for name, hidden in _tests_in_order(lab, of_lab)
        ]
        out.append(
            {
                "lab": lab["number"],
                "lab_name": lab["name"],
                "configs": [c["name"] for c in configs],
                "tests": tests,
            }
        )
    return out


def _tests_in_order(lab: dict, of_lab: list[dict]) -> list[tuple[str, bool]]:
    """The lab's tests (name, hidden) in the order they ran, then those the lab lists and no row has.

    The order comes from the fullest row, so that a scoreboard read back from JSON (its keys sorted) or
    merged from shards draws the same table as the run that wrote it.
    """
    hidden: dict[str, bool] = {}  # in the order first seen
    for r in sorted(of_lab, key=lambda r: (-len(r.get("tests", [])), r["student"], r["config"])):
        for t in r.get("tests", []):
            hidden.setdefault(t["test"], bool(t.get("hidden")))
    for name, t in sorted((lab.get("tests") or {}).items()):
        hidden.setdefault(name, bool(t.get("hidden")))
    return list(hidden.items())


def _cell(config: dict, name: str, students: list[str], outcome: dict, singles: list[str]) -> dict:
    """One test on one configuration: how many students it judged, failed, and failed only on several devices."""
    judged = [s for s in students if outcome.get((s, config["name"], name)) in JUDGED]
    failed = [s for s in judged if outcome[(s, config["name"], name)] != "passed"]
    several_only = (
        []
        if _single(config)
        else [s for s in failed if any(outcome.get((s, one, name)) == "passed" for one in singles)]
    )
    return {
        "config": config["name"],
        "judged": len(judged),
        "failed": len(failed),
        "rate": round(len(failed) / len(judged), 4) if judged else None,
        "several_only": several_only,
    }


def layout(lab: dict) -> dict:
    """One lab's table for the page: per test, per configuration, a bar as long as the failure rate."""
    rows = []
    for t in lab["tests"]:
        label = t["test"].removeprefix("test_").replace("_", " ")
        cells = []
        for c in t["cells"]:
            rate = c["rate"]
            what = (
                "nothing judged here"
                if rate is None
                else f"{c['failed']} of {c['judged']} failed ({round(100 * rate)}%)"
            )
            if c["several_only"]:
                n = len(c["several_only"])
                what += f"; {n} of them pass{'es' if n == 1 else ''} it on one device: " + ", ".join(
                    c["several_only"]
                )
            cells.append(
                {
                    "config": c["config"],
                    "rate": rate,
                    "several_only": len(c["several_only"]),
                    "length": 0 if not rate else max(2, round(BAR_LENGTH * rate)),
                    "text": "–" if rate is None else f"{round(100 * rate)}%",
                    "title": f"{label} on {c['config']}: {what}",
                }
            )
        rows.append(
            {
                "test": t["test"],
                "label": label,
                "hidden": t["hidden"],
                "cells": cells,
                "several_only": any(c["several_only"] for c in cells),
            }
        )
    return {
        "lab": lab["lab"],
        "lab_name": lab["lab_name"],
        "configs": lab["configs"],
        "rows": rows,
        "width": BAR_LENGTH + 36,
        "height": BAR_HEIGHT + 4,
        "bar_height": BAR_HEIGHT,
    }
