"""Every lab ends with a stretch exercise for students who finish early, and a stretch is never graded.

Read from the notebooks and the test modules, without running a lab: each reference has one
"## Stretch (not graded): ..." cell followed by the cell that defines the stretch's function (its solution
between the markers the student version strips), the student version leaves it to write, and
every test that calls a stretch, public or hidden, is worth no points (`@check(points=0)`).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from labkit.course import catalog

HEADING = "## Stretch (not graded): "
DEFINES = re.compile(r"^def (\w+)\(")
# The labs whose stretch has tests of its own, public and hidden (labs 3 to 6 and 12 print theirs only).
TESTED = (1, 2, 7, 8, 9, 10, 11, 13)
LABS = catalog.labs()
# The test modules mark single-process tests for the judge's pytest, which registers that mark; here it is unknown.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")


def _cells(path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def stretch_of(path) -> tuple[str, str]:
    """(name, source of the cell that defines it) of the notebook's only stretch exercise."""
    cells = _cells(path)
    found = [i for i, (kind, text) in enumerate(cells) if kind == "markdown" and text.startswith(HEADING)]
    assert len(found) == 1, f"{path.name}: expected one stretch heading, found {len(found)}"
    kind, code = cells[found[0] + 1]
    defines = DEFINES.match(code)
    assert kind == "code" and defines, f"{path.name}: the cell after the stretch heading defines no function"
    return defines.group(1), code


def _tests(directory) -> list:
    found = []
    for path in sorted(directory.glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"stretch_{directory.parent.name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found += [
            f for n, f in vars(module).items() if n.startswith("test_") and hasattr(f, "__labkit_calls__")
        ]
    return found


def calls_of(directory, name: str) -> list:
    return [t for t in _tests(directory) if any(c.function == name for c in t.__labkit_calls__.values())]


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_every_reference_ends_with_one_stretch_whose_solution_the_student_version_strips(lab):
    _, code = stretch_of(lab.reference)
    assert "### BEGIN SOLUTION" in code and "### END SOLUTION" in code
    assert "except NotImplementedError" in code, "the try-it part must run before the stretch is written"


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_the_student_version_leaves_the_stretch_to_write(lab):
    name, code = stretch_of(lab.student)
    assert name == stretch_of(lab.reference)[0]
    assert (
        'raise NotImplementedError("write your solution here")' in code and "### BEGIN SOLUTION" not in code
    )


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_a_test_of_a_stretch_is_worth_no_points(lab):
    name, _ = stretch_of(lab.reference)
    for directory in (lab.public_tests, lab.hidden_tests):
        for test in calls_of(directory, name):
            assert test.__labkit_points__ == 0, f"{test.__name__} grades the stretch {name}"


@pytest.mark.parametrize("number", TESTED)
def test_these_stretches_have_public_and_hidden_tests(number):
    lab = catalog.lab(number)
    name, _ = stretch_of(lab.reference)
    assert calls_of(lab.public_tests, name), f"lab {number}: no public test calls {name}"
    assert calls_of(lab.hidden_tests, name), f"lab {number}: no hidden test calls {name}"


def _summary(stretch_status: str):
    from labkit.judge.judge import Outcome
    from labkit.run.execute import RunRecord
    from labkit.student import report

    outcomes = [
        Outcome("doubles", "shard_map_double", "cpu-8", "cpu-8", "passed"),
        Outcome("stretch", "shard_shapes", "cpu-8", "cpu-8", stretch_status, points=0),
    ]
    return report.summary(["cpu-8"], outcomes, {"cpu-8": RunRecord("cpu-8", "ok")})


def test_a_stretch_not_tried_yet_leaves_the_run_passing_and_says_so():
    line, ok = _summary("todo")
    assert ok and line == "1/1 on cpu-8 (1 optional not tried yet)"


def test_a_stretch_tried_and_wrong_fails_the_run():
    line, ok = _summary("failed")
    assert not ok and line == "1/2 on cpu-8"


def test_a_graded_row_leaves_out_a_stretch_not_tried_and_counts_one_tried():
    from labkit.grading.running import rows
    from labkit.judge.judge import Outcome
    from labkit.run.execute import RunRecord

    def row(stretch_status):
        outcomes = [
            Outcome("doubles", "shard_map_double", "ada", "cpu-8", "passed"),
            Outcome("stretch", "shard_shapes", "ada", "cpu-8", stretch_status, points=0),
        ]
        return rows.make_row("ada", 1, "cpu-8", RunRecord("cpu-8", "ok"), outcomes)

    untried, wrong = row("todo"), row("failed")
    assert (untried["status"], untried["passed"], untried["total"], untried["points"]) == ("ok", 1, 1, 1)
    assert (wrong["status"], wrong["passed"], wrong["total"], wrong["points"]) == ("failed", 1, 2, 1)
