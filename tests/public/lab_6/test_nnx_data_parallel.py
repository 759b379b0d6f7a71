"""Lab 6, public tests: one nnx.Linear, simulated shard by shard, through jax.shard_map, then on a grid.

shard_map_simulate is a worked example, written in the notebook: its tests check the example and
are worth no points.

The expected values come from Flax itself, here in the judge: nnx.Linear with the same seed gives
the same parameters the student's model starts with. JAX is kept on the CPU for that, so the judge
never takes an accelerator that a notebook run needs. The budgets read from the compiled program (the loss
on each device's own rows, and linear_grid's rows, columns, share of the products and no collective) are
held here on these inputs, and by the hidden tests on others with the same helpers and words.
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_collective,
    expect_collectives_within,
    expect_dtype,
    expect_input_split,
    expect_replicated,
    expect_shape,
    expect_split_across,
    expect_work_share,
)

ONE_DEVICE = "A mesh over jax.devices()[:1] keeps everything on device 0: build it from jax.devices()"


def nnx_linears(seed, in_dim, features, count=1):
    """The (kernel, bias) of `count` nnx.Linear layers drawn one after another from one nnx.Rngs(seed)."""
    import jax

    if not jax.config.jax_platforms:  # the judge: keep off any accelerator a notebook run needs
        jax.config.update("jax_platforms", "cpu")  # (a kernel that already chose its platforms keeps them)
    from flax import nnx

    rngs = nnx.Rngs(int(seed))
    layers = [nnx.Linear(int(in_dim), int(features), rngs=rngs) for _ in range(count)]
    return [(np.asarray(m.kernel[...], np.float64), np.asarray(m.bias[...], np.float64)) for m in layers]


def layer(seed, x, features):
    ((kernel, bias),) = nnx_linears(seed, x.shape[-1], features)
    return x.astype(np.float64) @ kernel + bias


def rebuilt_per_shard(seed, x, num_shards, features):
    """What the loop gives when it builds a new layer for every shard from one shared nnx.Rngs."""
    shards = np.split(x.astype(np.float64), int(num_shards))
    params = nnx_linears(seed, x.shape[-1], features, count=int(num_shards))
    return np.concatenate([s @ k + b for s, (k, b) in zip(shards, params)]).reshape(-1)


REBUILT = (
    "Each shard ran a different model: the layer was built inside the loop, drawing new parameters "
    "for every shard. Build it once, before the loop, and call that same model on every shard"
)
NOT_FLAT = "That is the (N, features) output before flattening: return out.reshape(-1)"

# 32 rows: they divide over 1 to 32 devices. The worked example takes them as written; the exercises that split
# them over every device take X, copies of them on a larger pod (each 0.125 higher) until the rows divide.
ROWS = (np.arange(32 * 4, dtype=np.float32).reshape(32, 4) % 5 - 2.0) / 2
X = by_devices(ROWS, shift=0.125)


# -- shard_map_simulate (a worked example: its tests are worth no points) ----------------------


@check(points=0, got=call("shard_map_simulate", 3.0, ROWS, 4.0, 3.0))
def test_simulate_equals_the_layer_on_the_whole_batch(got):
    want = layer(3, ROWS, 3)
    expect_close_naming_mistakes(
        got, want.reshape(-1), {REBUILT: rebuilt_per_shard(3, ROWS, 4, 3), NOT_FLAT: want}, atol=1e-5
    )


@check(points=0, got=call("shard_map_simulate", 3.0, ROWS, 4.0, 3.0))
def test_simulate_returns_one_flat_float32_vector(got):
    expect_shape(got, (32 * 3,), hint="Join the shards with jnp.concatenate(outs, axis=0), then reshape(-1)")
    expect_dtype(got, "float32")


@check(
    points=0,
    one=call("shard_map_simulate", 1.0, ROWS, 1.0, 2.0),
    eight=call("shard_map_simulate", 1.0, ROWS, 8.0, 2.0),
)
def test_simulate_gives_the_same_answer_for_any_number_of_shards(one, eight):
    expect_close_naming_mistakes(
        eight, layer(1, ROWS, 2).reshape(-1), {REBUILT: rebuilt_per_shard(1, ROWS, 8, 2)}, atol=1e-5
    )
    expect_close(eight, one.value, atol=1e-5, hint="With one model the split cannot change the answer")


# -- shard_map_linear -----------------------------------------------------------------------


@check(got=call("shard_map_linear", 4, X, 3))
def test_linear_applies_the_seeded_layer_to_every_row(got, run):
    expect_close(
        got,
        layer(4, X.on(run), 3),
        atol=1e-5,
        hint="Build nnx.Linear(x.shape[-1], features, rngs=nnx.Rngs(seed)) and give its state in_specs=P()",
    )


@check(got=call("shard_map_linear", 4, X, 3))
def test_linear_rows_are_split_across_every_device(got, run):
    expect_shape(got, (len(X.on(run)), 3))
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- shard_map_mse --------------------------------------------------------------------------

# X's targets, grown with it (each copy 0.25 higher)
CUBED = np.linspace(-1.0, 1.0, 32 * 3, dtype=np.float32).reshape(32, 3)
# x * x * x, not x ** 3: numpy's power is not rounded alike on every processor, and a call's id is its inputs' bytes
Y = by_devices(CUBED * CUBED * CUBED * 4, shift=0.25)


@check(got=compiled_call("shard_map_mse", 6, X, Y, 3))
def test_mse_averages_over_the_whole_batch(got, run):
    errors = (layer(6, X.on(run), 3) - Y.on(run)) ** 2
    first = np.split(errors, run.device_count)[0].mean()
    expect_close_naming_mistakes(
        got,
        errors.mean(),
        {
            "That is the loss of device 0's rows alone: average the per-device means with jax.lax.pmean(..., 'data')": first,
        },
        rtol=1e-5,
        atol=1e-6,
    )


@check(got=call("shard_map_mse", 6, X, Y, 3))
def test_mse_is_a_scalar_held_by_every_device(got, run):
    expect_shape(got, (), hint="Reduce each device's errors to one number with jnp.mean")
    expect_dtype(got, "float32")
    expect_replicated(
        got,
        run.device_count,
        hint="After pmean every device holds the loss: out_specs=P(), on a mesh built from jax.devices()",
    )


def expect_own_rows_and_a_mean(got, n: int) -> None:
    """x and y split by rows (1/n on each device), and the per-device losses averaged by an all-reduce."""
    hint = (
        "Every device computes the loss of the whole batch: that is not data parallelism. Give x and y "
        "in_specs=P('data', None), so that each device takes its own rows, and average the per-device losses "
        "with jax.lax.pmean(..., 'data')"
    )
    expect_input_split(got, 1, n, name="x", hint=hint)
    expect_input_split(got, 2, n, name="y", hint=hint)
    expect_collective(
        got, "all-reduce", n, hint="The per-device losses are averaged by jax.lax.pmean(..., 'data')"
    )


@check(got=compiled_call("shard_map_mse", 6, X, Y, 3))
def test_mse_takes_the_rows_of_each_device_and_averages_the_losses(got, run):
    expect_own_rows_and_a_mean(got, run.device_count)


# -- linear_grid ----------------------------------------------------------------------------


def grid_shape(n: int) -> tuple[int, int]:
    """The exercise's grid: (2, n // 2) when n is even, else (1, n)."""
    return (2, n // 2) if n % 2 == 0 else (1, n)


def grid_params(seed, in_dim, features):
    """An nnx.Linear's state as the plain dict linear_grid takes, and the same (kernel, bias) in float64."""
    ((kernel, bias),) = nnx_linears(seed, in_dim, features)
    return {"kernel": kernel.astype(np.float32), "bias": bias.astype(np.float32)}, (kernel, bias)


def expect_blocks_on_the_grid(got, n: int) -> None:
    """An (N, f) result in P('data', 'model'): device (i, j) of the grid holds rows block i, features block j."""
    sh = got.sharding
    if sh is None:
        raise Mismatch("expected a JAX array placed on devices, got a plain (numpy or Python) value")
    a, m = grid_shape(n)
    rows, cols = got.shape[0] // a, got.shape[1] // m
    want = sorted(
        ((i * rows, (i + 1) * rows), (j * cols, (j + 1) * cols)) for i in range(a) for j in range(m)
    )
    blocks = sorted(tuple(map(tuple, s["index"])) for s in sh.shards)
    if sh.num_devices != n or blocks != want:
        raise Mismatch(
            f"expected the result on all {n} devices of the {a} x {m} grid, its rows split over 'data' and its "
            f"features over 'model': a block of {rows} rows by {cols} features on each device, no two the same; "
            f"got {sh.describe()}. The result's spec is P('data', 'model'), on a grid of all of jax.devices()"
        )


XG = (np.arange(16 * 6, dtype=np.float32).reshape(16, 6) % 7 - 3.0) / 3  # 16 rows: two blocks on any grid
# 32 features: they divide over 'model' on 1 to 32 devices. On a larger pod ('model' is 128 on the 2 x 128 grid
# of 256 devices) the run gets 256: copies of the kernel's columns and of the bias, each copy 0.0625 higher
SEEDED, _ = grid_params(5, 6, 32)
PARAMS = {
    "kernel": by_devices(SEEDED["kernel"], shift=0.0625, axis=1),
    "bias": by_devices(SEEDED["bias"], shift=0.0625),
}


@check(got=call("linear_grid", XG, PARAMS))
def test_linear_grid_applies_the_layer_to_every_row(got, run):
    kernel, bias = (PARAMS[k].on(run).astype(np.float64) for k in ("kernel", "bias"))
    expect_shape(got, (16, kernel.shape[1]))
    expect_dtype(got, "float32")
    expect_close(
        got,
        XG.astype(np.float64) @ kernel + bias,
        atol=1e-5,
        hint="Every row of x goes through the layer whose state is params: x @ kernel + bias",
    )


@check(got=call("linear_grid", XG, PARAMS))
def test_linear_grid_leaves_each_block_of_rows_and_features_on_its_own_device(got, run):
    expect_blocks_on_the_grid(got, run.device_count)


# linear_grid's budget on a wider layer: x is 16 KiB, the kernel 16 KiB, and a device's share of either 2 KiB
# on eight devices, so that a whole copy of either stands out.
XW = np.linspace(-2.0, 2.0, 128 * 32, dtype=np.float32).reshape(128, 32)
WIDE_PARAMS, (WIDE_KERNEL, _) = grid_params(9, 32, 128)
WIDE_CALL = compiled_call("linear_grid", XW, WIDE_PARAMS)


def expect_rows_and_columns_held(got, n: int) -> None:
    """Each device holds 1/a of x (its rows) and 1/m of the kernel (its columns), on the a x m grid."""
    a, m = grid_shape(n)
    expect_input_split(
        got,
        0,
        a,
        name="x",
        hint=f"Each device needs only the rows of its block of the result: 1/{a} of x, cut along "
        "'data' and copied along 'model'",
    )
    expect_input_split(
        got,
        "args[1]['kernel']",
        m,
        name="the kernel",
        hint=f"Each device needs only the columns of the kernel (and the numbers of the bias) for its "
        f"block of features: 1/{m} of it, cut along 'model'",
    )


def expect_a_share_of_the_products(got, n: int, x, kernel) -> None:
    """One device's FLOPs within 1.5 times its 1/n share of x @ kernel."""
    expect_work_share(
        got,
        2.0 * x.shape[0] * kernel.size,
        n,
        what="x @ kernel for the whole batch",
        hint="Each device should compute only its own block of the result: its rows times its columns "
        "of the kernel, not a larger block it then slices",
    )


def expect_no_collective(got, n: int) -> None:
    expect_collectives_within(
        got,
        [{d} for d in range(n)],
        allowed="(none: every device has what its block needs)",
        hint="Each number of the result needs one row of x and one column of the kernel: a device that holds its "
        "rows and its columns computes its whole block alone, with nothing to add up or gather",
    )


@check(got=WIDE_CALL)
def test_linear_grid_holds_its_own_rows_of_x_and_columns_of_the_kernel(got, run):
    expect_rows_and_columns_held(got, run.device_count)


@check(got=WIDE_CALL)
def test_linear_grid_computes_its_own_block_of_the_products(got, run):
    expect_a_share_of_the_products(got, run.device_count, XW, WIDE_KERNEL)


@check(got=WIDE_CALL)
def test_linear_grid_sends_nothing(got, run):
    expect_no_collective(got, run.device_count)
