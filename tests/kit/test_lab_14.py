"""Lab 14 end to end, the capstone: several designs of one training step pass, whichever plan they chose;
designs over a budget are named by it on eight devices and pass on one; the class leaderboard ranks the
designs that pass in the order of the cost model; a design that copies everything is refused by the memory
budget, though its card, which sends nothing, models faster than FSDP's.

One grading run of a class whose students each hand in the reference with its design replaced judges
every design on cpu-1 and cpu-8 at once (one warm judge for all of them).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from notebook_variants import CAPSTONE_FSDP, CAPSTONE_SPECS, reference_code, with_code

from labkit import checks, cost
from labkit.course import catalog
from labkit.grading.classwide import leaderboard

ROOT = catalog.ROOT
LAB = catalog.lab(14)

# The reference's design: the batch over 'data', the heads and hidden units over 'model'.
SPECS = CAPSTONE_SPECS
PLACES = "place((state, state, batch, batch)),\n                   out_shardings=place((state, state, P())))"
JIT = "return jax.jit(sgd_step, "

# FSDP: every weight and its momentum in n pieces over the whole grid, the batch too.
FSDP = [CAPSTONE_FSDP]
# The weights as the reference splits them, the momentum split further, over every device (optimizer-state
# sharding), left to the compiler: XLA:CPU follows the momentum's placement back into the backward pass and
# computes the step on both rows of the grid, twice a device's share of the work.
MOMENTUM_SPLIT_FURTHER_UNSAID = [
    (
        PLACES,
        (
            "place((state, moments, batch, batch)),\n"
            "                   out_shardings=place((state, moments, P())))"
        ),
    ),
    (SPECS, SPECS + '    moments = {name: P(("data", "model")) for name in WEIGHTS}\n'),
]
# The same with the gradient kept as the weights are split (a sharding constraint): a share of the work.
MOMENTUM_SPLIT_FURTHER = MOMENTUM_SPLIT_FURTHER_UNSAID + [
    (
        JIT,
        (
            "def zero_step(params, momentum, x, y):  # the gradient kept as the weights are split\n"
            "        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)\n"
            "        grads = jax.lax.with_sharding_constraint(grads, place(state))\n"
            "        momentum = jax.tree.map(lambda m, g: MOMENTUM * m + g, momentum, grads)\n"
            "        params = jax.tree.map(lambda p, m: p - LEARNING_RATE * m, params, momentum)\n"
            "        return params, momentum, loss\n\n"
            "    return jax.jit(zero_step, "
        ),
    )
]
# Everything whole on every device: it sends nothing.
REPLICATED = [(SPECS, "    state = {name: P() for name in WEIGHTS}\n    batch = P()\n")]
# FSDP whose gradient comes from four micro-batches, each one's gradient averaged across devices on its own:
# right, and four times the traffic of the gradient.
MICRO_BATCHES = FSDP + [
    (
        JIT,
        (
            "def micro_batched_step(params, momentum, x, y):\n"
            "        parts = [jax.value_and_grad(loss_fn)(params, x[i::4], y[i::4]) for i in range(4)]\n"
            "        grads = jax.tree.map(lambda *g: sum(g) / 4, *[g for _, g in parts])\n"
            "        momentum = jax.tree.map(lambda m, g: MOMENTUM * m + g, momentum, grads)\n"
            "        params = jax.tree.map(lambda p, m: p - LEARNING_RATE * m, params, momentum)\n"
            "        return params, momentum, sum(loss for loss, _ in parts) / 4\n\n"
            "    return jax.jit(micro_batched_step, "
        ),
    )
]
# The state split over every device, but each device gathers the weights and computes the whole batch, keeping its
# own piece of the result: within both budgets, and every device does all the work.
WHOLE_BATCH_EVERYWHERE = FSDP + [
    (
        JIT,
        (
            "def whole_batch_everywhere(mesh):\n"
            '        every = ("data", "model")\n'
            "        n, split = mesh.size, P(every)\n\n"
            "        def per_device(p, m, x, y):\n"
            "            gather = functools.partial(jax.lax.all_gather, axis_name=every, axis=0, tiled=True)\n"
            "            p, m, loss = sgd_step(jax.tree.map(gather, p), jax.tree.map(gather, m), x, y)\n"
            "            i = jax.lax.axis_index(every)\n"
            "            mine = lambda a: jax.lax.dynamic_slice_in_dim(a, i * (len(a) // n), len(a) // n)\n"
            "            return jax.tree.map(mine, p), jax.tree.map(mine, m), loss\n\n"
            "        return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(split, split, P(), P()),\n"
            "                                     out_specs=(split, split, P()), check_vma=False))\n\n"
            "    return whole_batch_everywhere(mesh)\n"
            "    return jax.jit(sgd_step, "
        ),
    )
]

# The reference's state, the batch whole on each row of the grid: the two rows of 'data' compute the same thing.
# Within the memory and communication budgets (it sends less than the reference), and twice a device's share of
# the work: the public work budget, a little over a share, names it; the hidden one (three times) does not.
HALF_THE_GRID_REPEATS = [(SPECS, SPECS.replace('batch = P("data")', "batch = P()"))]

DESIGNS = {
    "data-x-model": [],
    "fsdp": FSDP,
    "momentum-split-further": MOMENTUM_SPLIT_FURTHER,
    "replicated": REPLICATED,
    "micro-batches": MICRO_BATCHES,
    "whole-batch-everywhere": WHOLE_BATCH_EVERYWHERE,
    "half-the-grid-repeats": HALF_THE_GRID_REPEATS,
    "momentum-split-unsaid": MOMENTUM_SPLIT_FURTHER_UNSAID,
}
VALID = ("data-x-model", "fsdp", "momentum-split-further")  # data-x-model: the reference itself
MEMORY = "test_each_device_keeps_within_the_memory_budget"
COMMUNICATION = "test_each_device_sends_within_the_communication_budget"
WORK = "test_each_device_does_its_share_of_the_work"
PUBLIC_WORK = "test_each_device_computes_its_share_of_the_step"  # the work budget in the student's own loop
PUBLIC_MEMORY = "test_train_step_keeps_within_the_memory_budget"  # the handout's budgets, on the public batch
PUBLIC_COMMUNICATION = "test_train_step_sends_within_the_communication_budget"


def design(replacements) -> str:
    return json.dumps(with_code(json.loads(LAB.reference.read_text()), *replacements))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded on cpu-1 and cpu-8: scoreboard.json, and each student's rows by configuration."""
    root = tmp_path_factory.mktemp("lab14")
    for student, replacements in DESIGNS.items():
        assert all(old in reference_code(14) for old, _ in replacements), (
            f"{student}: a replacement finds nothing"
        )
        (root / "submissions" / student).mkdir(parents=True)
        (root / "submissions" / student / "lab-14.ipynb").write_text(design(replacements))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(root / "submissions"),
            "--out",
            str(root / "out"),
            "--labs",
            "14",
            "--configs",
            "cpu-1,cpu-8",
            "--jobs",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((root / "out" / "scoreboard.json").read_text())
    rows = {(r["student"], r["config"]): r for r in results["rows"]}
    return results, rows


PRODUCTION = "test_at_a_production_size_the_step_fits_each_chip_and_keeps_the_memory_budget"


def failed(row: dict) -> dict[str, dict]:
    """The tests that did not pass, but the one at a production size, which runs only on a TPU topology."""
    at_size = next(t for t in row["tests"] if t["test"] == PRODUCTION)
    assert at_size["status"] == "skipped" and checks.PRODUCTION_SIZE_SKIP in at_size["message"], at_size
    return {t["test"]: t for t in row["tests"] if t["status"] != "passed" and t["test"] != PRODUCTION}


def test_the_reference_passes_every_test_on_one_device_and_on_eight(graded):
    _, rows = graded
    for config in ("cpu-1", "cpu-8"):
        row = rows[("data-x-model", config)]
        assert row["status"] == "ok" and not failed(row) and len(row["tests"]) == 10, (config, failed(row))


@pytest.mark.parametrize("student", VALID[1:])
def test_another_valid_design_passes_every_test_on_one_device_and_on_eight(graded, student):
    _, rows = graded
    for config in ("cpu-1", "cpu-8"):
        row = rows[(student, config)]
        assert row["status"] == "ok" and not failed(row) and len(row["tests"]) == 10, (config, failed(row))


def test_the_valid_designs_differ_in_what_they_send(graded):
    _, rows = graded
    sent = {s: cost.from_json(rows[(s, "cpu-8")]["costs"]).popitem()[1].runs["cpu-8"].sent for s in VALID}
    assert sent["data-x-model"].keys() == {"all-reduce"}
    assert "all-gather" in sent["fsdp"] and "all-gather" in sent["momentum-split-further"]
    assert len({round(sum(s.values())) for s in sent.values()}) == 3, sent


def test_a_replicated_design_passes_on_one_device_and_is_refused_by_the_memory_budget_on_eight(graded):
    _, rows = graded
    assert rows[("replicated", "cpu-1")]["status"] == "ok"
    over = failed(rows[("replicated", "cpu-8")])
    assert set(over) == {MEMORY, PUBLIC_MEMORY, WORK, PUBLIC_WORK}, over  # a student's own check names both
    assert not over[PUBLIC_MEMORY]["hidden"] and "over the memory budget" in over[PUBLIC_MEMORY]["message"]
    message = over[MEMORY]["message"]
    assert over[MEMORY]["hidden"] and "over the memory budget" in message, message
    assert (
        "each device keeps 384.0 KiB" in message and "the budget is 96.0 KiB, 2/8 of the 384.0 KiB" in message
    )
    assert "every device holds all of params['w1']" in message


def test_micro_batches_averaged_one_by_one_pass_on_one_device_and_break_the_communication_budget_on_eight(
    graded,
):
    _, rows = graded
    assert rows[("micro-batches", "cpu-1")]["status"] == "ok"
    over = failed(rows[("micro-batches", "cpu-8")])
    assert set(over) == {COMMUNICATION, PUBLIC_COMMUNICATION}, over
    assert not over[PUBLIC_COMMUNICATION]["hidden"]
    message = over[COMMUNICATION]["message"]
    assert over[COMMUNICATION]["hidden"] and "over the communication budget" in message, message
    assert "the budget is 672.0 KiB, 4 (8-1)/8 of the 192.0 KiB of the parameters" in message, message
    assert "the program runs" in message and "all-reduce" in message, message


def test_the_leaderboard_ranks_the_valid_designs_in_the_order_of_the_cost_model(graded):
    results, rows = graded
    (board,) = [b for b in results["leaderboards"] if b["lab"] == 14]
    spec = catalog.LEADERBOARDS[14]
    modelled = {
        s: leaderboard.step_time(rows[(s, "cpu-8")]["costs"], leaderboard.ranked_on(spec)) for s in DESIGNS
    }
    assert [p["name"] for p in board["places"]] == sorted(VALID, key=modelled.get)
    assert [p["seconds"] for p in board["places"]] == sorted(modelled[s] for s in VALID)
    # the replicated design, which sends nothing, models faster than FSDP, and is not ranked: it is over budget
    assert modelled["replicated"] < modelled["fsdp"]
    assert board["reference"]["seconds"] == pytest.approx(modelled["data-x-model"], rel=0.05)


def test_weights_gathered_and_the_whole_batch_everywhere_pass_on_one_device_and_are_named_by_their_flops(
    graded,
):
    results, rows = graded
    assert rows[("whole-batch-everywhere", "cpu-1")]["status"] == "ok"
    over = failed(rows[("whole-batch-everywhere", "cpu-8")])
    assert set(over) == {WORK, PUBLIC_WORK}, over
    assert not over[PUBLIC_WORK]["hidden"]
    message = over[WORK]["message"]
    assert over[WORK]["hidden"] and "FLOPs" in message and "the one-device step" in message, message
    (board,) = [b for b in results["leaderboards"] if b["lab"] == 14]
    assert "whole-batch-everywhere" not in [p["name"] for p in board["places"]]


@pytest.mark.parametrize("student", ["half-the-grid-repeats", "momentum-split-unsaid"])
def test_half_the_grid_repeating_the_other_half_passes_on_one_device_and_is_named_by_the_public_work_budget(
    graded, student
):
    results, rows = graded
    assert rows[(student, "cpu-1")]["status"] == "ok"
    over = failed(rows[(student, "cpu-8")])
    assert set(over) == {PUBLIC_WORK}, over
    message = over[PUBLIC_WORK]["message"]
    assert not over[PUBLIC_WORK]["hidden"] and "devices repeat each other's work" in message, message
    assert "at most 1.3 times that" in message, message
    (board,) = [b for b in results["leaderboards"] if b["lab"] == 14]
    assert student not in [p["name"] for p in board["places"]]


def test_the_whole_batch_on_every_device_fails_the_students_own_make_lab_14_with_the_work_budgets_figure(
    kit, lab_outcomes, variant
):
    """The state split, the whole batch on every device: within the memory and communication budgets, right on
    cpu-8, and the student's own loop (public tests alone, no hidden ones) fails it with the work budget's
    figure, the limit and what it counts, in the words grading's hidden work test uses."""
    done = kit("lab", "14", "--notebook", str(variant(14, *WHOLE_BATCH_EVERYWHERE)), "--configs", "cpu-8")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    failed = {t: o for t, o in lab_outcomes(14)["cpu-8"].items() if o["status"] not in ("passed", "skipped")}
    assert set(failed) == {PUBLIC_WORK}, failed
    message = failed[PUBLIC_WORK]["message"]
    assert not failed[PUBLIC_WORK]["hidden"], failed
    assert (
        "one device does" in message and "FLOPs" in message and "that the one-device step needs" in message
    ), message
    assert "where its 1/8 share is" in message and "at most 1.3 times that" in message, message
    assert "FAIL" in done.stdout and "one device does" in done.stdout, done.stdout[-3000:]
