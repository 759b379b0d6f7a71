"""Lab 3, public tests: `shard_map_double(x)` doubles x with shard_map over every device."""

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

X = np.linspace(-4.0, 4.0, 32, dtype=np.float32)  # 32: divides by 1 to 32 devices
ONE_DEVICE = "A mesh over jax.devices()[:1] keeps everything on device 0: build it from jax.devices()"


@check(got=compiled_call("shard_map_double", X))
def test_doubles_every_element(got):
    expect_close(got, 2 * X)


@check(got=call("shard_map_double", X))
def test_keeps_shape_and_dtype(got):
    expect_shape(got, X.shape)
    expect_dtype(got, "float32", hint="Multiply by 2.0 rather than casting: x * 2.0 keeps float32")


@check(got=call("shard_map_double", X))
def test_result_is_split_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


@check(got=call("shard_map_double", placed(X, ("data",))))
def test_accepts_an_input_that_is_already_sharded(got, run):
    expect_close(got, 2 * X)
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)
