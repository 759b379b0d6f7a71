"""Lab 4, hidden tests: a batch the student has not seen, and a shard_map route that only used device 0;
distances_to_anchors on a batch and anchors of other shapes, its result still split by rows."""

import numpy as np

from labkit.checks import by_devices, call, check, expect_close, expect_split_across

RNG = np.random.default_rng(4)
BATCH = by_devices(RNG.normal(size=(64, 3)).astype(np.float32), shift=0.25)  # 64 rows; copies on larger pods


@check(got=call("shard_map_vs_vmap", BATCH))
def test_both_routes_agree_on_a_random_batch(got, run):
    sums = (BATCH.on(run).astype(np.float64) ** 2).sum(axis=1)
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


# -- distances_to_anchors: a batch and anchors of other shapes ---------------------------------

CASE = np.random.default_rng(44)
# 96 rows: they divide over 1 to 32 devices; on a larger pod the run gets copies, each 1.0 higher
POINTS = by_devices((3 * CASE.normal(size=(96, 5))).astype(np.float32), shift=1.0)
ANCHORS = CASE.normal(size=(3, 5)).astype(np.float32)  # 3 anchors: no device count above 3 divides them


@check(got=call("distances_to_anchors", POINTS, ANCHORS))
def test_distances_to_anchors_of_a_new_batch(got, run):
    points = POINTS.on(run)
    want = ((points.astype(np.float64)[:, None, :] - ANCHORS.astype(np.float64)[None, :, :]) ** 2).sum(axis=2)
    expect_close(
        got,
        want,
        rtol=1e-5,
        atol=1e-4,
        hint="Every row of x against every anchor, whatever B, K and d are: nothing may assume the shapes of "
        "the public tests (K anchors need not divide over the devices)",
    )


@check(got=call("distances_to_anchors", POINTS, ANCHORS))
def test_distances_to_anchors_of_a_new_batch_stay_split_by_rows(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="Each device should hold its own B / n rows of the result, over a mesh of all of jax.devices(): "
        "jax.vmap alone leaves them on one device, and a copy on every device means that every row was computed "
        "or gathered on every device",
    )
