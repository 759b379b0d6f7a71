"""Lab 5, public tests: one collective per exercise, judged on one device and on eight.

Each expected value is computed here with numpy. Where a plausible mistake gives a value of its
own on several devices (a sum that was never reduced, a local mean, a ring turning the wrong
way), the test computes that value too, so that the message can name the mistake. The budgets read from the
compiled program (one block a device and an all-reduce for psum, the bytes column sums, cumsum and
rows_to_columns send, rows_to_columns never whole) are held here on these inputs, and by the hidden tests on
others with the same helpers and words.
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    collectives_of,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_collective,
    expect_dtype,
    expect_held_below,
    expect_input_split,
    expect_replicated,
    expect_sent_within,
    expect_shape,
    expect_split_across,
    placed,
    sent_per_device,
)
from labkit.cost import bytes_sent, shape_bytes

ONE_DEVICE = "A mesh over jax.devices()[:1] keeps everything on device 0: build it from jax.devices()"


def blocks(x, n):
    return np.split(np.asarray(x, np.float64), n)


# -- shard_map_psum -------------------------------------------------------------------------

# 32 values: every vector here divides over 1 to 32 devices; on a larger pod the run gets copies of it, each
# shifted (here 1 to 256)
SUM_X = by_devices(np.arange(1.0, 33.0, dtype=np.float32), shift=32.0)


@check(got=call("shard_map_psum", SUM_X))
def test_psum_adds_up_every_element(got, run):
    x = SUM_X.on(run)
    first = blocks(x, run.device_count)[0].sum()
    expect_close_naming_mistakes(
        got,
        x.sum(),
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


def expect_one_block_and_an_all_reduce(got, n: int) -> None:
    """Each device holds 1/n of x (its block), and the compiled program all-reduces the block sums."""
    expect_input_split(
        got,
        0,
        n,
        name="x",
        hint="Every device sums the whole vector by itself: that is not "
        "parallel. Give x in_specs=P('data'), so that each device sums "
        "its own block, and add the block sums with jax.lax.psum",
    )
    expect_collective(
        got, "all-reduce", n, hint="The block sums of the devices are added by jax.lax.psum(local, 'data')"
    )


@check(got=compiled_call("shard_map_psum", SUM_X))
def test_psum_sums_one_block_on_each_device_and_all_reduces_the_sums(got, run):
    expect_one_block_and_an_all_reduce(got, run.device_count)


# -- shard_map_center -----------------------------------------------------------------------

CENTER_X = by_devices((np.arange(32, dtype=np.float32) ** 2) / 8, shift=1 / 64)  # copies stay exact


@check(got=call("shard_map_center", CENTER_X))
def test_center_subtracts_the_mean_of_the_whole_array(got, run):
    x = CENTER_X.on(run)
    local = np.concatenate([b - b.mean() for b in blocks(x, run.device_count)])
    expect_close_naming_mistakes(
        got,
        x - x.mean(),
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


SOFT_X = by_devices(np.linspace(-3.0, 4.5, 32, dtype=np.float32), shift=0.25)
HUGE_X = by_devices(np.array([1000.0, 999.0, 998.0, 0.0] * 8, dtype=np.float32), shift=0.25)


@check(got=call("shard_map_softmax", SOFT_X))
def test_softmax_matches_numpy(got, run):
    x = SOFT_X.on(run)
    expect_close_naming_mistakes(got, softmax(x), softmax_mistakes(x, run.device_count), atol=1e-6)


@check(got=call("shard_map_softmax", HUGE_X))
def test_softmax_stays_finite_for_large_inputs(got, run):
    x = HUGE_X.on(run)
    expect_close_naming_mistakes(
        got,
        softmax(x),
        softmax_mistakes(x, run.device_count),
        atol=1e-6,
        hint="exp(1000) overflows float32: subtract the maximum before exp",
    )


@check(got=call("shard_map_softmax", SOFT_X))
def test_softmax_result_is_split_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- shard_map_ring_shift -------------------------------------------------------------------

RING_X = by_devices(np.arange(32, dtype=np.float32), shift=32.0)  # 0 to 255 on 256 devices


@check(got=call("shard_map_ring_shift", RING_X))
def test_ring_shift_moves_every_block_to_the_next_device(got, run):
    x = RING_X.on(run)
    step = len(x) // run.device_count
    expect_close_naming_mistakes(
        got,
        np.roll(x, step),
        {
            "The blocks moved to the left: the pairs of perm are (source, destination), so device i sends to "
            "(i + 1) % n with (i, (i + 1) % n)": np.roll(x, -step),
            "Nothing moved: did ppermute get a perm that sends each device to itself?": x,
        },
        hint="Device i's block should end up on device i + 1, and the last device's on device 0",
    )


@check(got=call("shard_map_ring_shift", RING_X))
def test_ring_shift_result_is_split_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- shard_map_column_sums ------------------------------------------------------------------

# 32 x 32: its rows split over every device, and so do the 32 column sums; on a larger pod both grow
COLS_X = by_devices(np.arange(32 * 32, dtype=np.float32).reshape(32, 32) % 7, shift=7.0, axis=(0, 1))


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
    x = COLS_X.on(run)
    expect_close_naming_mistakes(got, x.sum(axis=0), column_sum_mistakes(x, run.device_count))


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
        bytes_sent("reduce-scatter", COLS_X.on(run)[0].nbytes // max(n, 1), n),
        n,
        what="one reduce-scatter of the column sums",
        hint="A psum sends every device the whole vector, twice a reduce-scatter's traffic, and "
        "slicing it afterwards does not take that back: the compiled program still holds the "
        "all-reduce. jax.lax.psum_scatter(..., 'data', scatter_dimension=0, tiled=True) adds "
        "and leaves each device only its slice",
    )


# -- shard_map_cumsum -----------------------------------------------------------------------

CUM_X = by_devices(np.array([1.0, 2.0, -1.0, 0.5] * 8, dtype=np.float32), shift=0.25)  # sums stay exact


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
    x = CUM_X.on(run)
    expect_close_naming_mistakes(
        got, np.cumsum(x.astype(np.float64)), cumsum_mistakes(x, run.device_count), atol=1e-5
    )


@check(got=call("shard_map_cumsum", placed(CUM_X, ("data",))))
def test_cumsum_of_an_input_that_is_already_sharded(got, run):
    expect_close(got, np.cumsum(CUM_X.on(run).astype(np.float64)), atol=1e-5)
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# cumsum's budget: a few numbers from each device, never the blocks. 4096 numbers: a block of 512 on eight
# devices, so that gathering the blocks is far over it.
LONG_CUM_X = np.linspace(-2.0, 2.0, 4096, dtype=np.float32)
FEW = 16  # the numbers per device the budget allows each device to send


def expect_a_few_numbers_sent(got, n: int, x) -> None:
    """x stays split, and each device sends at most FEW numbers for each of the n devices (fewer where a block
    is itself only a few numbers: half a block's, 8 of the 16 on 256 devices, so that gathering blocks is over)."""
    expect_input_split(got, 0, n, name="x", hint="Give x in_specs=P('data'): each device keeps its own block")
    if n == 1:
        return
    sent, block = sent_per_device(got), x.nbytes / n
    if sent > min(FEW, x.size // n // 2) * 4 * n:
        raise Mismatch(
            f"each device sends {sent / 1024:.1f} KiB, {sent / block:.1f} block(s) of x, where the budget is "
            f"a few numbers for each of the {n} devices: gathering the blocks themselves moves the vector. "
            "A device needs only one number from each device before it: what is it?"
        )


@check(got=compiled_call("shard_map_cumsum", LONG_CUM_X))
def test_cumsum_sends_a_few_numbers_from_each_device_never_its_block(got, run):
    expect_a_few_numbers_sent(got, run.device_count, LONG_CUM_X)


# -- rows_to_columns ------------------------------------------------------------------------

# 32 x 32: one row per device on 32 devices; on a larger pod its rows and columns grow, each copy shifted
TILES_X = by_devices(np.arange(32 * 32, dtype=np.float32).reshape(32, 32), shift=1024.0, axis=(0, 1))
TRANSPOSED = (
    "That is x transposed: the values stay where they are in x, only which device holds them "
    "changes. Device j ends up with columns j * m/n onward, every row of them"
)


@check(got=call("rows_to_columns", placed(TILES_X, ("data", None))))
def test_rows_to_columns_gives_back_the_same_matrix(got, run):
    x = TILES_X.on(run)
    expect_shape(got, x.shape, hint="Each device ends with (m, m/n): all the rows of its own columns")
    expect_dtype(got, "float32")
    expect_close_naming_mistakes(got, x, {TRANSPOSED: x.T})


@check(got=call("rows_to_columns", placed(TILES_X, ("data", None))))
def test_rows_to_columns_leaves_each_device_its_own_columns(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=1,
        hint="The result is split by columns over 'data': P(None, 'data'), each device a block of "
        "columns with every row",
    )


# rows_to_columns' budget: one all-to-all's traffic, and x never whole on a device. 128 x 128 (64 KiB): a block
# of rows is 128 / n of them, and a whole x stands out from the blocks and the tiles in flight.
BIG_TILES_X = by_devices(
    np.arange(128 * 128, dtype=np.float32).reshape(128, 128) / 128.0, shift=128.0, axis=(0, 1)
)
BIG_TILES_CALL = compiled_call("rows_to_columns", placed(BIG_TILES_X, ("data", None)))
MARGIN = 1.1  # a little over what one all-to-all sends passes; a whole block more does not


def expect_one_all_to_all_sent(got, n: int, x) -> None:
    """Each device sends at most a little over the (n - 1)/n of its block of rows that one all-to-all sends."""
    if n == 1:
        return  # nothing to send
    block = x.nbytes / n
    sent, budget = sent_per_device(got), (n - 1) / n * block
    if sent > MARGIN * budget:
        raise Mismatch(
            f"each device sends {sent / block:.2f} block(s) of rows ({sent / 1024:.1f} KiB, a block being "
            f"{block / 1024:.1f} KiB), where the budget is the {n - 1}/{n} of its block that belongs to "
            "other devices' columns: gathering the blocks sends every device's whole block to every "
            "other. Which tile of your block does each device need, and only that one?"
        )


def expect_never_whole(got, n: int, x) -> None:
    """x stays split by rows, no collective hands a device all of x, and (on 4 or more) no device holds it."""
    expect_input_split(got, 0, n, name="x", hint="x arrives split by rows: keep it so, P('data', None)")
    if n == 1:
        return
    whole = [c for c in collectives_of(got) if shape_bytes(c.shape) >= x.nbytes]
    if whole:
        raise Mismatch(
            f"the compiled program's {whole[0].op} hands each device an array of "
            f"{shape_bytes(whole[0].shape) / 1024:.0f} KiB, all of x: no device may hold the whole "
            "matrix. Each device needs only its own columns: send it those, and nothing else"
        )
    if n >= 4 and getattr(got.compiled, "compiled_for", None):
        # A TPU compiler's memory figure holds its own buffers for the exchange (on v5p, 160 KiB of temporaries
        # for the reference's all-to-all of a 64 KiB x), so it cannot tell x whole from pieces in flight. A device
        # that held all of x would have received the others' rows of it, (n - 1)/n of x: judged there instead.
        expect_sent_within(
            got,
            (n - 1) / n * x.nbytes,
            n,
            margin=0.99,
            what="the other devices' rows of x, which a device holding all of x must receive",
            hint="no device may hold the whole matrix: keep only blocks of x and the tiles in flight",
        )
    elif n >= 4:  # on two devices a block and the buffers of one exchange already add up to x's size
        expect_held_below(
            got,
            x.nbytes,
            what="all of x",
            hint="no device may hold the whole matrix: keep only blocks of x and the tiles in flight",
        )


@check(got=BIG_TILES_CALL)
def test_rows_to_columns_sends_no_more_than_one_all_to_all(got, run):
    expect_one_all_to_all_sent(got, run.device_count, BIG_TILES_X.on(run))


@check(got=BIG_TILES_CALL)
def test_rows_to_columns_keeps_x_in_pieces_on_every_device(got, run):
    expect_never_whole(got, run.device_count, BIG_TILES_X.on(run))
