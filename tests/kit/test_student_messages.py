"""What a student reads after `make lab-N` and `check(...)` is true and whole: an untouched handout is "not
written yet", never "a run failed"; a cell's error is shown whole (or cut at a sentence with where the rest
is); every skip says why in the table; the table fits the terminal without splitting a test's name; and
`check(...)` leaves no stray value for Jupyter to echo."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from notebook_variants import LAB_3_PUBLIC_TESTS
from rich.console import Console

from labkit.course import catalog
from labkit.judge.judge import Outcome
from labkit.run import runreport
from labkit.run.execute import RunRecord
from labkit.student import report

ROOT = Path(__file__).resolve().parents[2]

# a cell's error as JAX words it: one message over two lines, the break inside a tuple
TILING = (
    "NamedSharding(mesh=Mesh('data': 8), spec=PartitionSpec(None, 'data')) implies that array axis 1 is "
    "partitioned 8 times, but the dimension size is 2 (full shape: (32, 2), per-dimension tiling factors: (1,\n"
    " 8) should evenly divide the shape)"
)


def _printed(runs, outcomes, records=None, width=80) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    report.print_lab(console, "lab-3: labs/lab-3.ipynb", runs, outcomes, records or {})
    return out.getvalue()


def _outcome(run, exercise, test, status="passed", message="") -> Outcome:
    return Outcome(
        run=run, config=run, exercise=exercise, test=test, status=status, message=message, points=1.0
    )


def test_an_untouched_lab_says_its_exercises_are_not_written_yet_not_that_a_run_failed(kit):
    done = kit("lab", "3", "--configs", "cpu-8")  # labs/lab-3.ipynb as handed out: every exercise todo
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    said = done.stdout
    assert "not written yet" in said and "nothing failed" in said, said
    assert "a run failed" not in said and "fix the first failure" not in said, said
    assert "`shard_map_double`" in said and "`row_softmax`" in said
    assert f"FAIL  0/{LAB_3_PUBLIC_TESTS} on cpu-8 ({LAB_3_PUBLIC_TESTS} not written yet)" in said, said


def test_a_cells_error_over_two_lines_is_kept_whole(tmp_path):
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {"labkit_cell": 16},
                "source": "jax.device_put(x, sharding)",
                "outputs": [{"output_type": "error", "ename": "ValueError", "evalue": TILING}],
            }
        ]
    }
    (error,), _ = runreport.cell_errors_of(json.loads(json.dumps(nb)))
    assert error["message"].endswith("per-dimension tiling factors: (1, 8) should evenly divide the shape)")


def test_a_cells_error_too_long_to_show_is_cut_at_a_sentence_with_where_the_rest_is():
    sentence = "Each device holds one block of the rows and sends nothing. "
    message = sentence * 20
    record = RunRecord("cpu-8", "ok", workdir="build/lab-3/cpu-8")
    record.cell_errors = [
        {"cell": 16, "code": "p = row_softmax(x)", "type": "ValueError", "message": message}
    ]
    (line,) = report.cell_problems(["cpu-8"], {"cpu-8": record})
    told = line.split("raised ValueError: ", 1)[1]
    assert told.startswith(sentence)
    shown, rest = told.split(" … ", 1)
    assert shown.endswith("sends nothing."), shown  # a whole sentence, then the mark
    assert rest == "(the whole message: cell 16 of build/lab-3/cpu-8/executed.ipynb) [cpu-8]"
    assert len(line) < len(message)


def test_a_cells_error_raised_in_the_run_is_shown_whole_in_the_terminal(kit, variant):
    indivisible = (
        "jax.device_put(jnp.zeros((32, 2)), jax.sharding.NamedSharding("
        "Mesh(np.array(jax.devices()), ('data',)), P(None, 'data')))\n"
    )
    nb = variant(3, ("# Try it: every row", indivisible + "# Try it: every row"))
    done = kit("lab", "3", "--notebook", str(nb), "--configs", "cpu-8")
    assert "raised IndivisibleError" in done.stdout, done.stdout[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if "raised IndivisibleError" in ln)
    assert "per-dimension tiling factors: (1, 8) should evenly divide the shape)." in line, line
    assert line.endswith(" [cpu-8]"), line


def test_every_skip_in_the_table_shows_its_reason_under_it():
    why = (
        "a production size, judged by the TPU compiler alone: it runs on the compile-only TPU configurations "
        "(CONFIGS=v5e-8, v5e-256, ...), not on {run}"
    )
    outcomes = [
        _outcome(run, "global_gradients", test, status, why.format(run=run) if status == "skipped" else "")
        for run in ("cpu-1", "cpu-8")
        for test, status in (
            ("test_global_gradients_match", "passed"),
            ("test_at_a_production_size_each_chip_fits", "skipped"),
        )
    ]
    said = _printed(["cpu-1", "cpu-8"], outcomes, width=120)
    row = next(ln for ln in said.splitlines() if "at a production size each chip fits" in ln)
    assert row.count("skip¹") == 2, said
    note = next(ln for ln in said.splitlines() if ln.startswith("skip¹"))
    assert note == "skip¹ [cpu-1, cpu-8]: " + why.format(run="cpu-1 and cpu-8"), said


def test_the_table_fits_80_columns_with_every_test_name_whole_on_one_row():
    names = [
        ("shard_map_double", "test_doubles_every_element"),
        ("shard_map_double", "test_accepts_an_input_that_is_already_sharded"),
        ("row_softmax", "test_row_softmax_keeps_the_rows_split_across_every_device"),
        ("row_softmax", "test_row_softmax_holds_a_piece_of_x_and_sends_nothing"),
        (
            "pipeline",
            "test_at_a_production_size_the_pipeline_fits_each_chip_holding_only_the_layers_of_its_stage",
        ),
    ]
    runs = ["cpu-1", "cpu-8", "tpu"]
    outcomes = [_outcome(run, ex, test, "todo", "not implemented yet") for run in runs for ex, test in names]
    for width in (80, 100, 160):
        said = _printed(runs, outcomes, width=width)
        table = said[: said.index("└")]
        assert all(len(line) <= width for line in table.splitlines()), (width, said)
        for _, test in names:
            label = report._label(test)
            if len(label) + 30 < width:  # a name with room beside the marks is whole on one row
                assert any(label in line for line in table.splitlines()), (width, label, said)
        # no row of the table holds the end of a name begun on the row above it
        assert not re.search(r"│\s+│\s+│\s+│ {3}[a-z]", table), said


def test_check_returns_a_verdict_jupyter_does_not_echo():
    import jax
    import numpy as np
    from IPython.core.formatters import DisplayFormatter
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from labkit.notebook import Checker

    def shard_map_double(x):
        mesh = Mesh(np.array(jax.devices()), ("data",))
        return jax.jit(jax.shard_map(lambda b: b * 2.0, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(
            x
        )

    result = Checker(3)("shard_map_double", namespace={"shard_map_double": shard_map_double}, configs=None)
    assert result  # every public test passed in this process
    assert DisplayFormatter().format(result) == ({}, {})  # nothing after the table in Jupyter
    assert str(result) == "True"


def test_a_run_that_fails_as_a_whole_is_said_once_with_the_cell_it_was_running(kit, variant):
    died = variant(3, ("# Try it: every row", "import os\nos._exit(3)\n# Try it: every row"))
    done = kit("lab", "3", "--notebook", str(died), "--configs", "cpu-8")
    assert done.returncode == 1
    said = done.stdout
    assert said.count("the Python kernel died") == 1, said
    line = next(ln for ln in said.splitlines() if "the Python kernel died" in ln)
    assert line.startswith("cpu-8: ") and line.endswith(", in cell 16"), line


def test_check_of_an_untouched_exercise_says_once_that_it_is_not_written_yet(tmp_path):
    nb = json.loads(catalog.lab(3).student.read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    code = (
        "import json, sys\nfrom labkit.notebook import Checker, replay_sources\n"
        "ns = {'In': json.loads(sys.argv[1])}\n"
        "for cell in replay_sources(ns['In']):\n"
        "    try:\n        exec(cell, ns)\n    except NotImplementedError:\n        pass\n"
        "print('RESULT', Checker(3)('row_softmax', namespace=ns))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cells)],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
        | {"LABKIT_BUILD": str(tmp_path)},
    )
    said = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert said.count("not implemented yet") == 1, said
    assert "  • every test above [cpu-1, cpu-8]: not implemented yet" in said, said
    assert "No cost card yet: `row_softmax` is not written yet" in said and "a run failed" not in said, said
    assert "RESULT False" in said


def test_an_exercise_tested_again_further_on_has_its_tests_together_under_its_name_once():
    outcomes = [
        _outcome("cpu-8", exercise, test)
        for exercise, test in (
            ("global_gradients", "test_loss_is_the_whole_batch_loss"),
            ("train_data_parallel", "test_one_step_is_one_sgd_update"),
            ("global_gradients", "test_at_a_production_size_each_chip_fits"),
        )
    ]
    for width in (80, 160):
        said = _printed(["cpu-8"], outcomes, width=width)
        assert said.count("global_gradients") == 1, said
        at = [
            i
            for i, line in enumerate(said.splitlines())
            if "whole batch loss" in line or "production" in line
        ]
        assert at[1] == at[0] + 1, said


def test_check_says_a_skip_given_on_each_configuration_once_with_its_reason(capsys):
    from labkit.notebook import Checker

    def test_global_gradients_match():
        pass

    def test_at_a_production_size_each_chip_fits():
        pass

    why = "a production size, judged by the TPU compiler alone: it runs on v5e-8, not on {run}"
    columns = {
        run: [
            ("test_global_gradients_match", "passed", ""),
            ("test_at_a_production_size_each_chip_fits", "skipped", why.format(run=run)),
        ]
        for run in ("cpu-1", "cpu-8")
    }
    tests = [test_global_gradients_match, test_at_a_production_size_each_chip_fits]
    assert Checker(8)._report("global_gradients", tests, columns)
    said = capsys.readouterr().out
    notes = [line for line in said.splitlines() if line.startswith("  • ")]
    assert notes == [
        "  • at a production size each chip fits [cpu-1, cpu-8]: " + why.format(run="cpu-1 and cpu-8")
    ], said
