"""Lab 10 end to end: a ppermute that sends backwards is right with one stage only; a pipeline that is none is
right everywhere, named by its compiled program, and at a production size refused by the TPU compiler;
ring_sum is held to its budget, whatever its design. Each budget the hidden tests hold is held by a public
test too, with the same words: a design over one fails the student's own `make lab-10` (public tests alone)."""

import json

import pytest
from notebook_variants import failed_on_cpu_8, failures_by_config, not_passed
from test_tpu_references import HAS_LIBTPU, on_v5e_8

from labkit.course import catalog

PRODUCTION = "test_at_a_production_size_the_pipeline_fits_each_chip_holding_only_the_layers_of_its_stage"
# The pipeline's budgets in the student's own loop (public tests) and in grading's hidden tests.
WORK = "test_each_stage_computes_its_layers_once_per_step_of_the_schedule"
# (the hidden twin of HAND_OFFS is test_pipeline_keeps_every_stage_busy_at_once, named where it is read)
HAND_OFFS = "test_the_stages_hand_on_their_activations_about_once_per_step"
LAYERS, HIDDEN_LAYERS = (
    "test_each_stage_holds_only_the_layers_of_its_own_stage",
    "test_pipeline_keeps_the_layers_of_each_stage_on_its_own_device",
)


def test_a_ppermute_in_the_wrong_direction_passes_on_cpu_1_and_fails_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(
        10,
        ("forward = [(i, (i + 1) % n) for i in range(n)]", "forward = [((i + 1) % n, i) for i in range(n)]"),
    )
    done = kit("lab", "10", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(10)
    assert outcomes["cpu-1"] and not not_passed(outcomes["cpu-1"]), not_passed(outcomes["cpu-1"])
    ring = outcomes["cpu-8"]["test_blocks_move_to_the_next_stage_not_the_previous_one"]
    assert ring["hidden"] and ring["status"] == "failed"
    assert (
        "moved to the previous device, not the next" in ring["message"]
        and "(source, destination)" in ring["message"]
    )
    pipe = outcomes["cpu-8"]["test_pipeline_sends_activations_forward_through_every_stage"]
    assert pipe["hidden"] and pipe["status"] == "failed"
    assert "activations travelled backwards" in pipe["message"]


# Right but not a pipeline: every device runs every layer on every microbatch.
EVERY_LAYER_EVERYWHERE = [
    (
        'return jax.jit(jax.shard_map(per_stage, mesh=mesh, in_specs=(P("stage"), P("stage"), P()), out_specs=P()))',
        "return jax.jit(lambda w, b, m: jnp.stack([run_layers(w, b, mb) for mb in m]))",
    ),
]


def test_every_layer_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(kit, lab_outcomes, variant):
    reference = catalog.lab(10).reference.read_text()
    assert all(json.dumps(old)[1:-1] in reference for old, _ in EVERY_LAYER_EVERYWHERE), (
        "a replacement finds nothing"
    )
    everywhere = variant(10, *EVERY_LAYER_EVERYWHERE)
    done = kit("lab", "10", "--notebook", str(everywhere), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(10)
    assert by_config["cpu-1"] and not not_passed(by_config["cpu-1"]), not_passed(by_config["cpu-1"])
    named = by_config["cpu-8"][HIDDEN_LAYERS]
    assert named["hidden"] and named["status"] == "failed", named
    public = by_config["cpu-8"][LAYERS]  # the same budget, the same words, in the student's own loop
    assert not public["hidden"] and public["status"] == "failed", public
    assert (
        "every device holds all of the weights" in public["message"] and "not a pipeline" in public["message"]
    )
    assert (
        "every device holds all of the weights" in named["message"] and "not a pipeline" in named["message"]
    )


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_every_layer_on_every_device_is_refused_at_a_production_size_on_v5e_8_with_the_compilers_figures(
    kit, lab_outcomes, variant
):
    # 8 layers of 32768 x 32768 float32: 32 GiB, where a v5e chip has 15.75 GB; the reference's chip holds its
    # stage's one layer, 4 GiB. One `labkit lab` run on v5e-8 (about a minute).
    done = on_v5e_8(kit, 10, str(variant(10, *EVERY_LAYER_EVERYWHERE)))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    refused = lab_outcomes(10)["v5e-8"][PRODUCTION]
    assert refused["status"] == "failed" and not refused["hidden"], refused
    message = refused["message"]
    assert "the TPU compiler refuses your pipeline" in message, message
    assert "CompileTimeHbmOom" in message and "(32.04G) exceeds available HBM (15.75G)" in message, message


# -- ring_sum: designs within its budget, and those that are not -------------------------------

# The reference: a reduce-scatter then an all-gather around the ring, one n-th of a block a step.
REFERENCE_RING = """    def per_stage(block):
        me = jax.lax.axis_index("stage")
        pieces = jnp.stack(jnp.split(block, n))  # n pieces of k / n rows
        # Reduce-scatter: each step adds one's own piece to the running sum that arrives, and passes it on.
        passing = pieces[me]
        for step in range(1, n):
            passing = jax.lax.ppermute(passing, "stage", perm=forward) + pieces[(me - step) % n]
        # Now device me holds the whole sum of piece (me + 1) % n. All-gather: pass the finished sums on.
        sums = jnp.zeros_like(pieces).at[(me + 1) % n].set(passing)
        for step in range(1, n):
            passing = jax.lax.ppermute(passing, "stage", perm=forward)
            sums = sums.at[(me + 1 - step) % n].set(passing)
        return sums.reshape(block.shape)
"""

# Each piece sent straight to the device that finishes it, then each finished piece straight to every
# device: one ppermute per distance, the same bytes as the ring in another order.
DIRECT_SENDS = """    def per_stage(block):
        me = jax.lax.axis_index("stage")
        pieces = jnp.stack(jnp.split(block, n))
        mine = pieces[me]
        for d in range(1, n):
            mine = mine + jax.lax.ppermute(pieces[(me + d) % n], "stage", perm=[(i, (i + d) % n) for i in range(n)])
        sums = jnp.zeros_like(pieces).at[me].set(mine)
        for d in range(1, n):
            sums = sums.at[(me - d) % n].set(
                jax.lax.ppermute(mine, "stage", perm=[(i, (i + d) % n) for i in range(n)]))
        return sums.reshape(block.shape)
"""

# The plainest ring: whole blocks passed on n - 1 times. Right, and n - 1 blocks sent from every device.
WHOLE_BLOCKS = """    def per_stage(block):
        total, passing = block, block
        for _ in range(n - 1):  # after n - 1 steps every block has visited every device once
            passing = jax.lax.ppermute(passing, "stage", perm=forward)
            total = total + passing
        return total
"""

# The same ring in lax.fori_loop: one collective-permute in the loop's body, run n - 1 times, and counted so.
WHOLE_BLOCKS_IN_A_LOOP = """    def per_stage(block):
        def step(_, carried):
            total, passing = carried
            passing = jax.lax.ppermute(passing, "stage", perm=forward)
            return total + passing, passing

        return jax.lax.fori_loop(0, n - 1, step, (block, block))[0]
"""

# The library's own all-reduce, in one call or in its two halves.
WITH_PSUM = """    def per_stage(block):
        return jax.lax.psum(block, "stage")
"""
WITH_SCATTER_AND_GATHER = """    def per_stage(block):
        mine = jax.lax.psum_scatter(block, "stage", scatter_dimension=0, tiled=True)
        return jax.lax.all_gather(mine, "stage", axis=0, tiled=True)
"""

# ring_sum's budget, public (the student's `make lab-10`) and hidden (grading's, on other blocks)
ONLY_PERMUTES, HIDDEN_ONLY_PERMUTES = (
    "test_ring_sum_builds_the_sum_from_ppermutes_alone",
    "test_ring_sum_is_made_of_collective_permutes_not_an_all_reduce",
)
TWO_BLOCKS, HIDDEN_TWO_BLOCKS = (
    "test_ring_sum_sends_at_most_about_two_blocks_from_each_device",
    "test_ring_sum_sends_about_two_blocks_per_device",
)
PUBLIC_RING_TESTS = {
    "test_ring_sum_gives_every_device_the_sum_of_all_blocks",
    "test_ring_sum_keeps_one_block_on_each_device",
    ONLY_PERMUTES,
    TWO_BLOCKS,
}
RING_TESTS = PUBLIC_RING_TESTS | {"test_ring_sum_of_random_blocks", HIDDEN_ONLY_PERMUTES, HIDDEN_TWO_BLOCKS}


def run_ring_design(kit, lab_outcomes, variant, per_stage: str, *, hidden: bool = True) -> dict:
    return failures_by_config(
        kit,
        lab_outcomes,
        variant,
        10,
        REFERENCE_RING,
        per_stage,
        RING_TESTS if hidden else PUBLIC_RING_TESTS,
        hidden=hidden,
    )


def test_another_design_within_the_budget_passes_every_test(kit, lab_outcomes, variant):
    ran = run_ring_design(kit, lab_outcomes, variant, DIRECT_SENDS)
    assert ran["returncode"] == 0 and not ran["cpu-1"] and not ran["cpu-8"], ran


def test_passing_whole_blocks_around_the_ring_passes_on_cpu_1_and_fails_make_lab_10_over_budget_on_cpu_8(
    kit, lab_outcomes, variant
):
    # the student's own loop, public tests alone: the budget's figure, the limit and what it counts
    ran = run_ring_design(kit, lab_outcomes, variant, WHOLE_BLOCKS, hidden=False)
    assert ran["returncode"] == 1 and not ran["cpu-1"], ran
    assert set(ran["cpu-8"]) == {TWO_BLOCKS}, ran
    caught = ran["cpu-8"][TWO_BLOCKS]
    assert (
        not caught["hidden"]
        and "each device sends 7.00 blocks (7 KiB, a block being 1 KiB)" in caught["message"]
    ), caught
    assert "the budget is about 2 on any number of devices" in caught["message"], caught
    assert "n - 1 = 7" in caught["message"] and "Cut each block into 8 pieces" in caught["message"], caught
    assert "FAIL" in ran["output"] and "each device sends 7.00 blocks" in ran["output"], ran["output"][-3000:]


def test_a_ring_in_fori_loop_passes_on_cpu_1_and_on_cpu_8_is_counted_step_by_step_and_over_budget(
    kit, lab_outcomes, variant
):
    ran = run_ring_design(kit, lab_outcomes, variant, WHOLE_BLOCKS_IN_A_LOOP)
    assert ran["returncode"] == 1 and not ran["cpu-1"], ran
    assert set(ran["cpu-8"]) == {TWO_BLOCKS, HIDDEN_TWO_BLOCKS}, ran
    for test in (TWO_BLOCKS, HIDDEN_TWO_BLOCKS):
        caught = ran["cpu-8"][test]
        assert caught["hidden"] == (test == HIDDEN_TWO_BLOCKS), caught
        assert "each device sends 7.00 blocks" in caught["message"], caught


def test_a_ring_sum_written_with_psum_is_named_on_one_device_and_on_eight(kit, lab_outcomes, variant):
    ran = run_ring_design(kit, lab_outcomes, variant, WITH_PSUM)
    assert ran["returncode"] == 1, ran
    for config in ("cpu-1", "cpu-8"):
        assert set(ran[config]) == {ONLY_PERMUTES, HIDDEN_ONLY_PERMUTES}, ran[config]
        for test in (ONLY_PERMUTES, HIDDEN_ONLY_PERMUTES):
            caught = ran[config][test]
            assert caught["hidden"] == (test == HIDDEN_ONLY_PERMUTES), caught
            assert caught["points"] == 1 and "1 all-reduce(s)" in caught["message"], caught
            assert "jax.lax.psum's collective" in caught["message"], caught


def test_psum_scatter_then_all_gather_is_named_on_cpu_8(kit, lab_outcomes, variant):
    ran = run_ring_design(kit, lab_outcomes, variant, WITH_SCATTER_AND_GATHER)
    assert ran["returncode"] == 1, ran
    caught = ran["cpu-8"][HIDDEN_ONLY_PERMUTES]
    assert caught["hidden"] and "jax.lax.psum_scatter's collective" in caught["message"], caught
    assert ran["cpu-8"][ONLY_PERMUTES]["message"] == caught["message"], ran
    assert "builds the sum from jax.lax.ppermute alone" in caught["message"], caught


# ring_sum_both_ways in ring_sum's design: every block sent forward, the links backward left idle.
ONE_WAY = (
    "        return jnp.concatenate([one_ring(first, +1), one_ring(second, -1)])",
    "        return one_ring(block, +1)",
)


def test_a_stretch_that_sends_everything_one_way_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    """Right values, only ppermutes to neighbours, about two blocks a device: the busiest link carries 1.75."""
    code = "".join("".join(c["source"]) for c in json.loads(catalog.lab(10).reference.read_text())["cells"])
    assert ONE_WAY[0] in code, "the reference's stretch changed: update ONE_WAY"
    done = kit("lab", "10", "--notebook", str(variant(10, ONE_WAY)), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(10)
    assert not not_passed(outcomes["cpu-1"]), not_passed(outcomes["cpu-1"])
    failed = {t: o for t, o in outcomes["cpu-8"].items() if o["status"] != "passed"}
    assert (
        set(failed)
        == {
            "test_ring_sum_both_ways_sends_to_neighbours_and_loads_no_link_with_more_than_a_block",
            "test_ring_sum_both_ways_sends_to_neighbours_and_about_a_block_on_each_link",  # public, the same budget
        }
    )
    for caught in failed.values():
        assert caught["points"] == 0, caught
        assert (
            "carries 1.75 blocks" in caught["message"] and "half of every block forward" in caught["message"]
        ), caught


# A pipeline with no overlap: one micro-batch at a time through the stages, each stage idle while the others work.
# Right everywhere, its layers where they belong; the count of hand-offs in the compiled program names it.
ONE_MICROBATCH_AT_A_TIME = (
    (
        """        received = jnp.zeros_like(microbatches[0])
        outputs = jnp.zeros_like(microbatches)
        for t in range(count + n - 1):
            h = jnp.where(stage == 0, microbatches[min(t, count - 1)], received)
            h = run_layers(w, b, h)
            done = t - (n - 1)  # the microbatch leaving the last stage at this step
            if done >= 0:
                outputs = outputs.at[done].set(jnp.where(stage == n - 1, h, outputs[done]))
            received = jax.lax.ppermute(h, "stage", perm=forward)
"""
    ),
    (
        """        def one_microbatch(m, outputs):  # a loop over the microbatches: its permutes count once per trip
            h = microbatches[m]
            for s in range(n):  # stage s works; the others wait
                h = jnp.where(stage == s, run_layers(w, b, h), h)
                if s < n - 1:
                    h = jax.lax.ppermute(h, "stage", perm=forward)
            return outputs.at[m].set(jnp.where(stage == n - 1, h, outputs[m]))

        start = jax.lax.pcast(jnp.zeros_like(microbatches), ("stage",), to="varying")  # as the loop leaves it
        outputs = jax.lax.fori_loop(0, count, one_microbatch, start)
"""
    ),
)


def test_a_pipeline_that_runs_one_microbatch_at_a_time_passes_on_cpu_1_and_fails_make_lab_10_on_cpu_8(
    kit, lab_outcomes, variant
):
    # the student's own loop, public tests alone: named twice, by its hand-offs and by its work (every device
    # computes every stage's step, masked, for each micro-batch)
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 10, ONE_MICROBATCH_AT_A_TIME, hidden=False)
    assert set(failed) == {HAND_OFFS, WORK}, failed
    caught = failed[HAND_OFFS]
    assert not caught["hidden"] and "runs 84 collective-permutes" in caught["message"], caught["message"]
    assert "at most 26" in caught["message"] and "12 x 7 hand-offs" in caught["message"], caught["message"]
    work = failed[WORK]
    assert not work["hidden"] and "needs 19" in work["message"], work["message"]


# No micro-batching: the whole batch through the stages one after the other. Few hand-offs (S - 1), so the count
# of permutes passes; each device computes every stage's step on the whole batch: S x M steps' worth, not M + S - 1.
WHOLE_BATCH_STAGE_AFTER_STAGE = (
    ONE_MICROBATCH_AT_A_TIME[0],
    """        h = microbatches  # every micro-batch at once, one stage after another
        for s in range(n):
            h = jnp.where(stage == s, run_layers(w, b, h), h)
            if s < n - 1:
                h = jax.lax.ppermute(h, "stage", perm=forward)
        outputs = h
""",
)


def test_the_whole_batch_stage_after_stage_passes_on_cpu_1_and_is_named_by_its_schedule_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 10, WHOLE_BATCH_STAGE_AFTER_STAGE)
    assert set(failed) == {"test_each_stage_computes_its_layers_once_per_step_of_the_schedule"}, failed
    caught = failed.popitem()[1]
    assert (
        not caught["hidden"]
        and "where a pipeline of 12 micro-batches on 8 stages needs 19" in caught["message"]
    )
    assert "bubble" in caught["message"], caught["message"]


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_the_whole_batch_stage_after_stage_is_named_by_its_schedule_on_v5e_8(kit, lab_outcomes, variant):
    on_v5e_8(kit, 10, str(variant(10, WHOLE_BATCH_STAGE_AFTER_STAGE)))
    schedule = lab_outcomes(10)["v5e-8"]["test_each_stage_computes_its_layers_once_per_step_of_the_schedule"]
    assert schedule["status"] == "failed" and "needs 19" in schedule["message"], schedule
