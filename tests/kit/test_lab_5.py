"""Lab 5 through the real pipeline: a solution that leaves out every collective's effect is right on
one device, and on eight the hidden tests name each mistake."""

import json
import os
import subprocess
import sys

import pytest
from notebook_variants import failed_on_cpu_8, failures_by_config
from test_compile_once import RUN_TWICE
from test_tpu_references import HAS_LIBTPU, on_v5e_8

from labkit.course import catalog

# (text in the reference, the mistake put in its place)
MISTAKES = [
    # shard_map_psum: no psum, its check silenced
    ('return jax.lax.psum(jnp.sum(block), "data")', "return jnp.sum(block)"),
    ('in_specs=P("data"), out_specs=P()))', 'in_specs=P("data"), out_specs=P(), check_vma=False))'),
    # shard_map_center: the block's own mean
    ('block - jax.lax.pmean(jnp.mean(block), "data")', "block - jnp.mean(block)"),
    # shard_map_softmax: the block's own maximum
    ('top = jax.lax.pmax(jnp.max(block), "data")', "top = jnp.max(block)"),
    # shard_map_ring_shift: pairs written (destination, source)
    ("ring = [(i, (i + 1) % n) for i in range(n)]", "ring = [((i + 1) % n, i) for i in range(n)]"),
    # shard_map_column_sums: psum where psum_scatter belongs
    (
        'jax.lax.psum_scatter(jnp.sum(rows, axis=0), "data", scatter_dimension=0, tiled=True)',
        'jax.lax.psum(jnp.sum(rows, axis=0), "data")',
    ),
    # shard_map_cumsum: no offset from the blocks before
    ("return jnp.cumsum(block) + before", "return jnp.cumsum(block)"),
]

NAMED = {
    "test_psum_of_a_random_vector_adds_the_blocks_of_every_device": "sum of device 0's block alone",
    "test_center_subtracts_the_global_mean_not_the_mean_of_each_block": "its own mean subtracted",
    "test_softmax_normalises_over_the_whole_vector": "shifted by its own maximum",
    "test_ring_shift_turns_towards_the_next_device": "wrong way round the ring",
    "test_column_sums_of_a_wide_matrix_are_reduced_and_scattered": "8 copies of the column sums",
    "test_cumsum_continues_from_the_blocks_before": "starts again from zero",
}


def test_every_mistake_passes_on_cpu_1_and_is_named_by_a_hidden_test_on_cpu_8(kit, lab_outcomes, variant):
    reference = "".join(
        "".join(c["source"]) for c in json.loads(catalog.lab(5).reference.read_text())["cells"]
    )
    assert all(old in reference for old, _ in MISTAKES), "a mistake replaces nothing: the reference changed"
    buggy = variant(5, *MISTAKES)
    done = kit("lab", "5", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(5)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), (
        by_config["cpu-1"]
    )
    for test, phrase in NAMED.items():
        outcome = by_config["cpu-8"][test]
        assert outcome["hidden"] and outcome["status"] == "failed", outcome
        assert phrase in outcome["message"], outcome["message"]


# shard_map_psum, right but not parallel: every device sums the whole vector, no psum.
WHOLE_ON_EVERY_DEVICE = [
    ('return jax.lax.psum(jnp.sum(block), "data")', "return jnp.sum(block)"),
    ('in_specs=P("data"), out_specs=P()))', "in_specs=P(), out_specs=P()))"),
]


def test_a_sum_computed_whole_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    reference = "".join(
        "".join(c["source"]) for c in json.loads(catalog.lab(5).reference.read_text())["cells"]
    )
    assert all(old in reference for old, _ in WHOLE_ON_EVERY_DEVICE), "a replacement finds nothing"
    whole = variant(5, *WHOLE_ON_EVERY_DEVICE)
    done = kit("lab", "5", "--notebook", str(whole), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(5)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), (
        by_config["cpu-1"]
    )
    assert (
        by_config["cpu-8"]["test_psum_of_a_random_vector_adds_the_blocks_of_every_device"]["status"]
        == "passed"
    )
    named = by_config["cpu-8"]["test_psum_gives_each_device_one_block_and_all_reduces_the_block_sums"]
    assert named["hidden"] and named["status"] == "failed", named
    assert "every device holds all of x" in named["message"] and "in_specs=P('data')" in named["message"]


# -- shard_map_cumsum, a design exercise: what crosses between devices is a few numbers ----------

REFERENCE_CUMSUM = """    def per_device(block):
        totals = jax.lax.all_gather(jnp.sum(block), "data")
        me = jax.lax.axis_index("data")
        before = jnp.sum(jnp.where(jnp.arange(totals.shape[0]) < me, totals, 0.0))
        return jnp.cumsum(block) + before
"""

# Every block gathered to every device, the whole running total taken there, each device's slice kept.
GATHER_THE_BLOCKS = """    def per_device(block):
        everything = jax.lax.all_gather(block, "data", tiled=True)
        me = jax.lax.axis_index("data")
        return jax.lax.dynamic_slice_in_dim(jnp.cumsum(everything), me * block.shape[0], block.shape[0])
"""

# Each device's total in its own slot of a vector of n numbers, the vectors added with psum.
TOTALS_BY_PSUM = """    def per_device(block):
        n, me = jax.lax.axis_size("data"), jax.lax.axis_index("data")
        totals = jax.lax.psum(jnp.zeros(n).at[me].set(jnp.sum(block)), "data")
        before = jnp.sum(jnp.where(jnp.arange(n) < me, totals, 0.0))
        return jnp.cumsum(block) + before
"""


CUMSUM_BUDGET = "test_cumsum_sends_a_few_numbers_per_device_not_blocks"
PUBLIC_CUMSUM_BUDGET = (
    "test_cumsum_sends_a_few_numbers_from_each_device_never_its_block"  # `make lab-5`'s own
)


def run_cumsum_design(kit, lab_outcomes, variant, per_device: str) -> dict:
    return failures_by_config(
        kit,
        lab_outcomes,
        variant,
        5,
        REFERENCE_CUMSUM,
        per_device,
        {CUMSUM_BUDGET, PUBLIC_CUMSUM_BUDGET},
    )


def test_a_cumsum_that_adds_the_totals_with_psum_passes_every_test(kit, lab_outcomes, variant):
    ran = run_cumsum_design(kit, lab_outcomes, variant, TOTALS_BY_PSUM)
    assert ran["returncode"] == 0 and not ran["cpu-1"] and not ran["cpu-8"], ran


def test_a_cumsum_that_gathers_every_block_passes_on_cpu_1_and_is_over_budget_on_cpu_8(
    kit, lab_outcomes, variant
):
    ran = run_cumsum_design(kit, lab_outcomes, variant, GATHER_THE_BLOCKS)
    assert ran["returncode"] == 1 and not ran["cpu-1"], ran
    assert set(ran["cpu-8"]) == {CUMSUM_BUDGET, PUBLIC_CUMSUM_BUDGET}, ran["cpu-8"]
    for test in (CUMSUM_BUDGET, PUBLIC_CUMSUM_BUDGET):  # grading's and the student's own: the same words
        caught = ran["cpu-8"][test]
        assert caught["hidden"] == (test == CUMSUM_BUDGET) and "7.0 block(s) of x" in caught["message"], (
            caught
        )
        assert "gathering the blocks themselves moves the vector" in caught["message"], caught


# -- rows_to_columns, a design exercise: the same matrix split by columns, one all-to-all's traffic ----

REFERENCE_ROWS_TO_COLUMNS = """    def per_device(rows):
        # Cut the block into n tiles of columns, send tile j to device j, stack the tiles that arrive.
        return jax.lax.all_to_all(rows, "data", split_axis=1, concat_axis=0, tiled=True)

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("data", None), out_specs=P(None, "data")))
"""

# Every block gathered to every device, each device's columns sliced out of the whole matrix.
GATHER_AND_SLICE = """    def per_device(rows):
        whole = jax.lax.all_gather(rows, "data", axis=0, tiled=True)
        n, me = jax.lax.axis_size("data"), jax.lax.axis_index("data")
        width = whole.shape[1] // n
        return jax.lax.dynamic_slice_in_dim(whole, me * width, width, axis=1)

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("data", None), out_specs=P(None, "data")))
"""

# No collective written: jax.jit told where x is and where the result must be, the compiler moves the tiles.
SHARDING_CONSTRAINTS = """    from jax.sharding import NamedSharding

    by_rows, by_columns = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P(None, "data"))
    return jax.jit(lambda x: jax.lax.with_sharding_constraint(x, by_columns), in_shardings=by_rows)
"""

ROWS_TO_COLUMNS_TESTS = {
    "test_rows_to_columns_sends_at_most_what_one_all_to_all_sends",
    "test_rows_to_columns_never_holds_the_whole_matrix_on_one_device",
    # the same budgets in the student's own `make lab-5`, on the public matrix of the same size
    "test_rows_to_columns_sends_no_more_than_one_all_to_all",
    "test_rows_to_columns_keeps_x_in_pieces_on_every_device",
}


def run_rows_to_columns_design(kit, lab_outcomes, variant, design: str) -> dict:
    return failures_by_config(
        kit, lab_outcomes, variant, 5, REFERENCE_ROWS_TO_COLUMNS, design, ROWS_TO_COLUMNS_TESTS
    )


def test_rows_to_columns_by_sharding_constraints_passes_every_test(kit, lab_outcomes, variant):
    ran = run_rows_to_columns_design(kit, lab_outcomes, variant, SHARDING_CONSTRAINTS)
    assert ran["returncode"] == 0 and not ran["cpu-1"] and not ran["cpu-8"], ran


def test_rows_to_columns_that_gathers_the_matrix_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    ran = run_rows_to_columns_design(kit, lab_outcomes, variant, GATHER_AND_SLICE)
    assert ran["returncode"] == 1 and not ran["cpu-1"], ran
    assert set(ran["cpu-8"]) == ROWS_TO_COLUMNS_TESTS, ran["cpu-8"]
    over = ran["cpu-8"]["test_rows_to_columns_sends_at_most_what_one_all_to_all_sends"]
    whole = ran["cpu-8"]["test_rows_to_columns_never_holds_the_whole_matrix_on_one_device"]
    assert over["hidden"] and "7.00 block(s) of rows" in over["message"], over
    assert "where the budget is the 7/8 of its block" in over["message"], over
    assert (
        whole["hidden"] and "all-gather hands each device an array of 64 KiB, all of x" in whole["message"]
    ), whole
    public_over = ran["cpu-8"]["test_rows_to_columns_sends_no_more_than_one_all_to_all"]
    public_whole = ran["cpu-8"]["test_rows_to_columns_keeps_x_in_pieces_on_every_device"]
    assert not public_over["hidden"] and public_over["message"] == over["message"], public_over
    assert not public_whole["hidden"] and public_whole["message"] == whole["message"], public_whole


def test_rows_to_columns_is_built_once_so_a_second_call_compiles_nothing():
    nb = json.loads(catalog.lab(5).reference.read_text())
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    calls = {"rows_to_columns": [[[1.0] * 4] * 4]}
    done = subprocess.run(
        [sys.executable, "-c", RUN_TWICE],
        input=json.dumps([nb, calls]),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"rows_to_columns": []}


# -- shard_map_column_sums: the lesson is the reduce-scatter, so a whole all-reduce then a slice is over budget --

PSUM_THEN_SLICE = (
    '        return jax.lax.psum_scatter(jnp.sum(rows, axis=0), "data", scatter_dimension=0, tiled=True)\n',
    (
        '        total = jax.lax.psum(jnp.sum(rows, axis=0), "data")\n'
        '        k = total.shape[0] // jax.lax.axis_size("data")\n'
        '        return jax.lax.dynamic_slice_in_dim(total, jax.lax.axis_index("data") * k, k)\n'
    ),
)


def test_column_sums_by_a_psum_then_a_slice_pass_on_cpu_1_and_are_over_budget_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 5, PSUM_THEN_SLICE)
    assert set(failed) == {"test_column_sums_send_what_one_reduce_scatter_sends"}, failed
    caught = failed.popitem()[1]
    assert not caught["hidden"], caught  # its threshold is in the handout: a public test
    assert "all-reduce of f32[32]" in caught["message"] and "224 bytes" in caught["message"], caught[
        "message"
    ]


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_on_v5e_8_a_psum_then_a_slice_is_over_budget_and_the_compilers_all_reduce_of_a_psum_scatter_is_not(
    kit, lab_outcomes, variant
):
    # libtpu sums a reduce-scatter of a vector with an all-reduce, at any size: the reference's psum_scatter is
    # charged as the reduce-scatter it asks for (tests/kit/test_tpu_references.py runs the reference there)
    on_v5e_8(kit, 5, str(variant(5, PSUM_THEN_SLICE)))
    caught = lab_outcomes(5)["v5e-8"]["test_column_sums_send_what_one_reduce_scatter_sends"]
    assert caught["status"] == "failed" and "all-reduce of f32[32]" in caught["message"], caught
    assert "the TPU compiler's form of the reduce-scatter" not in caught["message"], caught
