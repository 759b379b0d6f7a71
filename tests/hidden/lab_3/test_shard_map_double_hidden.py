"""Lab 3, hidden tests: inputs the student has not seen, and the one-device mesh bug."""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    expect_close,
    expect_close_naming_mistakes,
    expect_split_across,
    public_tests,
)

public = public_tests(__file__)  # the public tests' inputs and helpers

RNG = np.random.default_rng(3)
LONG = by_devices(RNG.normal(size=64).astype(np.float32), shift=0.25)  # 64 values; copies on larger pods


@check(got=call("shard_map_double", LONG))
def test_doubles_a_longer_random_vector(got, run):
    expect_close(got, 2 * LONG.on(run))


@check(got=call("shard_map_double", LONG))
def test_every_device_holds_a_different_block(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="Each device should double its own block: a mesh over jax.devices()[:1] is right on one device "
        "and does all the work on device 0 when there are eight",
    )


# row_softmax on rows it has not seen: wider, random, with large values that overflow exp unless shifted
WIDE = by_devices((RNG.normal(size=(64, 32)) * 30).astype(np.float32), shift=1.0)


@check(got=call("row_softmax", WIDE))
def test_row_softmax_on_a_wider_random_matrix_with_large_values(got, run):
    wide = WIDE.on(run)
    want = public.softmax_of_rows(wide)
    if not np.isfinite(np.asarray(got.value, np.float64)).all():
        raise Mismatch(
            "some values are inf or nan: exp of a large element overflows float32. Subtract each row's "
            "largest element before exp, as jax.nn.softmax does; the softmax is unchanged"
        )
    expect_close_naming_mistakes(
        got, want, public.softmax_mistakes(wide, run.device_count), rtol=1e-5, atol=1e-7
    )
    expect_split_across(got, run.device_count, axis=0)
