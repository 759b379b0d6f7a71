"""How one notebook run is carried out: papermill in the kit's process, the student's kernel in its sandbox.

These tests call `execute.run_notebook` directly, on lab 3's reference with one extra cell, and
look at what the run leaves: its record, its executed notebook, its scratch folder.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from notebook_variants import with_cell

from labkit.course import catalog
from labkit.course.configs import CONFIGS
from labkit.judge import judge
from labkit.run import allowance, execute, modes, runreport

LAB = catalog.Lab(3)
SMALL = allowance.Limits(output=2 * allowance.MiB)


@pytest.fixture(scope="module")
def calls() -> list[dict]:
    return judge.collect_calls(LAB.test_dirs(hidden=True))


def outputs_of(workdir: Path) -> str:
    nb = json.loads((workdir / "executed.ipynb").read_text())
    return "".join(json.dumps(c.get("outputs", [])) for c in nb["cells"] if c["cell_type"] == "code")


def test_a_run_returns_the_signed_results_of_every_call(tmp_path, calls):
    record = execute.run_notebook(LAB.reference, CONFIGS["cpu-8"], calls, tmp_path / "run")
    assert record.status == "ok", record.message
    assert set(record.results) == {c["id"] for c in calls}
    assert record.environment["device_count"] == 8


def test_the_scratch_folder_keeps_no_key_socket_or_connection_file_after_the_run(tmp_path, calls):
    record = execute.run_notebook(LAB.reference, CONFIGS["cpu-1"], calls, tmp_path / "run")
    assert record.status == "ok", record.message
    left = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert not [n for n in left if n.startswith((".labkit-key", "kernel"))], left


def test_two_runs_at_once_in_one_process_each_get_their_own_results(tmp_path, calls):
    records = {}

    def run(name):
        records[name] = execute.run_notebook(LAB.reference, CONFIGS[name], calls, tmp_path / name)

    threads = [threading.Thread(target=run, args=(name,)) for name in ("cpu-1", "cpu-8")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {n: r.status for n, r in records.items()} == {"cpu-1": "ok", "cpu-8": "ok"}
    assert records["cpu-1"].environment["device_count"] == 1
    assert records["cpu-8"].environment["device_count"] == 8


def test_a_flood_of_prints_keeps_the_start_and_marks_the_cut(tmp_path, calls):
    flood = with_cell("for _ in range(40):\n    print('x' * (1 << 20))", tmp_path / "flood.ipynb")
    record = execute.run_notebook(flood, CONFIGS["cpu-1"], calls, tmp_path / "run", limits=SMALL)
    assert record.status == "ok", record.message  # the run goes on: the exercises are still called
    kept = outputs_of(tmp_path / "run")
    assert "output cut here" in kept
    assert 1 << 20 < len(kept) < SMALL.output + 200_000  # the start is kept, not the 40 MiB


def test_one_output_larger_than_the_kit_accepts_ends_the_run_with_a_clear_message(tmp_path, calls):
    size = allowance.largest_message(SMALL) + (8 << 20)
    huge = with_cell(
        f"from IPython.display import display\ndisplay({{'text/plain': 'y' * {size}}}, raw=True)",
        tmp_path / "huge.ipynb",
    )
    record = execute.run_notebook(huge, CONFIGS["cpu-1"], calls, tmp_path / "run", limits=SMALL)
    assert record.status == "error"
    assert "a single output larger than 64 MiB is refused" in record.message, record.message
    assert (tmp_path / "run" / "executed.ipynb").stat().st_size < SMALL.output


def test_an_output_above_the_allowance_but_within_what_is_accepted_is_dropped_and_the_run_goes_on(
    tmp_path, calls
):
    big = with_cell(
        "from IPython.display import display\ndisplay({'text/plain': 'y' * (8 << 20)}, raw=True)",
        tmp_path / "big.ipynb",
    )
    record = execute.run_notebook(big, CONFIGS["cpu-1"], calls, tmp_path / "run", limits=SMALL)
    assert record.status == "ok", record.message
    assert "output cut here" in outputs_of(tmp_path / "run")
    assert (tmp_path / "run" / "executed.ipynb").stat().st_size < SMALL.output


@pytest.mark.skipif(modes.bubblewrap()[0] is None, reason="bubblewrap cannot make a sandbox on this machine")
def test_the_kernel_runs_in_the_sandbox_and_papermill_does_not(tmp_path, calls):
    # The process tree a cell can see: the kernel and what the sandbox put around it, never papermill.
    probe = with_cell(
        "import pathlib\n"
        "seen = sorted({p.read_text().replace(chr(0), ' ') for p in pathlib.Path('/proc').glob('[0-9]*/cmdline')})\n"
        "pathlib.Path('seen.json').write_text(__import__('json').dumps(seen))",
        tmp_path / "probe.ipynb",
    )
    record = execute.run_notebook(probe, CONFIGS["cpu-1"], calls, tmp_path / "run", keep_scratch=True)
    assert record.status == "ok", record.message
    seen = json.loads((tmp_path / "run" / "scratch" / "seen.json").read_text())
    assert any("ipykernel_launcher" in c for c in seen), seen
    others = [
        c
        for c in seen
        if c.strip() and not c.startswith(("bwrap ", "/usr/bin/bwrap ")) and "ipykernel_launcher" not in c
    ]
    assert others == [], others  # nothing else: no papermill, no grading process, no test runner


def test_the_errors_of_an_executed_notebook_are_read_as_data_that_may_be_anything():
    """Papermill's copy and a pod's notebook are read by one function, which takes nothing on trust."""
    raised = {
        "cell_type": "code",
        "metadata": {"labkit_cell": 2, "papermill": {"start_time": "t"}},
        "source": ["y = 1 / 0\n", "z = 2"],
        "outputs": [
            {"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero\nmore"}
        ],
    }
    odd = [
        {"cell_type": "code", "metadata": {"labkit_cell": True}, "outputs": [{"output_type": "error"}]},
        {"cell_type": "code", "metadata": "no", "outputs": 5},
        "not a cell",
        {"cell_type": "code"},
        {"cell_type": "code", "metadata": {"labkit_cell": 3}, "source": [1, 2], "outputs": [7, None]},
    ]
    errors, last = runreport.cell_errors_of({"cells": [*odd, raised]})
    assert errors == [
        {"cell": 2, "type": "ZeroDivisionError", "message": "division by zero more", "code": "y = 1 / 0"}
    ]
    assert last == 2
    assert runreport.cell_errors_of([1, 2]) == ([], None)
    assert runreport.cell_errors_of({"cells": [raised] * 500})[0] == errors * 100
