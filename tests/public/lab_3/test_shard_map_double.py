"""Lab 3, public tests: `shard_map_double(x)` doubles x with shard_map over every device; `row_softmax(x)`
meets its constraints (right, split by rows, a piece of x per device, nothing sent), read from its program."""

import numpy as np

from labkit.checks import (
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_dtype,
    expect_input_split,
    expect_sent_within,
    expect_shape,
    expect_split_across,
    placed,
)

# 32 values: they divide over 1 to 32 devices; on a larger pod the run gets copies, each 0.125 higher
X = by_devices(np.linspace(-4.0, 4.0, 32, dtype=np.float32), shift=0.125)
ONE_DEVICE = "A mesh over jax.devices()[:1] keeps everything on device 0: build it from jax.devices()"


@check(got=compiled_call("shard_map_double", X))
def test_doubles_every_element(got, run):
    expect_close(got, 2 * X.on(run))


@check(got=call("shard_map_double", X))
def test_keeps_shape_and_dtype(got, run):
    expect_shape(got, X.on(run).shape)
    expect_dtype(got, "float32", hint="Multiply by 2.0 rather than casting: x * 2.0 keeps float32")


@check(got=call("shard_map_double", X))
def test_result_is_split_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


@check(got=call("shard_map_double", placed(X, ("data",))))
def test_accepts_an_input_that_is_already_sharded(got, run):
    expect_close(got, 2 * X.on(run))
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- exercise 2: row_softmax, a design held to its constraints ------------------------------------

# 32 rows and 8 columns: both cut 1 to 8 ways; on more than 32 devices, more rows (copies, each 0.5 higher)
R = by_devices(np.linspace(-3.0, 3.0, 32 * 8, dtype=np.float32).reshape(32, 8), shift=0.5)
NO_TALK = (
    "A row's softmax needs all of that row and nothing else: cut x by rows, P('data', None), and every "
    "device has what its rows need without a word to the others"
)


def softmax_of_rows(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_mistakes(x, devices: int) -> dict:
    """What the plausible wrong designs give on `devices` devices, by the sentence that names each."""
    if devices <= 1 or x.shape[1] % devices:
        return {}
    columns = np.concatenate([softmax_of_rows(block) for block in np.split(x, devices, axis=1)], axis=1)
    return {
        f"Each row was normalised over 1/{devices} of its columns: with x cut by columns, every device "
        f"made a softmax of its own columns only. {NO_TALK}": columns
    }


SOFTMAX_CALL = compiled_call("row_softmax", R)


@check(got=SOFTMAX_CALL)
def test_row_softmax_gives_the_softmax_of_every_row(got, run):
    x = R.on(run)
    expect_close_naming_mistakes(got, softmax_of_rows(x), softmax_mistakes(x, run.device_count), rtol=1e-5)


@check(got=SOFTMAX_CALL)
def test_row_softmax_keeps_the_rows_split_across_every_device(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="The result should stay cut by rows, one block of rows per device, in the order of x",
    )


@check(got=SOFTMAX_CALL)
def test_row_softmax_holds_a_piece_of_x_and_sends_nothing(got, run):
    n = run.device_count
    expect_input_split(
        got, 0, n, name="x", hint="Give each device its own block of x, not all of it: cut x in in_specs"
    )
    expect_sent_within(got, 0, n, margin=1, what="no collective: the devices never talk", hint=NO_TALK)
