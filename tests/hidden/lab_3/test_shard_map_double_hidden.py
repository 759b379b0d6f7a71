"""Lab 3, hidden tests: inputs the student has not seen, and the one-device mesh bug."""

import numpy as np

from labkit.checks import call, check, expect_close, expect_split_across

RNG = np.random.default_rng(3)
LONG = RNG.normal(size=64).astype(np.float32)


@check(got=call("shard_map_double", LONG))
def test_doubles_a_longer_random_vector(got):
    expect_close(got, 2 * LONG)


@check(got=call("shard_map_double", LONG))
def test_every_device_holds_a_different_block(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="Each device should double its own block: a mesh over jax.devices()[:1] is right on one device "
        "and does all the work on device 0 when there are eight",
    )
