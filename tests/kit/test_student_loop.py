"""`make lab-N` end to end: real papermill, real kernels, real JAX on one and on eight CPU devices.

Each reference runs here on cpu-1, cpu-8 and one more pod size in the same `labkit lab` call (the sizes
are test_pod_sizes.py's: each lab one of cpu-2, cpu-4, cpu-16 and cpu-32 in turn, every size by three or
four labs), so that one start of the kit, of its test collection and of its warm server serves all three.
"""

import sys

import pytest
import sweep
from test_pod_sizes import passes_everywhere, sizes_for

from labkit.course import catalog

WORKED_EXAMPLES = {"shard_map_simulate"}


@pytest.mark.parametrize("lab", catalog.labs(), ids=lambda lab: lab.name)
def test_every_reference_passes_its_public_and_hidden_tests_on_cpu_1_cpu_8_and_a_pod_size(
    kit, lab_report, lab
):
    # on the lock's other JAX (`sweep.NONE`) on cpu-8 alone, where its checks read shardings and compiled programs;
    # the tests below still run cpu-1 there
    configs = ["cpu-8"] if sweep.NONE else ["cpu-1", "cpu-8", *sizes_for(lab.number)]
    done = passes_everywhere(kit, lab_report, lab, configs)
    assert "PASS" in done.stdout
    # its cost cards on cpu-8 are those recorded for it (tests/public/lab_N/reference_costs.json): none differs
    if lab.number >= 2 and lab.number != 11:
        cards = done.stdout[done.stdout.index("Cost cards") :]
        assert "on cpu-8 (8 devices)" in cards
        notes = [
            n for n in cards.splitlines() if "that the reference needs" in n or "reference sends nothing" in n
        ]
        if sys.version_info < (3, 12):
            # the cards are recorded on the lock's JAX for Python 3.12+ (0.12); on the other JAX, XLA:CPU's buffer
            # assignment gives other temporaries (lab 9's fsdp_layer_by_layer: 1.7x). What is sent and computed
            # must still be the reference's.
            notes = [n for n in notes if "the bytes each device holds" not in n]
        assert notes == [], cards


@pytest.mark.parametrize("lab", catalog.labs(), ids=lambda lab: lab.name)
def test_every_unmodified_student_notebook_fails_cleanly_as_not_implemented(kit, lab_report, lab):
    done = kit("lab", str(lab.number), "--configs", "cpu-8")  # the kit's path is the same on cpu-1
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-6000:]
    assert "not implemented yet" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    report = lab_report(lab.number)
    # A worked example (its code given, its tests worth no points, as lab 6's shard_map_simulate) may pass.
    graded = [o for o in report["outcomes"] if o["exercise"] not in WORKED_EXAMPLES]
    assert graded and {o["status"] for o in graded} - {"skipped"} == {"todo"}


def test_a_mesh_over_one_device_passes_on_cpu_1_and_fails_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(
        3,
        (
            'Mesh(np.array(jax.devices()), ("data",))\n    double',
            'Mesh(np.array(jax.devices()[:1]), ("data",))\n    double',
        ),
    )
    done = kit("lab", "3", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8")
    assert done.returncode == 1
    by_config = lab_outcomes(3)
    assert all(o["status"] == "passed" for o in by_config["cpu-1"].values())
    split = by_config["cpu-8"]["test_result_is_split_across_every_device"]
    assert split["status"] == "failed"
    assert "all 8 devices" in split["message"] and "jax.devices()[:1]" in split["message"]
    assert by_config["cpu-8"]["test_doubles_every_element"]["status"] == "passed"


def test_the_table_shows_each_test_on_each_configuration(kit):
    done = kit("lab", "3", "--notebook", str(catalog.lab(3).reference), "--configs", "cpu-1,cpu-8,tpu")
    header = next(line for line in done.stdout.splitlines() if "exercise" in line)
    assert "cpu-1" in header and "cpu-8" in header and "tpu" in header
    assert "tpu skipped (no TPU" in done.stdout
    assert done.returncode == 0


def test_an_unknown_lab_lists_the_labs_that_exist(kit):
    done = kit("lab", "99")
    assert done.returncode == 2
    assert "no lab '99'" in done.stderr and "3" in done.stderr


def test_an_unknown_configuration_is_refused(kit):
    done = kit("lab", "3", "--configs", "gpu-8")
    assert done.returncode == 2 and "gpu-8" in done.stderr


def test_a_notebook_that_is_not_json_is_named_and_left_untouched(kit, tmp_path):
    broken = tmp_path / "lab-3.ipynb"
    broken.write_text('{"cells": [')
    done = kit("lab", "3", "--notebook", str(broken), "--configs", "cpu-1")
    assert done.returncode == 1
    assert str(broken) in done.stdout.replace("\n", "") and "not valid notebook JSON" in done.stdout
    assert broken.read_text() == '{"cells": ['


def test_a_cell_that_never_ends_is_stopped_and_reported_as_a_timeout(kit, variant):
    hang = variant(3, ("# Try it.", "import time\nwhile True:\n    time.sleep(1)\n# Try it."))
    done = kit("lab", "3", "--notebook", str(hang), "--configs", "cpu-1", "--timeout", "20")
    assert done.returncode == 1
    assert "timeout" in done.stdout and "did not finish within 20 s" in done.stdout


def test_the_students_notebook_is_never_written(kit, variant):
    nb = variant(3)
    before = nb.read_bytes()
    kit("lab", "3", "--notebook", str(nb), "--configs", "cpu-1")
    assert nb.read_bytes() == before


def test_a_stray_cell_that_raises_does_not_stop_grading_of_the_exercises(kit, lab_report, variant):
    stray = variant(3, ("# Try it.", "raise RuntimeError('leftover experiment')\n# Try it."))
    done = kit("lab", "3", "--notebook", str(stray), "--configs", "cpu-1")
    assert "RuntimeError: leftover experiment" in done.stdout
    outcomes = lab_report(3)["outcomes"]
    assert {o["status"] for o in outcomes} == {"passed"}


def test_a_test_only_the_tpu_compiler_judges_is_named_with_the_command_that_judges_it(monkeypatch):
    from labkit import checks
    from labkit.course import configs
    from labkit.judge.judge import Outcome
    from labkit.machine import accelerators
    from labkit.student import loop

    why = f"{checks.PRODUCTION_SIZE_SKIP}: it runs on the compile-only TPU configurations, not on cpu-8"
    outcomes = [
        Outcome("test_at_a_production_size_the_step_fits", "train_step", "cpu-8", "cpu-8", "skipped", why),
        Outcome("test_train_step_keeps_its_shape", "train_step", "cpu-8", "cpu-8", "passed"),
        Outcome("test_tpu_only", "train_step", "tpu", "tpu", "skipped", "no TPU on this machine"),
    ]
    cpu = configs.parse("cpu-1,cpu-8")
    monkeypatch.setattr(accelerators, "libtpu_available", lambda: (False, "not installed"))
    (line,) = loop.not_judged_here(14, cpu, outcomes)
    assert "1 test(s) only the TPU compiler judges ('at a production size the step fits')" in line, line
    assert "`make lab-14 CONFIGS=cpu-8,v5e-8` judges it" in line and "`make setup EXTRAS=tpu`" in line, line
    monkeypatch.setattr(accelerators, "libtpu_available", lambda: (True, ""))
    assert "make setup" not in loop.not_judged_here(14, cpu, outcomes)[0]
    # judged where a compile-only TPU configuration ran; nothing to say where no such test was skipped
    assert loop.not_judged_here(14, configs.parse("cpu-8,v5e-8"), outcomes) == []
    assert loop.not_judged_here(14, cpu, outcomes[1:]) == []
