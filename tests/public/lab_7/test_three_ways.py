"""Lab 7, public tests: the sigmoid layer as jit on sharded inputs, with sharding constraints, and with
shard_map plus psum; each right, each a full copy on every device, and all three equal."""

import numpy as np

from labkit.checks import (
    Mismatch,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_dtype,
    expect_replicated,
    expect_shape,
)

X = np.linspace(-1.0, 1.0, 32, dtype=np.float32)  # 32: divides by 1 to 32 devices
W = (np.arange(32 * 4, dtype=np.float32).reshape(32, 4) % 7 - 3.0) / 4
B = np.array([0.5, -0.25, 0.0, 1.0], dtype=np.float32)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def layer(x, w, b):
    return sigmoid(x.astype(np.float64) @ w.astype(np.float64) + b)


def shard_map_mistakes(x, w, b, n):
    """What the per-device program gives on n devices when the psum is missing or in the wrong place."""
    xs, ws = np.split(x.astype(np.float64), n), np.split(w.astype(np.float64), n)
    partial = [xi @ wi for xi, wi in zip(xs, ws)]
    return {
        f"That is device 0's partial product alone, as if there were no other devices: add the {n} partial "
        "products with jax.lax.psum(x_block @ w_block, 'data') before the bias and the sigmoid "
        "(check_vma=False lets a missing psum through)": sigmoid(partial[0] + b),
        "The sigmoid was applied before the psum, so the result adds up one sigmoid per device: psum the partial "
        "products first, then add b and apply the sigmoid": sum(sigmoid(p + b) for p in partial),
        f"b was added on every device before the psum, so it counts {n} times: add b after the psum":
            sigmoid(sum(partial) + n * b),
    }


PLACE = ("jit on arrays that live on one device runs on that device: put x and w on a mesh of every device "
         "with jax.device_put(..., NamedSharding(mesh, P('data'))) and P('data', None) before calling it")
CONSTRAIN = ("Constrain x and w inside the jitted function with jax.lax.with_sharding_constraint, using "
             "NamedShardings over a mesh built from jax.devices()")
REPLICATE = "After the psum every device holds the result: out_specs=P(), on a mesh built from jax.devices()"


@check(got=call("layer_jit", X, W, B))
def test_jit_computes_the_layer(got):
    expect_close(got, layer(X, W, B), atol=1e-6)


@check(got=call("layer_jit", X, W, B))
def test_jit_result_is_a_full_copy_on_every_device(got, run):
    expect_shape(got, (4,))
    expect_dtype(got, "float32")
    expect_replicated(got, run.device_count, hint=PLACE)


@check(got=call("layer_constrained", X, W, B))
def test_constrained_computes_the_layer(got):
    expect_close(got, layer(X, W, B), atol=1e-6)


@check(got=call("layer_constrained", X, W, B))
def test_constrained_result_is_a_full_copy_on_every_device(got, run):
    expect_shape(got, (4,))
    expect_replicated(got, run.device_count, hint=CONSTRAIN)


@check(got=compiled_call("layer_shard_map", X, W, B))
def test_shard_map_computes_the_layer(got, run):
    expect_close_naming_mistakes(got, layer(X, W, B), shard_map_mistakes(X, W, B, run.device_count), atol=1e-6)


@check(got=call("layer_shard_map", X, W, B))
def test_shard_map_result_is_a_full_copy_on_every_device(got, run):
    expect_shape(got, (4,), hint="psum the (f,) partial products; do not stack them")
    expect_replicated(got, run.device_count, hint=REPLICATE)


# -- stretch (not graded: points=0): layer_batched, a batch on a 2-D mesh ----------------------

XB = np.linspace(-1.0, 1.0, 32 * 64, dtype=np.float32).reshape(32, 64)  # 32 rows, 64 columns: divide by any grid
WB = (np.arange(64 * 16, dtype=np.float32).reshape(64, 16) % 5 - 2.0) / 8
BB = np.linspace(-0.5, 0.5, 16, dtype=np.float32)


def grid_shape(n: int) -> tuple[int, int]:
    """The stretch's grid: (2, n // 2) when n is even, else (1, n)."""
    return (2, n // 2) if n % 2 == 0 else (1, n)


def batched_mistakes(x, w, b, n):
    """What layer_batched gives on n devices when the partial products are not added over 'model'."""
    _, cols = grid_shape(n)
    k = x.shape[1] // cols
    device_0 = sigmoid(x[:, :k].astype(np.float64) @ w[:k].astype(np.float64) + b)
    return {f"Each row used only the first 1/{cols} of its features: add the partial products over 'model' with "
            "jax.lax.psum(x_block @ w_block, 'model') (check_vma=False lets a missing psum through)": device_0}


def expect_rows_split_along_data(got, n: int) -> None:
    """On an a x b grid, a (B, f) result split along 'data': a distinct row blocks, each held by the b devices of a row."""
    a, cols = grid_shape(n)
    sh = got.sharding
    if sh is None:
        raise Mismatch("expected a JAX array placed on devices, got a plain (numpy or Python) value")
    holders: dict = {}
    for s in sh.shards:
        holders.setdefault(tuple(map(tuple, s["index"])), set()).add(s["device"])
    copies = sorted({len(d) for d in holders.values()})
    if sh.num_devices != n or len(holders) != a or copies != [cols]:
        raise Mismatch(
            f"expected the result on all {n} devices as {a} block(s) of rows, each held by the {cols} device(s) of "
            f"one grid row; got {len(holders)} block(s) held by {copies} device(s) each, on {sh.num_devices} "
            f"device(s) ({sh.describe()}). Build the ('data', 'model') grid from all of jax.devices() and return "
            "with out_specs=P('data', None)")


@check(points=0, got=call("layer_batched", XB, WB, BB))
def test_layer_batched_equals_the_layer_of_every_row(got, run):
    want = sigmoid(XB.astype(np.float64) @ WB.astype(np.float64) + BB)
    expect_close_naming_mistakes(got, want, batched_mistakes(XB, WB, BB, run.device_count), rtol=1e-5, atol=1e-6)


@check(points=0, got=call("layer_batched", XB, WB, BB))
def test_layer_batched_keeps_the_rows_split_along_data(got, run):
    expect_rows_split_along_data(got, run.device_count)
