"""Lab 6, hidden tests: other seeds and shapes, and the mistakes only several devices reveal.

A loss computed over the whole batch on every device (every in_spec P(), no pmean) is right
everywhere; the compiled program shows it: x and y whole on each device, and no all-reduce. The
grid exercise (linear_grid) is held to its budget the same way: what each device holds of x and of
the kernel, its share of the products, and no collective at all.
"""

import numpy as np

from labkit.checks import (
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_shape,
    expect_split_across,
    public_tests,
)

RNG = np.random.default_rng(6)
# 32 rows, as written on 1 to 32 devices; copies on a larger pod (each 0.25 higher) until the rows divide
ROWS = RNG.normal(size=(32, 5)).astype(np.float32)  # the worked example's batch, never split over the devices
X = by_devices(ROWS, shift=0.25)
Y = by_devices(RNG.normal(size=(32, 2)).astype(np.float32), shift=0.25)


_public = public_tests(__file__)  # the public tests' inputs and helpers
nnx_linears, layer = _public.nnx_linears, _public.layer


@check(points=0, got=call("shard_map_simulate", 11.0, ROWS, 8.0, 2.0))  # a worked example: a check of it
def test_simulate_builds_the_model_once_for_eight_shards(got):
    shards = np.split(ROWS.astype(np.float64), 8)
    rebuilt = np.concatenate([s @ k + b for s, (k, b) in zip(shards, nnx_linears(11, 5, 2, count=8))])
    expect_close_naming_mistakes(
        got,
        layer(11, ROWS, 2).reshape(-1),
        {
            "Each of the 8 shards ran a different model: the layer was built inside the loop from a shared "
            "nnx.Rngs. Build it once, before the loop": rebuilt.reshape(-1),
        },
        atol=1e-5,
    )


@check(got=call("shard_map_linear", 9, X, 2))
def test_linear_keeps_the_rows_of_each_device_on_that_device(got, run):
    n, x = run.device_count, X.on(run)
    want = layer(9, x, 2)
    expect_close_naming_mistakes(
        got,
        want,
        {
            f"Those are only device 0's {len(x) // n} rows: out_specs=P() promises every device holds the same "
            "value, but each device holds different rows. Use out_specs=P('data', None)": np.split(want, n)[
                0
            ],
        },
        atol=1e-5,
    )
    expect_split_across(
        got,
        n,
        axis=0,
        hint="Each device should run the layer on its own rows: a mesh over jax.devices()[:1] is "
        "right on one device and does all the work on device 0 when there are eight",
    )


@check(got=call("shard_map_mse", 13.0, X, Y, 2.0))
def test_mse_is_the_mean_over_the_rows_of_every_device(got, run):
    n = run.device_count
    errors = (layer(13, X.on(run), 2) - Y.on(run)) ** 2
    expect_close_naming_mistakes(
        got,
        errors.mean(),
        {
            f"On {n} devices that is the loss of device 0's rows alone, a local mean: average the per-device "
            "means with jax.lax.pmean(..., 'data'); with check_vma=False, shard_map does not catch a missing pmean": np.split(
                errors, n
            )[0].mean(),
        },
        rtol=1e-5,
        atol=1e-6,
    )


# Two exercises in one test: it lives here so that the check cell of the first never waits for the second.
@check(real=call("shard_map_linear", 2.0, X, 3.0), simulated=call("shard_map_simulate", 2.0, X, 8.0, 3.0))
def test_linear_equals_the_simulation(real, simulated, run):
    expect_shape(real, (len(X.on(run)), 3))
    expect_close(
        simulated,
        real.value.reshape(-1),
        atol=1e-5,
        hint="Both run nnx.Linear with the same seed on the same rows: they must agree",
    )


@check(got=compiled_call("shard_map_mse", 13.0, X, Y, 2.0))
def test_mse_gives_each_device_its_own_rows_and_averages_the_losses(got, run):
    _public.expect_own_rows_and_a_mean(got, run.device_count)


# -- exercise 4: linear_grid, held to its budget ---------------------------------------------

# A wider layer: x is 16 KiB, the kernel 16 KiB, and a device's share of either 2 KiB on eight devices.
XW = RNG.normal(size=(128, 32)).astype(np.float32)
GRID_PARAMS, (GRID_KERNEL, GRID_BIAS) = _public.grid_params(17, 32, 128)
GRID_CALL = compiled_call("linear_grid", XW, GRID_PARAMS)


@check(got=call("linear_grid", XW, GRID_PARAMS))
def test_linear_grid_of_a_wider_layer(got, run):
    expect_close(got, XW.astype(np.float64) @ GRID_KERNEL + GRID_BIAS, rtol=1e-5, atol=1e-5)
    _public.expect_blocks_on_the_grid(got, run.device_count)


@check(got=GRID_CALL)
def test_linear_grid_holds_only_its_rows_of_x_and_its_columns_of_the_kernel(got, run):
    _public.expect_rows_and_columns_held(got, run.device_count)


@check(got=GRID_CALL)
def test_linear_grid_computes_only_its_share_of_the_products(got, run):
    _public.expect_a_share_of_the_products(got, run.device_count, XW, GRID_KERNEL)


@check(got=GRID_CALL)
def test_linear_grid_communicates_nothing(got, run):
    _public.expect_no_collective(got, run.device_count)
