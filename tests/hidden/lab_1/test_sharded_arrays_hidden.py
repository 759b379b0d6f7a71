"""Lab 1, hidden tests: shapes the student has not seen, and placements that only look right on one device."""

import numpy as np

from labkit.checks import (
    by_devices,
    call,
    check,
    expect_close,
    expect_replicated,
    expect_split_across,
    placed,
    public_tests,
)

_public = public_tests(__file__)  # the public tests' inputs and helpers

RNG = np.random.default_rng(1)
TALL = RNG.normal(size=(64, 3)).astype(np.float32)
SQUARE = RNG.normal(size=(32, 48)).astype(np.float32)
VECTOR = RNG.normal(size=(40,)).astype(np.float32)  # replicated, never cut: the same on every pod
# Inputs cut over every device: as drawn on 1 to 32 devices; on a larger pod, copies (each shifted) of TALL's
# rows, and of SQUARE's columns, which the grid cuts n / 2 ways (128 of a 2 x 128 grid on 256 devices)
TALL_ROWS = by_devices(TALL, shift=0.5)
SQUARE_TILES = by_devices(SQUARE, shift=1.0, axis=1, grid_rows=2)


@check(got=call("shard_rows", TALL_ROWS))
def test_shard_rows_of_a_tall_random_matrix(got, run):
    expect_close(got, TALL_ROWS.on(run))
    expect_split_across(got, run.device_count, axis=0, hint=_public.ONE_DEVICE)


@check(got=call("replicate", VECTOR))
def test_replicate_gives_every_device_a_copy_not_only_device_0(got, run):
    expect_close(got, VECTOR)
    expect_replicated(
        got,
        run.device_count,
        hint="A mesh over jax.devices()[:1] (or an array never passed to jax.device_put) is replicated on one "
        "device and lives on device 0 alone when there are eight: build the mesh from jax.devices()",
    )


@check(got=call("shard_grid", SQUARE_TILES))
def test_shard_grid_of_a_rectangular_matrix(got, run):
    square = SQUARE_TILES.on(run)
    expect_close(got, square)
    _public.expect_tiles(got, run.device_count, square.shape)


@_public.ONE_PROCESS
@check(got=call("block_owners", placed(TALL_ROWS, ("data", None))))
def test_block_owners_of_a_tall_matrix(got, run):
    step = TALL_ROWS.on(run).shape[0] // run.device_count
    _public.expect_owners(
        got,
        [[d, d * step, (d + 1) * step] for d in range(run.device_count)],
        "Read the rows from shard.index[0].indices(x.shape[0]) of every addressable shard",
    )


# Stretch (not graded: points=0): columns cut along 'rows', a spec the public tests do not use.
@_public.ONE_PROCESS
@check(points=0, got=call("shard_shapes", SQUARE, [None, "rows"]))
def test_shard_shapes_of_columns_cut_along_rows_of_the_grid(got, run):
    _public.expect_layout(got, run.device_count, [None, "rows"], SQUARE.shape)
