"""Lab 4, public tests: `shard_map_vs_vmap(x)` stacks the per-row sums of squares computed by shard_map and by vmap."""

import numpy as np

from labkit.checks import (
    call,
    check,
    compiled_call,
    expect_close,
    expect_dtype,
    expect_shape,
    expect_split_across,
    placed,
)
from labkit.judge import plaindata

X = np.linspace(-2.0, 2.0, 32 * 4, dtype=np.float32).reshape(32, 4)  # 32 rows: divides by 1 to 32 devices
ONE_DEVICE = (
    "A mesh over jax.devices()[:1] gives the right numbers with every row computed on device 0: "
    "build the mesh from jax.devices()"
)


def both_ways(x: np.ndarray) -> np.ndarray:
    sums = (x.astype(np.float64) ** 2).sum(axis=1)
    return np.stack([sums, sums]).astype(x.dtype)


def row(got, i: int, batch: int) -> plaindata.Value:
    """Row i of the (2, B) result, as a value the expectations read."""
    expect_shape(got, (2, batch), hint="Stack the two length-B results with jnp.stack([sm, vm], axis=0)")
    return plaindata.Value("array", got.value[i], dtype=got.dtype, shape=tuple(got.value[i].shape))


@check(got=compiled_call("shard_map_vs_vmap", X))
def test_returns_the_two_results_stacked(got):
    expect_shape(got, (2, X.shape[0]), hint="Stack the two length-B results with jnp.stack([sm, vm], axis=0)")


@check(got=call("shard_map_vs_vmap", X))
def test_keeps_the_dtype(got):
    expect_dtype(got, "float32")


@check(got=call("shard_map_vs_vmap", X))
def test_row_0_is_the_shard_map_sum_of_squares(got):
    expect_close(
        row(got, 0, X.shape[0]),
        both_ways(X)[0],
        rtol=1e-5,
        hint="Inside the shard_map body, vmap the per-row sum over the device's block of rows",
    )


@check(got=call("shard_map_vs_vmap", X))
def test_row_1_is_the_vmap_sum_of_squares(got):
    expect_close(row(got, 1, X.shape[0]), both_ways(X)[1], rtol=1e-5)


@check(got=call("shard_map_vs_vmap", X))
def test_the_shard_map_rows_are_spread_over_every_device(got, run):
    expect_shape(got, (2, X.shape[0]), hint="Stack the two length-B results with jnp.stack([sm, vm], axis=0)")
    expect_split_across(
        got,
        run.device_count,
        axis=1,
        hint=ONE_DEVICE + ". The stack lives where the shard_map result lives: keep both results "
        "as JAX arrays when you stack them",
    )


@check(got=call("shard_map_vs_vmap", placed(X, ("data", None))))
def test_accepts_an_input_that_is_already_split_by_rows(got):
    expect_close(got, both_ways(X), rtol=1e-5)
