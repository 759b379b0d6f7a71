"""Lab 6, hidden tests: other seeds and shapes, and the mistakes only several devices reveal.

A loss computed over the whole batch on every device (every in_spec P(), no pmean) is right
everywhere; the compiled program shows it: x and y whole on each device, and no all-reduce.
"""

import importlib.util
from pathlib import Path

import numpy as np

from labkit.checks import (
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_collective,
    expect_input_split,
    expect_shape,
    expect_split_across,
)

RNG = np.random.default_rng(6)
X = RNG.normal(size=(32, 5)).astype(np.float32)
Y = RNG.normal(size=(32, 2)).astype(np.float32)


# The public tests' reference computations (nnx_linears, layer), loaded by path so that this
# folder needs no package of its own.
_spec = importlib.util.spec_from_file_location(
    "_lab6_public", Path(__file__).resolve().parents[2] / "public" / "lab_6" / "test_nnx_data_parallel.py")
_public = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_public)
nnx_linears, layer = _public.nnx_linears, _public.layer


@check(got=call("shard_map_simulate", 11.0, X, 8.0, 2.0))
def test_simulate_builds_the_model_once_for_eight_shards(got):
    shards = np.split(X.astype(np.float64), 8)
    rebuilt = np.concatenate([s @ k + b for s, (k, b) in zip(shards, nnx_linears(11, 5, 2, count=8))])
    expect_close_naming_mistakes(got, layer(11, X, 2).reshape(-1), {
        "Each of the 8 shards ran a different model: the layer was built inside the loop from a shared "
        "nnx.Rngs. Build it once, before the loop": rebuilt.reshape(-1),
    }, atol=1e-5)


@check(got=call("shard_map_linear", 9, X, 2))
def test_linear_keeps_each_devices_rows_on_that_device(got, run):
    n = run.device_count
    want = layer(9, X, 2)
    expect_close_naming_mistakes(got, want, {
        f"Those are only device 0's {len(X) // n} rows: out_specs=P() promises every device holds the same "
        "value, but each device holds different rows. Use out_specs=P('data', None)": np.split(want, n)[0],
    }, atol=1e-5)
    expect_split_across(got, n, axis=0,
                        hint="Each device should run the layer on its own rows: a mesh over jax.devices()[:1] is "
                             "right on one device and does all the work on device 0 when there are eight")


@check(got=call("shard_map_mse", 13.0, X, Y, 2.0))
def test_mse_is_the_mean_over_the_rows_of_every_device(got, run):
    n = run.device_count
    errors = (layer(13, X, 2) - Y) ** 2
    expect_close_naming_mistakes(got, errors.mean(), {
        f"On {n} devices that is the loss of device 0's rows alone, a local mean: average the per-device "
        "means with jax.lax.pmean(..., 'data'); with check_vma=False, shard_map does not catch a missing pmean":
            np.split(errors, n)[0].mean(),
    }, rtol=1e-5, atol=1e-6)


# Two exercises in one test: it lives here so that the check cell of the first never waits for the second.
@check(real=call("shard_map_linear", 2.0, X, 3.0), simulated=call("shard_map_simulate", 2.0, X, 8.0, 3.0))
def test_linear_equals_the_simulation(real, simulated):
    expect_shape(real, (32, 3))
    expect_close(simulated, real.value.reshape(-1), atol=1e-5,
                 hint="Both run nnx.Linear with the same seed on the same rows: they must agree")


@check(got=compiled_call("shard_map_mse", 13.0, X, Y, 2.0))
def test_mse_gives_each_device_its_own_rows_and_averages_the_losses(got, run):
    n = run.device_count
    hint = ("Every device computes the loss of the whole batch: that is not data parallelism. Give x and y "
            "in_specs=P('data', None), so that each device takes its own rows, and average the per-device losses "
            "with jax.lax.pmean(..., 'data')")
    expect_input_split(got, 1, n, name="x", hint=hint)
    expect_input_split(got, 2, n, name="y", hint=hint)
    expect_collective(got, "all-reduce", n, hint="The per-device losses are averaged by jax.lax.pmean(..., 'data')")
