"""One unit's bad data is one unit's error, and the kit's own units never stand in for a student's.

Graded in this process through `grade.grade`, on hand-made pod outputs (the pod path: tests/kit/test_pods.py
shows how a pod's output folder looks) or with the notebook runs replaced by records made here: no notebook
runs, no container. The references here are not real runs, so `check_reference` is replaced by one that
keeps their rows for the tests to read.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.grading import grade
from labkit.grading.running import engine, pods, units
from labkit.run import allowance, execute, modes, scratch

ROOT = Path(__file__).resolve().parents[2]
HANDOUT = (ROOT / "labs" / "lab-3.ipynb").read_text()
LIMITS = replace(allowance.DEFAULT_LIMITS, isolation=modes.LIMITS_ONLY)
VALUE = {"kind": "array", "dtype": "float32", "shape": [2], "data": [1.0, 2.0], "jax": True, "sharding": None}


@pytest.fixture
def references(monkeypatch) -> list[dict]:
    """The reference rows of each grading run (the references here are made up, so not checked)."""
    seen: list[dict] = []
    monkeypatch.setattr(units, "check_reference", lambda rows, labs: seen.extend(rows))
    return seen


def a_class(folder: Path, students: dict[str, str]) -> Path:
    for student, text in students.items():
        (folder / student).mkdir(parents=True)
        (folder / student / "lab-3.ipynb").write_text(text)
    return folder


def planned(tmp_path: Path, students: dict[str, str]) -> tuple[Path, Path, list[dict]]:
    subs = a_class(tmp_path / "class", students)
    units = pods.plan(subs, tmp_path / "plan", labs="3", config_names="cpu-1")
    return subs, tmp_path / "plan", units


def pod_output(runs: Path, index: int, ended: dict, payload: dict | None = None) -> None:
    folder = runs / str(index)
    folder.mkdir(parents=True)
    (folder / pods.ENDED).write_text(json.dumps(ended))
    if payload is not None:
        results = scratch.RunFolders(folder / pods.RUN).scratch
        results.mkdir(parents=True)
        (results / "results.json").write_text(json.dumps(payload))


def index_of(units: list[dict], student: str, kit: bool = False) -> int:
    """A unit's index: the plan lists the kit's units (the references) first, then the students'."""
    mine = [u["index"] for u in units if u["student"] == student]
    return mine[0] if kit else mine[-1]


def grade_pods(subs: Path, out: Path, runs: Path, plan: Path, stream=None) -> dict:
    request = grade.Request(
        subs, out, labs="3", configs="cpu-1", jobs=1, limits=LIMITS, start="cold", runs_from=runs, plan=plan
    )
    return grade.grade(request, stream=stream or io.StringIO(), terminal=False)


def scoreboard_rows(out: Path) -> dict[str, dict]:
    with open(out / "scoreboard.csv", newline="") as f:
        return {r["student"].removeprefix("'"): r for r in csv.DictReader(f)}


def row_of(results: dict, student: str) -> dict:
    return next(r for r in results["rows"] if r["student"] == student)


def test_a_pods_facts_whose_memory_is_a_string_is_that_units_error_and_a_regrade_grades_the_class(
    tmp_path, references
):
    subs, plan, units = planned(tmp_path, {"alice": HANDOUT, "bob": HANDOUT})
    examined = next(
        c for c in json.loads((plan / "units/0/calls.json").read_text())["calls"] if c.get("facts")
    )
    runs = tmp_path / "runs"
    pod_output(runs, index_of(units, "reference", kit=True), {"status": "error", "message": "the kit's pod"})
    pod_output(runs, index_of(units, "alice"), {"status": "error", "message": "alice's pod"})
    facts = {"devices": 8, "memory": "lots", "flops": 1.0, "collectives": [], "top_level": []}
    pod_output(
        runs,
        index_of(units, "bob"),
        {"status": "ok", "seconds": 1.0},
        {
            "environment": {},
            "results": [
                {"id": examined["id"], "value": VALUE, "facts": facts, "program": {"host_data": True}}
            ],
        },
    )
    out = tmp_path / "out"
    for _ in range(2):  # and again: nothing kept from the first run stops the second
        results = grade_pods(subs, out, runs, plan)
        bob = row_of(results, "bob")
        assert bob["status"] == "error" and "facts.memory" in bob["message"], bob["message"]
        assert row_of(results, "alice")["message"] == "alice's pod"
        assert set(scoreboard_rows(out)) == {"alice", "bob"}


def test_an_exception_while_one_unit_is_judged_is_its_error_row_the_class_is_graded_and_the_next_run_judges_it(
    tmp_path, references, monkeypatch
):
    subs, plan, units = planned(tmp_path, {"alice": HANDOUT, "bob": HANDOUT, "cy": HANDOUT})
    runs = tmp_path / "runs"
    for u in units:
        pod_output(runs, u["index"], {"status": "error", "message": f"{u['student']}'s pod"})
    make_row = engine.make_row

    def raising(student, *args, **kw):
        if student == "bob":
            raise RuntimeError("the kit broke on this one")
        return make_row(student, *args, **kw)

    monkeypatch.setattr(engine, "make_row", raising)
    out = tmp_path / "out"
    results = grade_pods(subs, out, runs, plan)
    bob = row_of(results, "bob")
    assert bob["status"] == "error" and "RuntimeError: the kit broke on this one" in bob["message"], bob
    assert (
        row_of(results, "alice")["message"] == "alice's pod"
        and row_of(results, "cy")["message"] == "cy's pod"
    )
    assert set(scoreboard_rows(out)) == {"alice", "bob", "cy"}
    assert not list((out / "units").glob("bob/lab-3/cpu-1.json")), (
        "a unit the kit could not judge is not kept"
    )

    monkeypatch.setattr(engine, "make_row", make_row)
    stream = io.StringIO()
    results = grade_pods(subs, out, runs, plan, stream)
    assert row_of(results, "bob")["message"] == "bob's pod"
    assert "2 of 3 unchanged since the last run" in stream.getvalue()


def test_a_student_named_reference_on_the_pod_path_is_graded_on_their_own_pod(tmp_path, references):
    subs, plan, units = planned(tmp_path, {"alice": HANDOUT, "reference": HANDOUT})
    runs = tmp_path / "runs"
    pod_output(runs, index_of(units, "reference", kit=True), {"status": "error", "message": "the kit's pod"})
    pod_output(runs, index_of(units, "alice"), {"status": "error", "message": "alice's pod"})
    pod_output(runs, index_of(units, "reference"), {"status": "error", "message": "the student's own pod"})
    out = tmp_path / "out"
    results = grade_pods(subs, out, runs, plan)
    assert row_of(results, "reference")["message"] == "the student's own pod"
    assert [r["message"] for r in references] == ["the kit's pod"]
    assert scoreboard_rows(out)["reference"]["message"] == "the student's own pod"
    assert [(u["student"], u["kit"]) for u in units] == [
        ("reference", True),
        ("alice", False),
        ("reference", False),
    ]


def test_a_student_named_reference_is_graded_on_their_own_notebook_locally(tmp_path, references, monkeypatch):
    def run_notebook(notebook, config, calls, workdir, **kw):  # what ran, told apart by the notebook's text
        mine = "a student's own notebook" in Path(notebook).read_text()
        return execute.RunRecord(
            config.name,
            "error",
            "ran the student's notebook" if mine else "ran the kit's reference",
            workdir=str(workdir),
        )

    monkeypatch.setattr(engine.execute, "run_notebook", run_notebook)
    subs = a_class(
        tmp_path / "class", {"reference": HANDOUT.replace("Lab 3", "Lab 3, a student's own notebook", 1)}
    )
    assert "a student's own notebook" in (subs / "reference/lab-3.ipynb").read_text()
    out = tmp_path / "out"
    request = grade.Request(subs, out, labs="3", configs="cpu-1", jobs=1, limits=LIMITS, start="cold")
    results = grade.grade(request, stream=io.StringIO(), terminal=False)
    assert row_of(results, "reference")["message"] == "ran the student's notebook"
    assert [r["message"] for r in references] == ["ran the kit's reference"]
    # and each is kept where the other is not read
    kept = json.loads((out / "units/reference/lab-3/cpu-1.json").read_text())["row"]
    assert kept["message"] == "ran the student's notebook"
    assert json.loads((out / "reference/units/reference/lab-3/cpu-1.json").read_text())["row"]["message"] == (
        "ran the kit's reference"
    )
