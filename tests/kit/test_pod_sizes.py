"""Every lab is right on every pod size the kit supports: 1, 2, 4, 8, 16 and 32 devices, and several hosts.

test_student_loop.py runs every reference on cpu-1, cpu-8 and one of cpu-2, cpu-4, cpu-16 and cpu-32
(`sizes_for`: in turn by lab number, so that every size is run by three or four labs) in one `python -m
labkit lab` call per lab; `make test SWEEP=full` runs here every lab on the three sizes left. Labs 5
and 11 run on cpu-4x2, four processes of two devices. Every input of every lab divides by
each count: no test fails, and no cell of the notebook (the worked examples, the "try it" cells)
raises. Lab 11 also runs with its devices listed in an order that interleaves the processes, as a
TPU pod's `jax.devices()` may list them: its global batch must keep its rows in order.
"""

from __future__ import annotations

import pytest
import sweep

from labkit.course import catalog, configs

POD_SIZES = [f"cpu-{n}" for n in configs.POD_SIZES if n not in (1, 8)]  # 1 and 8: test_student_loop.py


def sizes_for(number: int, full: bool = False) -> list[str]:
    """The pod size lab `number` runs on beside cpu-1 and cpu-8 in test_student_loop.py, in turn by lab number
    (so each size is run by three or four labs, a small and a large one for every two labs); `full`: all four;
    none where the sweeps are off (`sweep.NONE`)."""
    if full:
        return POD_SIZES
    return [] if sweep.NONE else [["cpu-2", "cpu-16", "cpu-4", "cpu-32"][number % 4]]


@pytest.mark.skipif(sweep.NONE, reason="the sweeps are off")
def test_the_sweep_runs_every_pod_size_on_some_lab():
    assert {size for lab in catalog.labs() for size in sizes_for(lab.number)} == set(POD_SIZES)


def all_passed(done, report, names) -> None:
    """Every test passed (or was skipped, as a production-size test off a TPU topology is), and each run in
    `names` ended well with no cell raising."""
    failed = {
        (o["config"], o["test"]): o.get("message")
        for o in report["outcomes"]
        if o["status"] not in ("passed", "skipped")
    }
    assert not failed, sorted(failed)
    for name in names:
        run = report["runs"][name]
        assert run["status"] == "ok" and not run.get("cell_errors"), (
            name,
            run.get("message"),
            run.get("cell_errors"),
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def passes_everywhere(kit, lab_report, lab, configs: list[str]):
    """Lab `lab`'s reference with its hidden tests on each of `configs`, in one `labkit lab` call: every test
    passes (or is skipped), no run ends badly, and each ran on its configuration's device count."""
    done = kit(
        "lab",
        str(lab.number),
        "--notebook",
        str(lab.reference),
        "--configs",
        ",".join(configs),
        "--hidden",
        "--timeout",
        "600",
        timeout=3000,
    )
    report = lab_report(lab.number)
    assert {o["config"] for o in report["outcomes"]} == set(configs)
    all_passed(done, report, configs)
    assert {report["runs"][n]["environment"]["device_count"] for n in configs} == {
        int(n.removeprefix("cpu-")) for n in configs
    }
    return done


@pytest.mark.skipif(not sweep.FULL, reason="make test runs one pod size a lab, in test_student_loop.py")
@pytest.mark.parametrize("lab", catalog.labs(), ids=lambda lab: lab.name)
def test_every_reference_passes_on_the_other_pod_sizes(kit, lab_report, lab):
    passes_everywhere(kit, lab_report, lab, [s for s in POD_SIZES if s not in sizes_for(lab.number)])


@pytest.mark.parametrize("number", [5, 11])
def test_labs_5_and_11_pass_on_four_processes_of_two_devices(kit, lab_report, number):
    lab = catalog.lab(number)
    done = kit(
        "lab",
        str(number),
        "--notebook",
        str(lab.reference),
        "--configs",
        "cpu-4x2",
        "--hidden",
        "--timeout",
        "600",
        timeout=1200,
    )
    report = lab_report(number)
    all_passed(done, report, ["cpu-4x2"])
    processes = report["runs"]["cpu-4x2"]["processes"]
    assert [p["environment"]["process_index"] for p in processes] == [0, 1, 2, 3]
    assert {p["environment"]["local_device_count"] for p in processes} == {2}


# ----------------------------------------------------------------------------------------
# Lab 11 with its devices in an order that interleaves the processes.
# ----------------------------------------------------------------------------------------

# Appended to the lab's setup cell: jax.devices() lists process 0's first device, then process 1's
# first, then process 0's second, ..., as a pod's device order may. The kit's harness puts back any
# attribute of `jax` a notebook replaces before it calls an exercise, so the order is changed where
# it comes from, in the code of jax.devices itself: everything that asks jax.devices() (the
# notebook, JAX's own helpers, the kit's placement of the tests' inputs) sees the interleaved order.
INTERLEAVE = """check = Checker(11)
from jax._src import xla_bridge as _xla_bridge

def _labkit_interleave(devices):
    processes = sorted({d.process_index for d in devices})
    per_process = [[d for d in devices if d.process_index == p] for p in processes]
    return [d for group in zip(*per_process) for d in group]

def _interleaved_devices(backend=None):
    return _labkit_interleave(get_backend(backend).devices())

_xla_bridge._labkit_interleave = _labkit_interleave
_xla_bridge.devices.__code__ = _interleaved_devices.__code__
print("device order:", [(d.process_index, d.id) for d in jax.devices()])"""
# The solution before: the mesh in jax.devices()'s order.
BY_LISTED_ORDER = (
    'mesh = Mesh(np.array(devices_by_process()), ("data",))\n    start, stop',
    'mesh = Mesh(np.array(jax.devices()), ("data",))\n    start, stop',
)


def test_interleaved_devices_keep_the_global_batch_in_order(kit, lab_outcomes, variant):
    # Only load_global_batch's tests: JAX 0.10.2's own multihost helpers (process_allgather of a
    # fully addressable array, host-local inputs to jit) build meshes from jax.devices() that assume
    # each process's devices come together, so the other exercises fail under this simulation
    # whatever the notebook does.
    notebook = variant(11, ("check = Checker(11)", INTERLEAVE), name="interleaved")
    kit("lab", "11", "--notebook", str(notebook), "--configs", "cpu-2x4", "--hidden", timeout=1200)
    outcomes = lab_outcomes(11)["cpu-2x4"]
    batch = {t: o for t, o in outcomes.items() if o.get("exercise") == "load_global_batch"}
    assert len(batch) >= 3, sorted(outcomes)
    failed = {t: o.get("message") for t, o in batch.items() if o["status"] != "passed"}
    assert not failed, failed


def test_a_mesh_in_listed_order_permutes_the_rows_and_the_test_says_why(kit, lab_outcomes, variant):
    notebook = variant(11, ("check = Checker(11)", INTERLEAVE), BY_LISTED_ORDER, name="listed-order")
    done = kit(
        "lab", "11", "--notebook", str(notebook), "--configs", "cpu-1,cpu-2x4", "--hidden", timeout=1200
    )
    assert done.returncode == 1
    by = lab_outcomes(11)
    assert {o["status"] for o in by["cpu-1"].values()} == {"passed"}  # one process: no order to get wrong
    batch = by["cpu-2x4"]["test_the_global_batch_has_the_shape_and_values_of_the_dataset"]
    assert batch["status"] == "failed" and "in another order" in batch["message"], batch
