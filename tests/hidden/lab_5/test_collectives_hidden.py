"""Lab 5, hidden tests: inputs the student has not seen, and the mistakes only several devices reveal.

On one device every collective is the identity, so each of these mistakes passes there: a psum
left out behind check_vma=False, a local mean or maximum, a ring that turns the wrong way, a
running total that restarts at every block. On eight devices each gives a value of its own, and
the message names it. A running total that gathers every block is right everywhere; the compiled
program shows the bytes it sends. A sum computed whole on every device (in_specs=P() and no psum) is right
everywhere; the compiled program shows it: x whole on each device, and no all-reduce. A matrix re-split
from rows to columns by gathering it whole and slicing is right everywhere too; the compiled program shows
an all-gather of all of x, and each device sending n - 1 blocks where one all-to-all sends (n - 1)/n of one.
"""

import numpy as np

from labkit.checks import (
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_split_across,
    placed,
    public_tests,
)

public = public_tests(__file__)  # the public tests' inputs and helpers (each budget in the same words)

RNG = np.random.default_rng(5)


def blocks(x, n):
    return np.split(np.asarray(x, np.float64), n)


FORGOT_PSUM = (
    "On {n} devices that is the sum of device 0's block alone: the per-device sums were never added. "
    "Call jax.lax.psum(local, 'data'); with check_vma=False, shard_map does not catch a missing psum"
)


# The vectors here (32 or 64 values) divide over 1 to 32 devices; on a larger pod the run gets copies of each,
# each copy shifted
PSUM = by_devices(RNG.normal(1.0, 2.0, size=64).astype(np.float32), shift=0.5)


@check(got=call("shard_map_psum", PSUM))
def test_psum_of_a_random_vector_adds_the_blocks_of_every_device(got, run):
    x = PSUM.on(run)
    n = run.device_count
    expect_close_naming_mistakes(got, x.sum(), {FORGOT_PSUM.format(n=n): blocks(x, n)[0].sum()}, rtol=1e-4)


SQUARES = by_devices(np.linspace(0.0, 9.0, 64, dtype=np.float32) ** 2, shift=0.5)


@check(got=call("shard_map_center", placed(SQUARES, ("data",))))
def test_center_subtracts_the_global_mean_not_the_mean_of_each_block(got, run):
    x = SQUARES.on(run)
    n = run.device_count
    local = np.concatenate([b - b.mean() for b in blocks(x, n)])
    expect_close_naming_mistakes(
        got,
        x - x.astype(np.float64).mean(),
        {
            f"On {n} devices each block had its own mean subtracted (jnp.mean of the block is a local mean): "
            "average the block means across devices with jax.lax.pmean(..., 'data')": local,
        },
        rtol=1e-4,
        atol=1e-3,
    )


SOFT = by_devices(
    np.concatenate([np.linspace(-2.0, 2.0, 24), np.linspace(5.0, 9.0, 8)]).astype(np.float32), shift=0.25
)


@check(got=call("shard_map_softmax", SOFT))
def test_softmax_normalises_over_the_whole_vector(got, run):
    n = run.device_count
    soft = SOFT.on(run)
    parts = blocks(soft, n)
    e = np.exp(soft.astype(np.float64) - soft.max())
    shifted = [np.exp(b - b.max()) for b in parts]
    local_max = np.concatenate(shifted) / sum(s.sum() for s in shifted)
    local_sum = np.concatenate([b / b.sum() for b in np.split(e, n)])
    expect_close_naming_mistakes(
        got,
        e / e.sum(),
        {
            f"On {n} devices each block was shifted by its own maximum: use jax.lax.pmax(jnp.max(block), 'data')": local_max,
            f"On {n} devices each block sums to 1 by itself: the denominator needs jax.lax.psum over 'data'": local_sum,
        },
        atol=1e-6,
    )


RING = by_devices(RNG.integers(-50, 50, size=64).astype(np.float32), shift=100.0)


@check(got=call("shard_map_ring_shift", RING))
def test_ring_shift_turns_towards_the_next_device(got, run):
    n = run.device_count
    ring = RING.on(run)
    step = len(ring) // n
    expect_close_naming_mistakes(
        got,
        np.roll(ring, step),
        {
            f"On {n} devices the blocks went the wrong way round the ring (to device i - 1): ppermute's pairs are "
            "(source, destination), so write (i, (i + 1) % n)": np.roll(ring, -step),
        },
    )
    expect_split_across(got, n, axis=0)


WIDE = by_devices(RNG.integers(0, 5, size=(32, 64)).astype(np.float32), shift=5.0, axis=(0, 1))


@check(got=call("shard_map_column_sums", placed(WIDE, ("data", None))))
def test_column_sums_of_a_wide_matrix_are_reduced_and_scattered(got, run):
    n = run.device_count
    wide = WIDE.on(run)
    partial = np.concatenate([b.sum(axis=0) for b in np.split(wide, n)])
    expect_close_naming_mistakes(
        got,
        wide.sum(axis=0),
        {
            f"On {n} devices those are each device's column sums of its own rows, never added together: "
            "jax.lax.psum_scatter(..., 'data', scatter_dimension=0, tiled=True) adds them and scatters the result": partial,
            f"On {n} devices that is {n} copies of the column sums: psum with out_specs=P('data') joins every "
            "device's full copy; psum_scatter leaves each device one slice": np.tile(wide.sum(axis=0), n),
        },
    )
    expect_split_across(
        got,
        n,
        axis=0,
        hint="psum_scatter(..., tiled=True) with out_specs=P('data') leaves "
        "each device its own slice of the sums",
    )


CUM = by_devices(RNG.normal(0.5, 1.0, size=64).astype(np.float32), shift=0.25)


@check(got=call("shard_map_cumsum", CUM))
def test_cumsum_continues_from_the_blocks_before(got, run):
    n = run.device_count
    cum = CUM.on(run)
    restart = np.concatenate([np.cumsum(b) for b in blocks(cum, n)])
    expect_close_naming_mistakes(
        got,
        np.cumsum(cum.astype(np.float64)),
        {
            f"On {n} devices every block's running total starts again from zero: add the totals of the devices "
            "before yours (jax.lax.all_gather of the block sums, and jax.lax.axis_index('data'))": restart,
        },
        rtol=1e-4,
        atol=1e-4,
    )


LONG_CUM = RNG.normal(0.0, 1.0, size=4096).astype(np.float32)  # a block of 512 numbers on eight devices


@check(got=compiled_call("shard_map_cumsum", LONG_CUM))
def test_cumsum_sends_a_few_numbers_per_device_not_blocks(got, run):
    expect_close(got, np.cumsum(LONG_CUM.astype(np.float64)), rtol=1e-4, atol=1e-3)
    public.expect_a_few_numbers_sent(got, run.device_count, LONG_CUM)


@check(got=compiled_call("shard_map_psum", PSUM))
def test_psum_gives_each_device_one_block_and_all_reduces_the_block_sums(got, run):
    public.expect_one_block_and_an_all_reduce(got, run.device_count)


# -- rows_to_columns, held to its budget: one all-to-all's traffic, and x never whole on a device --

# 64 KiB; a block of rows is 128 / n of them (on a larger pod its rows and columns grow, each copy shifted)
TILES = by_devices(RNG.normal(size=(128, 128)).astype(np.float32), shift=8.0, axis=(0, 1))
TILES_CALL = compiled_call("rows_to_columns", placed(TILES, ("data", None)))


@check(got=TILES_CALL)
def test_rows_to_columns_of_a_random_matrix(got, run):
    n = run.device_count
    tiles = TILES.on(run)
    expect_close_naming_mistakes(
        got,
        tiles,
        {
            "That is x transposed: the values stay where they are in x, only which device holds them changes": tiles.T,
        },
    )
    expect_split_across(got, n, axis=1, hint="Split the result by columns over 'data': P(None, 'data')")


@check(got=TILES_CALL)
def test_rows_to_columns_sends_at_most_what_one_all_to_all_sends(got, run):
    public.expect_one_all_to_all_sent(got, run.device_count, TILES.on(run))


@check(got=TILES_CALL)
def test_rows_to_columns_never_holds_the_whole_matrix_on_one_device(got, run):
    public.expect_never_whole(got, run.device_count, TILES.on(run))
