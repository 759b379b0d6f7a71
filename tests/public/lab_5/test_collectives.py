"""Lab 5, public tests: one collective per exercise, judged on one device and on eight.

Each expected value is computed here with numpy. Where a plausible mistake gives a value of its
own on several devices (a sum that was never reduced, a local mean, a ring turning the wrong
way), the test computes that value too, so that the message can name the mistake.
"""

import numpy as np

from labkit.checks import (
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_dtype,
    expect_replicated,
    expect_sent_within,
    expect_shape,
    expect_split_across,
    placed,
)
from labkit.cost import bytes_sent

ONE_DEVICE = "A mesh over jax.devices()[:1] keeps everything on device 0: build it from jax.devices()"


def blocks(x, n):
    return np.split(np.asarray(x, np.float64), n)


# -- shard_map_psum -------------------------------------------------------------------------

SUM_X = np.arange(1.0, 33.0, dtype=np.float32)  # every input here divides by 1 to 32 devices


@check(got=call("shard_map_psum", SUM_X))
def test_psum_adds_up_every_element(got, run):
    first = blocks(SUM_X, run.device_count)[0].sum()
    expect_close_naming_mistakes(
        got,
        SUM_X.sum(),
        {
            "That is the sum of device 0's block alone: add the per-device sums with jax.lax.psum(local, 'data')": first,
        },
    )


@check(got=call("shard_map_psum", SUM_X))
def test_psum_gives_a_scalar_held_by_every_device(got, run):
    expect_shape(got, (), hint="Sum the block to one number with jnp.sum before the psum")
    expect_dtype(got, "float32")
    expect_replicated(
        got,
        run.device_count,
        hint="After psum every device holds the total: use out_specs=P() on a mesh built from jax.devices()",
    )


# -- shard_map_center -----------------------------------------------------------------------

CENTER_X = (np.arange(32, dtype=np.float32) ** 2) / 8


@check(got=call("shard_map_center", CENTER_X))
def test_center_subtracts_the_mean_of_the_whole_array(got, run):
    local = np.concatenate([b - b.mean() for b in blocks(CENTER_X, run.device_count)])
    expect_close_naming_mistakes(
        got,
        CENTER_X - CENTER_X.mean(),
        {
            "Each block had its own mean subtracted: average the block means with jax.lax.pmean(..., 'data')": local,
        },
        atol=1e-5,
    )


@check(got=call("shard_map_center", CENTER_X))
def test_center_result_is_split_across_every_device(got, run):
    expect_dtype(got, "float32")
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- shard_map_softmax ----------------------------------------------------------------------


def softmax(x):
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


def softmax_mistakes(x, n):
    parts = blocks(x, n)
    shifted = [np.exp(b - b.max()) for b in parts]
    local_max = np.concatenate(shifted) / sum(s.sum() for s in shifted)
    e = [np.exp(b - np.max(x)) for b in parts]
    local_sum = np.concatenate([b / b.sum() for b in e])
    return {
        "Each block was shifted by its own maximum, so the blocks' exponentials are on different scales: "
        "take the global maximum with jax.lax.pmax(jnp.max(block), 'data')": local_max,
        "Each block sums to 1 on its own: divide by the sum over every device, jax.lax.psum(jnp.sum(e), 'data')": local_sum,
    }


SOFT_X = np.linspace(-3.0, 4.5, 32, dtype=np.float32)
HUGE_X = np.array([1000.0, 999.0, 998.0, 0.0] * 8, dtype=np.float32)


@check(got=call("shard_map_softmax", SOFT_X))
def test_softmax_matches_numpy(got, run):
    expect_close_naming_mistakes(got, softmax(SOFT_X), softmax_mistakes(SOFT_X, run.device_count), atol=1e-6)


@check(got=call("shard_map_softmax", HUGE_X))
def test_softmax_stays_finite_for_large_inputs(got, run):
    expect_close_naming_mistakes(
        got,
        softmax(HUGE_X),
        softmax_mistakes(HUGE_X, run.device_count),
        atol=1e-6,
        hint="exp(1000) overflows float32: subtract the maximum before exp",
    )


@check(got=call("shard_map_softmax", SOFT_X))
def test_softmax_result_is_split_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- shard_map_ring_shift -------------------------------------------------------------------

RING_X = np.arange(32, dtype=np.float32)


@check(got=call("shard_map_ring_shift", RING_X))
def test_ring_shift_moves_every_block_to_the_next_device(got, run):
    step = len(RING_X) // run.device_count
    expect_close_naming_mistakes(
        got,
        np.roll(RING_X, step),
        {
            "The blocks moved to the left: the pairs of perm are (source, destination), so device i sends to "
            "(i + 1) % n with (i, (i + 1) % n)": np.roll(RING_X, -step),
            "Nothing moved: did ppermute get a perm that sends each device to itself?": RING_X,
        },
        hint="Device i's block should end up on device i + 1, and the last device's on device 0",
    )


@check(got=call("shard_map_ring_shift", RING_X))
def test_ring_shift_result_is_split_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- shard_map_column_sums ------------------------------------------------------------------

COLS_X = np.arange(32 * 32, dtype=np.float32).reshape(32, 32) % 7


def column_sum_mistakes(x, n):
    partial = [b.sum(axis=0) for b in np.split(np.asarray(x, np.float64), n)]
    return {
        "That is every device's full vector of column sums, one after the other: psum followed by "
        "out_specs=P('data') joins n copies; psum_scatter(..., tiled=True) leaves each device only its slice": np.tile(
            x.sum(axis=0), n
        ),
        "Those are each device's column sums of its own rows, never added together: reduce them with "
        "jax.lax.psum_scatter(..., 'data', scatter_dimension=0, tiled=True)": np.concatenate(partial),
    }


@check(got=compiled_call("shard_map_column_sums", COLS_X))
def test_column_sums_add_up_every_row(got, run):
    expect_close_naming_mistakes(got, COLS_X.sum(axis=0), column_sum_mistakes(COLS_X, run.device_count))


@check(got=call("shard_map_column_sums", COLS_X))
def test_column_sums_are_scattered_one_slice_per_device(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="psum leaves a full copy on every device; psum_scatter(..., tiled=True) with "
        "out_specs=P('data') leaves each device its own slice of the sums",
    )


@check(got=compiled_call("shard_map_column_sums", COLS_X))
def test_column_sums_send_what_one_reduce_scatter_sends(got, run):
    n = run.device_count  # the handout's budget: (n - 1)/n of the vector of column sums, a little more passes
    expect_sent_within(
        got,
        bytes_sent("reduce-scatter", COLS_X[0].nbytes // max(n, 1), n),
        n,
        what="one reduce-scatter of the column sums",
        hint="A psum sends every device the whole vector, twice a reduce-scatter's traffic, and "
        "slicing it afterwards does not take that back: the compiled program still holds the "
        "all-reduce. jax.lax.psum_scatter(..., 'data', scatter_dimension=0, tiled=True) adds "
        "and leaves each device only its slice",
    )


# -- shard_map_cumsum -----------------------------------------------------------------------

CUM_X = np.array([1.0, 2.0, -1.0, 0.5] * 8, dtype=np.float32)


def cumsum_mistakes(x, n):
    parts = blocks(x, n)
    restart = np.concatenate([np.cumsum(b) for b in parts])
    totals = np.array([b.sum() for b in parts])
    with_own = np.concatenate([np.cumsum(b) + totals[: i + 1].sum() for i, b in enumerate(parts)])
    return {
        "Each block's running total starts again from zero: add the totals of the blocks before it "
        "(all_gather the block sums, keep those whose index is below jax.lax.axis_index('data'))": restart,
        "Each block also added its own total: keep the blocks whose index is strictly below yours (<, not <=)": with_own,
    }


@check(got=call("shard_map_cumsum", CUM_X))
def test_cumsum_carries_the_total_over_from_block_to_block(got, run):
    expect_close_naming_mistakes(
        got, np.cumsum(CUM_X.astype(np.float64)), cumsum_mistakes(CUM_X, run.device_count), atol=1e-5
    )


@check(got=call("shard_map_cumsum", placed(CUM_X, ("data",))))
def test_cumsum_of_an_input_that_is_already_sharded(got, run):
    expect_close(got, np.cumsum(CUM_X.astype(np.float64)), atol=1e-5)
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- rows_to_columns ------------------------------------------------------------------------

TILES_X = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)  # 32 x 32: one row per device on 32 devices
TRANSPOSED = (
    "That is x transposed: the values stay where they are in x, only which device holds them "
    "changes. Device j ends up with columns j * m/n onward, every row of them"
)


@check(got=call("rows_to_columns", placed(TILES_X, ("data", None))))
def test_rows_to_columns_gives_back_the_same_matrix(got, run):
    expect_shape(got, TILES_X.shape, hint="Each device ends with (m, m/n): all the rows of its own columns")
    expect_dtype(got, "float32")
    expect_close_naming_mistakes(got, TILES_X, {TRANSPOSED: TILES_X.T})


@check(got=call("rows_to_columns", placed(TILES_X, ("data", None))))
def test_rows_to_columns_leaves_each_device_its_own_columns(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=1,
        hint="The result is split by columns over 'data': P(None, 'data'), each device a block of "
        "columns with every row",
    )
