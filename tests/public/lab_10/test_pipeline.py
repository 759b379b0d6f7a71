"""Lab 10, public tests: a ring step with ppermute, a pipeline with one stage per device, and an all-reduce
made of ppermutes.

The expected values are computed here in float64 numpy: the blocks rolled one device forward,
every microbatch run through every layer in sequence, and the sum of the blocks.
"""

import numpy as np

from labkit.checks import (
    FactUnavailable,
    Mismatch,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_fits_each_chip,
    expect_replicated,
    expect_split_across,
    placed,
    shaped,
)
from labkit.cost import format_bytes

# ---- the sequential computation the tests compare with -------------------------------------


def make_stack(seed, layers=32, d=4, microbatches=8, rows=2):  # 32 layers: L / S layers a stage, S = 1 to 32
    rng = np.random.default_rng(seed)
    weights = (rng.normal(size=(layers, d, d)) * 1.2 / np.sqrt(d)).astype(np.float32)
    biases = (0.3 * rng.normal(size=(layers, d))).astype(np.float32)
    inputs = rng.normal(size=(microbatches, rows, d)).astype(np.float32)
    return weights, biases, inputs


def run_layers(weights, biases, h):
    for w, b in zip(np.asarray(weights, np.float64), np.asarray(biases, np.float64)):
        h = np.tanh(h @ w + b)
    return h


def sequential(weights, biases, microbatches):
    return np.stack([run_layers(weights, biases, np.asarray(mb, np.float64)) for mb in microbatches])


def rolled(x, devices, step=1):
    """What device i holds moved to device i + step (around the ring)."""
    return np.roll(x, step * (len(x) // devices), axis=0)


X = np.arange(96, dtype=np.float32).reshape(32, 3)
WEIGHTS, BIASES, MICROBATCHES = make_stack(10)
NEXT = "Send with perm pairs (i, (i + 1) % n): (source, destination)"


@check(got=call("pass_to_next_stage", X))
def test_each_block_moves_to_the_next_device(got, run):
    expect_close(got, rolled(X, run.device_count), hint=NEXT)


@check(got=call("pass_to_next_stage", X))
def test_the_result_stays_split_across_every_device(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="Build the mesh from all of jax.devices(), with out_specs=P('stage')",
    )


@check(got=call("pass_to_next_stage", placed(X, ("stage",), axes=("stage",))))
def test_accepts_an_input_already_split_over_stages(got, run):
    expect_close(got, rolled(X, run.device_count), hint=NEXT)


@check(got=compiled_call("pipeline_forward", WEIGHTS, BIASES, MICROBATCHES))
def test_pipeline_equals_running_the_layers_in_sequence(got):
    expect_close(got, sequential(WEIGHTS, BIASES, MICROBATCHES), rtol=1e-4, atol=1e-5)


@check(got=call("pipeline_forward", WEIGHTS, BIASES, MICROBATCHES))
def test_every_device_holds_the_whole_output(got, run):
    expect_replicated(
        got,
        run.device_count,
        hint="Keep the last stage's outputs, psum them over 'stage' and return with out_specs=P()",
    )


@check(
    got=call(
        "pipeline_forward",
        placed(WEIGHTS, ("stage",), axes=("stage",)),
        placed(BIASES, ("stage",), axes=("stage",)),
        MICROBATCHES,
    )
)
def test_accepts_layers_already_placed_on_their_stages(got):
    expect_close(got, sequential(WEIGHTS, BIASES, MICROBATCHES), rtol=1e-4, atol=1e-5)


# ---- the schedule: how much each stage computes, read from the compiled program ----------------------

# Wide enough that the layers' products are nearly all of a stage's work (the selects and the hand-offs
# around them are a few percent): 32 layers of 64 x 64, 12 microbatches of 8 rows.
SCHEDULE = make_stack(12, layers=32, d=64, microbatches=12, rows=8)


def expect_each_stage_works_once_per_step(got, n: int, stack) -> None:
    """One device's FLOPs stay within its stage's work for the M + S - 1 steps of the pipeline's schedule (each
    step runs its L / S layers on one microbatch's rows), with a fifth more for the work around the products."""
    from labkit.checks import card_of

    weights, _biases, microbatches = stack
    m, layers, rows, d = len(microbatches), len(weights), microbatches.shape[1], weights.shape[1]
    per_step = 2 * rows * d * d * max(layers // max(n, 1), 1)  # one stage's layers on one microbatch
    steps = m + n - 1
    flops = card_of(got).flops
    if flops <= 1.2 * steps * per_step:
        return
    raise Mismatch(
        f"each stage computes {flops / per_step:.0f} steps' worth of its layers ({flops:.3g} FLOPs), where a "
        f"pipeline of {m} micro-batches on {n} stages needs {steps} ({m} + {n} - 1 steps of {per_step:.3g} FLOPs, "
        f"a fifth more passes). Every device computes every step of its program, used or not: a stage that "
        f"runs the whole batch, or every micro-batch at every step, repeats work the schedule does not need. "
        f"At step t, stage s works on micro-batch t - s only; the {n - 1} steps when some stages have nothing "
        f"yet are the pipeline's bubble, and the whole cost of splitting the layers"
    )


@check(got=compiled_call("pipeline_forward", *SCHEDULE))
def test_each_stage_computes_its_layers_once_per_step_of_the_schedule(got, run):
    expect_each_stage_works_once_per_step(got, run.device_count, SCHEDULE)


# ---- at a production size: the TPU compiler's program, on the compile-only TPU configurations alone

# 8 layers of 32768 x 32768 float32: 4 GiB a layer, 32 GiB in all, twice what one v5e chip has (15.75 GB
# usable); on 8 chips a stage holds one layer. 8 microbatches of 16 rows, 16 MiB.
PRODUCTION = {"layers": 8, "d": 32768, "microbatches": 8, "rows": 16}


def production_stack(layers, d, microbatches, rows):
    """The pipeline's inputs by their shapes alone, never made: the weights, the biases, the microbatches."""
    return shaped((layers, d, d)), shaped((layers, d)), shaped((microbatches, rows, d))


AT_PRODUCTION_SIZE = production_stack(**PRODUCTION)


def expect_each_chip_holds_its_stage(got, n: int, stack) -> None:
    """One chip's arguments, outputs and temporaries stay within twice its stage's share of the layers (the
    layers, and room for one copy of them as the stage runs: a stage run by lax.scan keeps one), and the
    microbatches and the outputs, twice over."""
    facts = got.compiled
    if facts is None or not hasattr(facts, "memory"):
        raise FactUnavailable(f"the compiled program could not be examined ({getattr(facts, 'why', facts)})")
    if not isinstance(facts.memory, dict):
        raise FactUnavailable(f"this check cannot be made here: {facts.memory.why}")
    weights, biases, microbatches = stack
    layers = weights.nbytes + biases.nbytes
    share, activations = layers / n, 4 * microbatches.nbytes
    limit = 2 * share + activations
    memory = facts.memory
    held = memory["argument"] + memory["output"] + memory["temp"] - memory.get("alias", 0)
    if held > limit:
        raise Mismatch(
            f"over the memory budget: one chip holds {format_bytes(held)} of arguments, outputs and "
            f"temporaries, where the limit is {format_bytes(limit)}: twice its stage's "
            f"{format_bytes(share)} of layers (1/{n} of the {format_bytes(layers)} stack, and room for one "
            f"copy as the stage runs) and {format_bytes(activations)} for the microbatches and the outputs. "
            f"A pipeline's chip holds its own stage's layers and no others: give the stacked weights and "
            f"biases in_specs=P('stage')"
        )


@check(got=compiled_call("pipeline_forward", *AT_PRODUCTION_SIZE))
def test_at_a_production_size_the_pipeline_fits_each_chip_holding_only_the_layers_of_its_stage(got, run):
    n = run.device_count
    layers, d = PRODUCTION["layers"], PRODUCTION["d"]
    expect_fits_each_chip(
        got,
        where=f"at a production size ({layers} layers of {d} x {d} float32, "
        f"{format_bytes(AT_PRODUCTION_SIZE[0].nbytes)} of weights; {PRODUCTION['microbatches']} "
        f"microbatches of {PRODUCTION['rows']} rows; on {n} chips)",
        what="pipeline",
        hint=f"No chip can hold the whole stack: each stage's chip must hold only its own "
        f"{layers // n if n else ''} layer(s), with in_specs=P('stage') for the weights and biases",
    )
    expect_each_chip_holds_its_stage(got, n, AT_PRODUCTION_SIZE)


# -- exercise 3: ring_sum, an all-reduce made of ppermutes ----------------------------------------

# 1024 rows: a block on each of 1 to 32 devices, and each block cuts into as many pieces as there are devices
RING = np.linspace(-2.0, 2.0, 1024 * 2, dtype=np.float32).reshape(1024, 2)


def ring_total(x, n: int, extra_step: bool = False):
    """Every device's block replaced by the sum of all n blocks (plus its own once more after an extra step)."""
    blocks = np.split(np.asarray(x, np.float64), n)
    total = np.tile(sum(blocks), (n, 1))
    return total + np.asarray(x, np.float64) if extra_step else total


def ring_mistakes(x, n: int) -> dict:
    return {
        f"each device's own block is counted twice: after {n - 1} step(s) every block has visited every device; "
        f"step {n} brings each block home again": ring_total(x, n, extra_step=True)
    }


@check(got=compiled_call("ring_sum", RING))  # compiled: the cost card shows the bytes each device sends
def test_ring_sum_gives_every_device_the_sum_of_all_blocks(got, run):
    n = run.device_count
    expect_close_naming_mistakes(got, ring_total(RING, n), ring_mistakes(RING, n), rtol=1e-5, atol=1e-5)


@check(got=call("ring_sum", RING))
def test_ring_sum_keeps_one_block_on_each_device(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="Return each device's total as its block, with out_specs=P('stage') on a mesh over "
        "all of jax.devices()",
    )


# -- stretch (not graded: points=0): ring_sum_both_ways ------------------------------------------

BOTH_WAYS = np.linspace(-1.0, 3.0, 2048 * 2, dtype=np.float32).reshape(
    2048, 2
)  # 2 n pieces a block, n up to 32


@check(points=0, got=call("ring_sum_both_ways", BOTH_WAYS))
def test_ring_sum_both_ways_gives_every_device_the_sum_of_all_blocks(got, run):
    expect_close(got, ring_total(BOTH_WAYS, run.device_count), rtol=1e-5, atol=1e-5)
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="Return each device's total as its block, with out_specs=P('stage')",
    )
