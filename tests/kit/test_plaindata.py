import json
import math

import numpy as np

from labkit.judge import plaindata


def roundtrip(value):
    return plaindata.decode(plaindata.encode(value))


def test_arrays_keep_values_shape_and_dtype():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    got = roundtrip(x)
    assert got.kind == "array" and got.shape == (3, 4) and got.dtype == "float32"
    np.testing.assert_array_equal(got.value, x)


def test_nan_and_infinities_survive():
    got = roundtrip(np.array([np.nan, np.inf, -np.inf, 1.5]))
    assert math.isnan(got.value[0]) and got.value[1] == np.inf and got.value[2] == -np.inf


def test_containers_and_scalars():
    got = roundtrip({"a": (1, 2.5, "s", None, True)})
    assert got.kind == "dict"
    items = got.value["a"].value
    assert [i.value for i in items] == [1, 2.5, "s", None, True]


def test_objects_that_claim_to_equal_anything_become_descriptions():
    class Liar:
        def __eq__(self, other):
            return True

    got = roundtrip(Liar())
    assert got.kind == "object" and got.value is None and "Liar" in got.description


def test_subclasses_of_builtin_containers_are_not_trusted():
    class SneakyList(list):
        pass

    assert roundtrip(SneakyList([1])).kind == "object"


def test_jax_arrays_carry_their_sharding():
    import jax.numpy as jnp

    got = roundtrip(jnp.arange(4.0))
    assert got.is_jax and got.sharding is not None and got.sharding.num_devices >= 1
    assert got.sharding.shards[0]["index"][0][0] == 0


def test_every_dtype_crosses_as_its_bytes_and_comes_back_exactly():
    import ml_dtypes

    for x in (
        np.array([0.1, -0.0, 1e-40, np.finfo(np.float32).max], dtype=np.float32),
        np.array([[1 + 2j, np.nan - 1j]], dtype=np.complex128),
        np.array([True, False]),
        np.arange(-3, 3, dtype=np.int16),
        np.array(np.iinfo(np.uint64).max, dtype=np.uint64),
        np.arange(6, dtype=">f8").reshape(2, 3),  # big-endian: the same values, native order
        np.zeros((0, 3), dtype=np.float16),
    ):
        encoded = json.loads(json.dumps(plaindata.encode(x)))
        assert "data" not in encoded and isinstance(encoded["bytes"], str)
        got = plaindata.decode(encoded)
        assert got.shape == x.shape and got.value.dtype == x.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got.value, x)
    # bfloat16 reads back as the float32 it holds exactly, as the judge reads it
    half = np.array([1.5, -2.0, 3.0e38], dtype=ml_dtypes.bfloat16)
    got = roundtrip(half)
    assert got.dtype == "bfloat16" and got.value.dtype == np.float32
    np.testing.assert_array_equal(got.value, half.astype(np.float32))


def test_an_array_of_bytes_that_do_not_fit_its_dtype_and_shape_is_a_malformed_value_not_an_error():
    ok = plaindata.encode(np.arange(4, dtype=np.float32))
    for bad in (
        ok | {"shape": [5]},  # 16 bytes for 5 float32 values
        ok | {"shape": [-1]},  # a shape numpy would fill in
        ok | {"shape": [plaindata.MAX_ELEMENTS + 1]},
        ok | {"dtype": "object"},  # no dtype outside the wire's list is ever read
        ok | {"dtype": ["float32"]},
        ok | {"bytes": "not base64!"},
    ):
        got = plaindata.decode(bad)
        assert got.kind == "object" and got.description == "a malformed array", bad
    # the list of numbers written before is still read
    old = {"kind": "array", "dtype": "float32", "shape": [2], "data": [1.0, {"float": "nan"}]}
    assert plaindata.decode(old).value.tolist()[0] == 1.0


def test_a_million_values_cross_in_a_few_bytes_each():
    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    text = json.dumps(plaindata.encode(x))
    assert len(text) < 6 * x.size  # as JSON numbers it was about 20 bytes a value


def test_huge_arrays_are_not_carried():
    got = roundtrip(np.zeros(plaindata.MAX_ELEMENTS + 1, dtype=np.int8))
    assert got.kind == "too-large"


def test_encoding_the_tests_inputs_starts_no_jax_backend():
    # The judge encodes each test's inputs in the trusted process. A backend started there would load
    # libtpu where it is installed (on a TPU VM, taking the chips the student's kernel needs), so neither
    # a numpy array, nor an abstract input, nor any other object may start one.
    import subprocess
    import sys

    script = """
import sys
import numpy as np
from labkit.judge import plaindata
plaindata.encode([np.ones(3, np.float32), {"n": 2}])
assert "jax" not in sys.modules, "encoding plain inputs imported jax"
import jax
started = []
jax.device_put = lambda *a, **k: started.append(a)
for v in (np.ones(3), jax.ShapeDtypeStruct((8192, 8192), np.float32), object()):
    plaindata.encode(v)
assert not started, "a backend was started"
print("no backend")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "no backend" in done.stdout, done.stderr[-2000:]


def test_an_input_cut_into_a_piece_for_every_device_grows_its_values_and_its_shape_by_one_rule():
    # `checks.by_devices(x, pieces=k)`: each device's rows a multiple of k x devices, as written where they are
    for rows, pieces, per_device in ((1024, 1, 1), (2048, 2, 1), (1024, 1, 2), (96, 1, 1), (2048, 3, 4)):
        grow = {"shift": 1.0, "pieces": pieces} | ({"per_device": per_device} if per_device != 1 else {})
        for devices in (1, 2, 3, 8, 32, 64, 256):
            copies = plaindata.copies_along((rows, 2), grow, devices)
            value = plaindata.grown(np.zeros((rows, 2), np.float32), grow, devices)
            assert value.shape == (rows * copies[0], 2)  # the value is the shape the rule gives
            if devices * devices * pieces <= rows:
                assert copies == {0: 1}
            else:
                each = value.shape[0] // devices
                assert (
                    value.shape[0] % devices == 0
                    and each % (pieces * devices) == 0
                    and each % per_device == 0
                )
                assert copies[0] == min(  # the fewest copies that do
                    c
                    for c in range(1, copies[0] + 1)
                    if (rows * c) % devices == 0
                    and (rows * c // devices) % (pieces * devices) == 0
                    and (rows * c // devices) % per_device == 0
                )
    assert plaindata.copies_for(1024, 256, pieces=1) == 64 and plaindata.copies_for(2048, 256, pieces=2) == 64
    # without pieces, the rule is what it was: rows enough for one a device
    assert plaindata.copies_for(1024, 256) == 1 and plaindata.copies_along((32,), {"shift": 0}, 256) == {0: 8}


def test_an_input_with_rows_enough_but_not_dividing_over_the_devices_grows_until_they_divide():
    # as written wherever its rows split evenly (every test's input on 1 to 32 devices), else the fewest copies
    # that split: lab 14's 384 sequences at a production size on 256 devices, lab 13's 96 rows on 64
    for devices in (1, 2, 4, 8, 16, 32, 64, 128):
        assert plaindata.copies_for(384, devices) == 1
    assert plaindata.copies_for(384, 256) == 2 and plaindata.copies_for(96, 64) == 2
    assert (
        plaindata.copies_for(96, 3) == 1
        and plaindata.copies_for(100, 8) == 2
        and plaindata.copies_for(7, 5) == 5
    )
    for rows in range(1, 70):
        for devices in (1, 2, 3, 8, 32, 64, 256):
            copies = plaindata.copies_for(rows, devices)
            assert (rows * copies) % devices == 0  # every device gets its own rows
            assert copies == min(c for c in range(1, copies + 1) if (rows * c) % devices == 0)
    assert plaindata.grown(np.zeros((384, 2), np.float32), {"shift": 1.0}, 256).shape == (768, 2)
