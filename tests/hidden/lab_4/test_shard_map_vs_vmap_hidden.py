"""Lab 4, hidden tests: a batch the student has not seen, and a shard_map route that only used device 0."""

import numpy as np

from labkit.checks import call, check, expect_close, expect_split_across

RNG = np.random.default_rng(4)
BATCH = RNG.normal(size=(64, 3)).astype(np.float32)


@check(got=call("shard_map_vs_vmap", BATCH))
def test_both_routes_agree_on_a_random_batch(got):
    sums = (BATCH.astype(np.float64) ** 2).sum(axis=1)
    expect_close(got, np.stack([sums, sums]), rtol=1e-5)


@check(got=call("shard_map_vs_vmap", BATCH))
def test_the_shard_map_route_spreads_the_rows_over_every_device(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=1,
        hint="The stack lives where the shard_map result lives. A mesh over jax.devices()[:1] computes every "
        "row on device 0: the numbers are right, but on eight devices seven sit idle. Build the mesh from "
        "jax.devices(), and keep both results as JAX arrays when you stack them",
    )
