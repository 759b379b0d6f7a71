"""Lab 10, hidden tests: other depths and microbatch counts, and the mistakes one stage cannot show.

With one stage, a ppermute in either direction is (0, 0), the last stage is the first, and the
pipeline delay is zero. With eight stages each of those mistakes changes the output; the tests
replay the schedule with the mistake in it to say which one happened. A "pipeline" that runs every
layer on every device is right everywhere; the compiled program shows every layer's weights whole
on each device. The all-reduce made of ppermutes is held to its budget from the compiled program:
collective-permutes only, and about two blocks sent from each device.
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    call,
    check,
    collectives_of,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_collective,
    expect_input_split,
    expect_split_across,
    expect_steps_within,
    public_tests,
)
from labkit.checks import sent_per_device as bytes_sent_per_device
from labkit.cost import shape_bytes

public = public_tests(__file__)  # the public tests' inputs and helpers
sequential, rolled = public.sequential, public.rolled

RNG = np.random.default_rng(100)
LONG = RNG.normal(size=(64, 2)).astype(np.float32)
DEEP = public.make_stack(101, layers=32, d=6, microbatches=4, rows=8)  # fewer microbatches than 8 stages
MANY = public.make_stack(102, layers=32, d=4, microbatches=12, rows=1)


def close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-5)


def replay(weights, biases, microbatches, stages, step=1, delay=None):
    """The schedule of the lab, stage by stage in numpy: stage s receives from stage s - step (around the ring)
    and the last stage's output at step t is kept as microbatch t - delay."""
    delay = stages - 1 if delay is None else delay
    per = len(weights) // stages
    count = len(microbatches)
    mbs = np.asarray(microbatches, np.float64)
    received = [np.zeros_like(mbs[0]) for _ in range(stages)]
    outputs = np.zeros_like(mbs)
    for t in range(count + stages - 1):
        outs = []
        for s in range(stages):
            h = mbs[min(t, count - 1)] if s == 0 else received[s]
            outs.append(
                public.run_layers(weights[s * per : (s + 1) * per], biases[s * per : (s + 1) * per], h)
            )
        if 0 <= t - delay < count:
            outputs[t - delay] = outs[-1]
        received = [outs[(s - step) % stages] for s in range(stages)]
    return outputs


def diagnose(got, stack, n):
    _weights, _biases, _microbatches = stack
    if n == 1 or close(got.value, sequential(*stack)):
        return
    if close(got.value, replay(*stack, n, step=-1)):
        raise Mismatch(
            f"on {n} stages the activations travelled backwards: each stage sent its output to the "
            f"stage before it. ppermute's pairs are (source, destination); forward is "
            f"(i, (i + 1) % {n}), not ((i + 1) % {n}, i)"
        )
    if close(got.value, replay(*stack, n, delay=0)):
        raise Mismatch(
            f"on {n} stages microbatch m was taken from the last stage at step m, before it got "
            f"there: it leaves the last stage at step m + {n - 1} (m + S - 1)"
        )
    if close(got.value, np.zeros_like(got.value)):
        raise Mismatch(
            f"on {n} stages the output is all zeros, stage 0's empty buffer: only the last stage "
            f"holds the result. Keep its outputs, psum them over 'stage' (check_vma=False lets "
            f"out_specs=P() return stage 0's value without a word)"
        )


@check(got=call("pass_to_next_stage", LONG))
def test_blocks_move_to_the_next_stage_not_the_previous_one(got, run):
    n = run.device_count
    # on two devices the previous device is the next one: both directions give the same blocks
    if n > 2 and close(got.value, rolled(LONG, n, step=-1)):
        raise Mismatch(
            f"every block moved to the previous device, not the next: ppermute's pairs are "
            f"(source, destination), so forward is (i, (i + 1) % {n}), not ((i + 1) % {n}, i)"
        )
    if n > 1 and close(got.value, LONG):
        raise Mismatch(
            "every block stayed where it was: nothing was sent. Is the mesh over all of "
            "jax.devices(), and does perm pair each device with the next one?"
        )
    expect_close(got, rolled(LONG, n))


@check(got=call("pipeline_forward", *DEEP))
def test_pipeline_with_fewer_microbatches_than_stages_equals_the_sequence(got, run):
    diagnose(got, DEEP, run.device_count)
    expect_close(
        got,
        sequential(*DEEP),
        rtol=1e-4,
        atol=1e-5,
        hint="32 layers, 4 microbatches: each stage runs L / S consecutive layers",
    )


@check(got=call("pipeline_forward", *MANY))
def test_pipeline_sends_activations_forward_through_every_stage(got, run):
    diagnose(got, MANY, run.device_count)
    expect_close(
        got,
        sequential(*MANY),
        rtol=1e-4,
        atol=1e-5,
        hint="stage s must work on what stage s - 1 sent it, microbatch m leaving the last stage at "
        "step m + S - 1",
    )


@check(got=compiled_call("pipeline_forward", *MANY))
def test_pipeline_keeps_every_stage_busy_at_once(got, run):
    n, m = (
        run.device_count,
        len(MANY[2]),
    )  # the handout's count: M + S - 1 steps, and S - 1 more for the outputs
    expect_steps_within(
        got,
        m + 2 * (n - 1),
        n,
        what=f"a pipeline of {m} micro-batches on {n} stages, its "
        f"stages busy at once ({m} + {n} - 1 steps, and {n - 1} more "
        f"if the outputs go round the ring)",
        hint=f"One micro-batch at a time through the stages takes {m} x {n - 1} hand-offs, and "
        f"each stage idles while the others work. At step t, stage s works on micro-batch "
        f"t - s: every stage computes and every stage passes its result on, in the same step",
    )


@check(got=compiled_call("pipeline_forward", *DEEP))
def test_pipeline_keeps_the_layers_of_each_stage_on_its_own_device(got, run):
    n = run.device_count
    hint = (
        f"Every device holds every layer and runs them all: that is not a pipeline. Give the stacked weights "
        f"and biases in_specs=P('stage'), so that each of the {n} stages holds and runs its own "
        f"{len(DEEP[0]) // n if n else ''} layer(s), and pass the activations on with jax.lax.ppermute"
    )
    expect_input_split(got, 0, n, name="the weights", hint=hint)
    expect_input_split(got, 1, n, name="the biases", hint=hint)


# -- exercise 3: ring_sum, held to its budget ---------------------------------------------------

WIDE_RING = RNG.normal(size=(1024, 3)).astype(np.float32)
RING_CALL = compiled_call("ring_sum", WIDE_RING)
# The collectives ring_sum is built instead of, and the jax.lax call behind each.
LIBRARY = {
    "all-reduce": "psum",
    "reduce-scatter": "psum_scatter",
    "all-gather": "all_gather",
    "all-to-all": "all_to_all",
}


def permutes(got) -> list:
    return [c for c in collectives_of(got) if c.op == "collective-permute"]


def expect_only_permutes(got, n: int, what: str) -> None:
    for op, call_name in LIBRARY.items():
        found = [c for c in collectives_of(got) if c.op == op]
        if found:
            raise Mismatch(
                f"the compiled program has {len(found)} {op}(s): that is jax.lax.{call_name}'s collective. "
                f"{what} builds the sum from jax.lax.ppermute alone"
            )
    expect_collective(
        got, "collective-permute", n, hint="Pass the pieces around the ring with jax.lax.ppermute"
    )


def expect_all_steps_counted(sent: float, block: float, n: int) -> None:
    """No all-reduce of n devices sends less than 2(n-1)/n blocks from each: less means steps went uncounted."""
    floor = 2 * (n - 1) / n
    if sent < 0.99 * floor * block:
        raise Mismatch(
            f"the compiled program sends {sent / block:.2f} block(s) from each device, fewer than any "
            f"all-reduce of {n} devices can ({floor:.2f}): some of its sends were not counted. Write the "
            "steps as a Python for loop, so that each one is in the program and can be counted"
        )


@check(got=RING_CALL)
def test_ring_sum_of_random_blocks(got, run):
    n = run.device_count
    expect_close_naming_mistakes(
        got, public.ring_total(WIDE_RING, n), public.ring_mistakes(WIDE_RING, n), rtol=1e-5, atol=1e-5
    )
    expect_split_across(got, n, axis=0)


@check(got=RING_CALL)
def test_ring_sum_is_made_of_collective_permutes_not_an_all_reduce(got, run):
    expect_only_permutes(got, run.device_count, "ring_sum")


@check(got=RING_CALL)
def test_ring_sum_sends_about_two_blocks_per_device(got, run):
    n = run.device_count
    if n == 1:
        return  # nothing to send
    block = WIDE_RING.nbytes / n
    sent = bytes_sent_per_device(got)
    expect_all_steps_counted(sent, block, n)
    if sent > 2.2 * block:
        raise Mismatch(
            f"each device sends {sent / block:.2f} blocks ({sent / 1024:.0f} KiB, a block being "
            f"{block / 1024:.0f} KiB), where the budget is about 2 on any number of devices; passing whole "
            f"blocks around the ring sends n - 1 = {n - 1}. Cut each block into {n} pieces: can every "
            "device finish the sum of one piece, then hand the finished pieces on?"
        )


# -- stretch (not graded: points=0): ring_sum_both_ways ------------------------------------------

BOTH_WAYS = RNG.normal(size=(2048, 3)).astype(np.float32)


@check(points=0, got=compiled_call("ring_sum_both_ways", BOTH_WAYS))
def test_ring_sum_both_ways_sends_to_neighbours_and_loads_no_link_with_more_than_a_block(got, run):
    n = run.device_count
    expect_close(got, public.ring_total(BOTH_WAYS, n), rtol=1e-5, atol=1e-5)
    expect_only_permutes(got, n, "ring_sum_both_ways")
    if n == 1:
        return
    block = BOTH_WAYS.nbytes / n
    expect_all_steps_counted(sum(shape_bytes(c.shape) for c in permutes(got)), block, n)
    links: dict[tuple[int, int], float] = {}
    for c in permutes(got):
        for a, b in c.pairs:
            if a != b and (b - a) % n not in (1, n - 1):
                raise Mismatch(
                    f"device {a} sends to device {b}, which is not its neighbour on the ring: every "
                    "send goes to device i + 1 or i - 1 (around the ring)"
                )
            links[a, b] = links.get((a, b), 0.0) + shape_bytes(c.shape)
    (a, b), busiest = max(links.items(), key=lambda item: item[1])
    if busiest > 1.1 * block:
        raise Mismatch(
            f"the link from device {a} to device {b} carries {busiest / block:.2f} blocks, where the "
            "budget is about one in each direction: send half of every block forward and half backward"
        )
