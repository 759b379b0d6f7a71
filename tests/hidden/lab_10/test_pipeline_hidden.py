"""Lab 10, hidden tests: other depths and microbatch counts, and the mistakes one stage cannot show.

With one stage, a ppermute in either direction is (0, 0), the last stage is the first, and the
pipeline delay is zero. With eight stages each of those mistakes changes the output; the tests
replay the schedule with the mistake in it to say which one happened. A "pipeline" that runs every
layer on every device is right everywhere; the compiled program shows every layer's weights whole
on each device. The all-reduce made of ppermutes is held to its budget from the compiled program:
collective-permutes only, and about two blocks sent from each device. Each budget is the public tests' own,
with their helpers (and words), on other inputs.
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_split_across,
    public_tests,
)

public = public_tests(__file__)  # the public tests' inputs and helpers
sequential, rolled, on = public.sequential, public.rolled, public.on

RNG = np.random.default_rng(100)
LONG = by_devices(RNG.normal(size=(64, 2)).astype(np.float32), shift=8.0)
# the layers grow with the pod (public.make_stack): a test replays the stack its run got, `on(DEEP, run)`
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
    n, long = run.device_count, LONG.on(run)
    # on two devices the previous device is the next one: both directions give the same blocks
    if n > 2 and close(got.value, rolled(long, n, step=-1)):
        raise Mismatch(
            f"every block moved to the previous device, not the next: ppermute's pairs are "
            f"(source, destination), so forward is (i, (i + 1) % {n}), not ((i + 1) % {n}, i)"
        )
    if n > 1 and close(got.value, long):
        raise Mismatch(
            "every block stayed where it was: nothing was sent. Is the mesh over all of "
            "jax.devices(), and does perm pair each device with the next one?"
        )
    expect_close(got, rolled(long, n))


@check(got=call("pipeline_forward", *DEEP))
def test_pipeline_with_fewer_microbatches_than_stages_equals_the_sequence(got, run):
    deep = on(DEEP, run)
    diagnose(got, deep, run.device_count)
    expect_close(
        got,
        sequential(*deep),
        rtol=1e-4,
        atol=1e-5,
        hint=f"{len(deep[0])} layers, 4 microbatches: each stage runs L / S consecutive layers",
    )


@check(got=call("pipeline_forward", *MANY))
def test_pipeline_sends_activations_forward_through_every_stage(got, run):
    many = on(MANY, run)
    diagnose(got, many, run.device_count)
    expect_close(
        got,
        sequential(*many),
        rtol=1e-4,
        atol=1e-5,
        hint="stage s must work on what stage s - 1 sent it, microbatch m leaving the last stage at "
        "step m + S - 1",
    )


@check(got=compiled_call("pipeline_forward", *MANY))
def test_pipeline_keeps_every_stage_busy_at_once(got, run):
    public.expect_stages_busy_at_once(got, run.device_count, len(MANY[2]))


@check(got=compiled_call("pipeline_forward", *DEEP))
def test_pipeline_keeps_the_layers_of_each_stage_on_its_own_device(got, run):
    public.expect_layers_on_their_stages(got, run.device_count, len(DEEP[0].on(run)))


# -- exercise 3: ring_sum, held to its budget ---------------------------------------------------

WIDE_RING = RNG.normal(size=(1024, 3)).astype(np.float32)
RING_CALL = compiled_call("ring_sum", WIDE_RING)


@check(not_judged_on=public.RING_PAST_ONE_MACHINE, got=RING_CALL)
def test_ring_sum_of_random_blocks(got, run):
    n = run.device_count
    expect_close_naming_mistakes(
        got, public.ring_total(WIDE_RING, n), public.ring_mistakes(WIDE_RING, n), rtol=1e-5, atol=1e-5
    )
    expect_split_across(got, n, axis=0)


@check(not_judged_on=public.RING_PAST_ONE_MACHINE, got=RING_CALL)
def test_ring_sum_is_made_of_collective_permutes_not_an_all_reduce(got, run):
    public.expect_only_permutes(got, run.device_count, "ring_sum")


@check(not_judged_on=public.RING_PAST_ONE_MACHINE, got=RING_CALL)
def test_ring_sum_sends_about_two_blocks_per_device(got, run):
    public.expect_about_two_blocks(got, run.device_count, WIDE_RING)


# -- stretch (not graded: points=0): ring_sum_both_ways ------------------------------------------

BOTH_WAYS = RNG.normal(size=(2048, 3)).astype(np.float32)


@check(
    points=0, not_judged_on=public.RING_PAST_ONE_MACHINE, got=compiled_call("ring_sum_both_ways", BOTH_WAYS)
)
def test_ring_sum_both_ways_sends_to_neighbours_and_loads_no_link_with_more_than_a_block(got, run):
    n = run.device_count
    expect_close(got, public.ring_total(BOTH_WAYS, n), rtol=1e-5, atol=1e-5)
    public.expect_neighbours_and_a_block_a_link(got, n, BOTH_WAYS)
