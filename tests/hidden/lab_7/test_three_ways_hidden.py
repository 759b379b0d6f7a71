"""Lab 7, hidden tests: a wider layer, and the mistakes that only show on several devices.

A layer computed whole on every device (placements or specs of P()) gives the right values and a
full copy everywhere, as the split layer does; the compiled program tells them apart: what each
device stores of x and w, and the all-reduce that adds the partial products. The grid exercise
(layer_grid) is held to its budget the same way: which devices its collectives join, the FLOPs and
the bytes of one device.
"""

import numpy as np

from labkit.checks import (
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_replicated,
    public_tests,
)

# x and w's rows are split over every device: d = 64 on 1 to 32 devices, copies (each shifted) on a larger pod
RNG = np.random.default_rng(7)
X = by_devices(RNG.normal(size=64).astype(np.float32) / 4, shift=1 / 32)
W = by_devices(RNG.normal(size=(64, 6)).astype(np.float32) / 4, shift=-1 / 32)
B = RNG.normal(size=6).astype(np.float32)  # on every device: the same on every pod


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def want(run):
    """The layer of the inputs `run` got."""
    return sigmoid(X.on(run).astype(np.float64) @ W.on(run).astype(np.float64) + B)


@check(got=call("layer_shard_map", X, W, B))
def test_shard_map_adds_the_partial_products_of_every_device(got, run):
    n, x, w = run.device_count, X.on(run), W.on(run)
    partial = [
        xi @ wi for xi, wi in zip(np.split(x.astype(np.float64), n), np.split(w.astype(np.float64), n))
    ]
    expect_close_naming_mistakes(
        got,
        want(run),
        {
            f"On {n} devices that is device 0's partial product alone: the psum is missing (with check_vma=False, "
            "shard_map does not catch it). Add the partial products with jax.lax.psum(x_block @ w_block, 'data') "
            "before the bias and the sigmoid": sigmoid(partial[0] + B),
            f"On {n} devices the psum came after the sigmoid, adding {n} sigmoids: psum the partial products first": sum(
                sigmoid(p + B) for p in partial
            ),
            f"On {n} devices b was added on every device before the psum and counts {n} times: add it after the psum": sigmoid(
                sum(partial) + n * B
            ),
        },
        atol=1e-6,
    )


@check(got=call("layer_jit", X, W, B))
def test_jit_runs_on_every_device_when_the_inputs_are_placed(got, run):
    expect_close(got, want(run), atol=1e-6)
    expect_replicated(
        got,
        run.device_count,
        hint="jax.jit on unplaced inputs is right on one device and runs everything on device 0 when "
        "there are eight: jax.device_put x with P('data') and w with P('data', None) on a mesh "
        "of jax.devices() first",
    )


@check(got=call("layer_constrained", X, W, B))
def test_constraints_spread_the_layer_over_every_device(got, run):
    expect_close(got, want(run), atol=1e-6)
    expect_replicated(
        got,
        run.device_count,
        hint="Constraints to a mesh over jax.devices()[:1] are right on one device and keep the work "
        "on device 0 when there are eight: build the mesh from jax.devices()",
    )


# Three exercises in one test: it lives here so that the check cell of the first never waits for the others.
@check(
    jit=call("layer_jit", X, W, B),
    constrained=call("layer_constrained", X, W, B),
    mapped=call("layer_shard_map", X, W, B),
)
def test_the_three_approaches_agree(jit, constrained, mapped):
    expect_close(
        constrained, jit.value, atol=1e-6, hint="layer_constrained and layer_jit should give the same layer"
    )
    expect_close(
        mapped, jit.value, atol=1e-6, hint="layer_shard_map and layer_jit should give the same layer"
    )


def expect_layer_split(got, n, exercise):
    public_tests(__file__).expect_layer_split(got, n, exercise)  # the public tests' budget, in their words


@check(got=compiled_call("layer_jit", X, W, B))
def test_jit_splits_x_and_w_over_the_devices_and_adds_the_partial_products(got, run):
    expect_layer_split(got, run.device_count, "layer_jit")


@check(got=compiled_call("layer_constrained", X, W, B))
def test_constraints_split_x_and_w_over_the_devices_and_add_the_partial_products(got, run):
    expect_layer_split(got, run.device_count, "layer_constrained")


@check(got=compiled_call("layer_shard_map", X, W, B))
def test_shard_map_splits_x_and_w_over_the_devices_and_adds_the_partial_products(got, run):
    expect_layer_split(got, run.device_count, "layer_shard_map")


# -- exercise 4: layer_grid, held to its budget --------------------------------------------------

public = public_tests(__file__)  # the public tests' inputs and helpers

# A layer that narrows (d = 64 features to f = 16): x is 32 KiB, w 4 KiB, a tile of x 4 KiB on eight devices.
# A larger pod gets copies of x's rows and columns and of w's rows, as the public tests' (256 x 256 on 256 devices).
XH = by_devices(RNG.normal(size=(128, 64)).astype(np.float32) / 4, shift=1 / 64, axis=(0, 1))
WH = by_devices(RNG.normal(size=(64, 16)).astype(np.float32) / 4, shift=1 / 128)
BH = RNG.normal(size=16).astype(np.float32)


def grid_want(run):
    """The layer of every row of the batch `run` got."""
    return sigmoid(XH.on(run).astype(np.float64) @ WH.on(run).astype(np.float64) + BH)


GRID_CALL = compiled_call("layer_grid", public.tiled(XH), WH, BH)


@check(got=call("layer_grid", public.tiled(XH), WH, BH))
def test_layer_grid_of_a_random_batch(got, run):
    expect_close_naming_mistakes(
        got,
        grid_want(run),
        public.grid_mistakes(XH.on(run), WH.on(run), BH, run.device_count),
        rtol=1e-5,
        atol=1e-6,
    )
    public.expect_rows_split_over_every_device(got, run.device_count)


@check(got=GRID_CALL)
def test_layer_grid_communicates_only_over_model(got, run):
    public.expect_over_model_only(got, run.device_count)


@check(got=GRID_CALL)
def test_layer_grid_computes_only_its_share_of_the_products(got, run):
    public.expect_a_share_of_the_products(got, run.device_count, XH.on(run), WH.on(run))


@check(got=GRID_CALL)
def test_layer_grid_never_holds_the_whole_of_x(got, run):
    public.expect_x_never_whole(got, run.device_count, XH.on(run))


# -- stretch (not graded: points=0): layer_grid_w_in_pieces ------------------------------------


@check(points=0, got=compiled_call("layer_grid_w_in_pieces", public.tiled(XH), WH, BH))
def test_layer_grid_w_in_pieces_keeps_w_in_pieces_and_to_the_grid_budget(got, run):
    n, x, w = run.device_count, XH.on(run), WH.on(run)
    expect_close_naming_mistakes(got, grid_want(run), public.grid_mistakes(x, w, BH, n), rtol=1e-5, atol=1e-6)
    public.expect_rows_split_over_every_device(got, n)
    public.expect_w_in_pieces_within_the_grid_budget(got, n, x, w)
