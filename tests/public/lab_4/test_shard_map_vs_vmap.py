"""Lab 4, public tests: `shard_map_vs_vmap(x)` stacks the per-row sums of squares computed by shard_map and by vmap;
`distances_to_anchors(x, anchors)`, a design, is held to its budget read from the compiled program."""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_array,
    expect_close,
    expect_dtype,
    expect_input_split,
    expect_sent_within,
    expect_shape,
    expect_split_across,
    expect_work_share,
    placed,
)
from labkit.judge import plaindata

# 32 rows: they divide over 1 to 32 devices; on a larger pod the run gets copies, each 0.25 higher
X = by_devices(np.linspace(-2.0, 2.0, 32 * 4, dtype=np.float32).reshape(32, 4), shift=0.25)
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
def test_returns_the_two_results_stacked(got, run):
    expect_shape(
        got, (2, X.on(run).shape[0]), hint="Stack the two length-B results with jnp.stack([sm, vm], axis=0)"
    )


@check(got=call("shard_map_vs_vmap", X))
def test_keeps_the_dtype(got):
    expect_dtype(got, "float32")


@check(got=call("shard_map_vs_vmap", X))
def test_row_0_is_the_shard_map_sum_of_squares(got, run):
    x = X.on(run)
    expect_close(
        row(got, 0, x.shape[0]),
        both_ways(x)[0],
        rtol=1e-5,
        hint="Inside the shard_map body, vmap the per-row sum over the device's block of rows",
    )


@check(got=call("shard_map_vs_vmap", X))
def test_row_1_is_the_vmap_sum_of_squares(got, run):
    x = X.on(run)
    expect_close(row(got, 1, x.shape[0]), both_ways(x)[1], rtol=1e-5)


@check(got=call("shard_map_vs_vmap", X))
def test_the_shard_map_rows_are_spread_over_every_device(got, run):
    expect_shape(
        got, (2, X.on(run).shape[0]), hint="Stack the two length-B results with jnp.stack([sm, vm], axis=0)"
    )
    expect_split_across(
        got,
        run.device_count,
        axis=1,
        hint=ONE_DEVICE + ". The stack lives where the shard_map result lives: keep both results "
        "as JAX arrays when you stack them",
    )


@check(got=call("shard_map_vs_vmap", placed(X, ("data", None))))
def test_accepts_an_input_that_is_already_split_by_rows(got, run):
    expect_close(got, both_ways(X.on(run)), rtol=1e-5)


# -- exercise 2: distances_to_anchors, a design held to its budget ----------------------------

# 128 rows divide over 1 to 32 devices (on a larger pod the run gets copies, each 0.5 higher); 8 anchors cut over
# 8 devices leave one on each. Every device gets all the anchors: they stay as written on every pod.
POINTS = by_devices(np.random.default_rng(40).normal(size=(128, 16)).astype(np.float32), shift=0.5)
ANCHORS = np.random.default_rng(41).normal(size=(8, 16)).astype(np.float32)
DISTANCES_CALL = compiled_call("distances_to_anchors", POINTS, ANCHORS)


def distance_flops(x: np.ndarray, anchors: np.ndarray) -> float:
    """For each row, anchor and feature: a subtraction, a square and an addition."""
    return 3.0 * x.shape[0] * anchors.shape[0] * x.shape[1]


ANCHORS_CUT = (
    "This is what comes back when the anchors are cut along with x (in_specs P('data') for both): each device "
    "compares its rows only with its own slice of the anchors. Every row needs every anchor; the anchors are "
    "small, so give every device all of them (P())"
)
VMAP_ALONE = (
    "jax.vmap knows nothing of devices: alone, it computes every row on the one device x lives on. Give each "
    "device its own rows of x over a mesh of all of jax.devices() (shard_map's specs, or jit's shardings), so "
    "that the result comes back split by rows, not whole on one device or copied on every one"
)
X_WHOLE = (
    "Each device needs only its own rows of x to compute its rows of the result: cut x by rows (P('data')). "
    "Handing x whole to every device (in_specs P() for x) makes each hold all of it"
)
NOTHING_TO_SEND = (
    "A row's distances need that row and the anchors, nothing else: a device that holds its rows of x and "
    "every anchor needs nothing from the others. No psum or all_gather, and no input cut one way where the "
    "program needs it another (anchors cut by rows have to be gathered back)"
)
EVERY_ROW_EVERYWHERE = (
    "Each device should compute the distances of its own rows only. A device that computes every row's "
    "distances and keeps its own rows of them does the work of all the devices"
)


def squared_distances(x: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """Entry [i, k]: the squared Euclidean distance from row i of x to anchor k, in float64."""
    return ((x.astype(np.float64)[:, None, :] - anchors.astype(np.float64)[None, :, :]) ** 2).sum(axis=2)


def anchors_cut_with_x(x: np.ndarray, anchors: np.ndarray, n: int) -> list[np.ndarray]:
    """What a shard_map that cuts the anchors with x gives on n devices: device i's rows against device i's anchors,
    its blocks glued by rows (out_specs P('data')) or by columns (out_specs P(None, 'data'))."""
    if n <= 1 or x.shape[0] % n or anchors.shape[0] % n:
        return []
    blocks = [squared_distances(rows, mine) for rows, mine in zip(np.split(x, n), np.split(anchors, n))]
    return [np.concatenate(blocks, axis=0), np.concatenate(blocks, axis=1)]


def expect_distances(got, x: np.ndarray, anchors: np.ndarray, devices: int) -> None:
    """The (B, K) squared distances, float32; the anchors cut along with x named where the result is what that gives."""
    arr = expect_array(got)
    want = squared_distances(x, anchors)
    for cut in anchors_cut_with_x(x, anchors, devices):
        if arr.shape == cut.shape != want.shape and np.allclose(arr, cut, rtol=1e-4, atol=1e-4):
            raise Mismatch(f"expected shape {want.shape}, got shape {arr.shape}. {ANCHORS_CUT}")
    expect_close(
        got,
        want,
        rtol=1e-5,
        atol=1e-4,
        hint="Entry [i, k] is the sum over features of (x[i] - anchors[k]) ** 2: every row of x against every anchor",
    )
    expect_dtype(got, "float32")


@check(got=DISTANCES_CALL)
def test_distances_to_anchors_gives_every_squared_distance(got, run):
    expect_distances(got, POINTS.on(run), ANCHORS, run.device_count)


@check(got=DISTANCES_CALL)
def test_distances_to_anchors_leaves_its_rows_split_over_every_device(got, run):
    expect_shape(got, (POINTS.on(run).shape[0], ANCHORS.shape[0]))
    expect_split_across(got, run.device_count, axis=0, hint=VMAP_ALONE)


def expect_a_program_of_every_device(got, devices: int) -> None:
    """The compiled program runs on all the devices: one of a single device holds all of x and does all the work,
    which the checks of what each device holds and computes would word as every device doing it."""
    facts = got.compiled
    if devices > 1 and isinstance(facts, plaindata.Compiled) and facts.devices < devices:
        raise Mismatch(
            f"the compiled program runs on {facts.devices} of the {devices} devices: that device holds all of x "
            f"and computes every distance, while the others sit idle. {VMAP_ALONE}"
        )


@check(got=DISTANCES_CALL)
def test_distances_to_anchors_holds_only_its_rows_of_x(got, run):
    expect_a_program_of_every_device(got, run.device_count)
    expect_input_split(got, 0, run.device_count, name="x", hint=X_WHOLE)


@check(got=DISTANCES_CALL)
def test_distances_to_anchors_sends_nothing(got, run):
    expect_sent_within(
        got,
        0,
        run.device_count,
        what="every device has the rows and anchors its part of the result needs",
        hint=NOTHING_TO_SEND,
    )


@check(got=DISTANCES_CALL)
def test_distances_to_anchors_computes_only_its_share(got, run):
    expect_a_program_of_every_device(got, run.device_count)
    expect_work_share(
        got,
        distance_flops(POINTS.on(run), ANCHORS),
        run.device_count,
        slack=1.5,
        what="the distances of every row to every anchor",
        hint=EVERY_ROW_EVERYWHERE,
    )
