"""Lab 12, hidden tests: inputs the student has not seen, and the mistakes that only eight devices show.

On one device, a mesh of size one, a product with a whole copy on every device, and a maximum taken
across devices all look right. On eight, each gives a layout or a value of its own, and the message names it.
mlp_in_types is held to the public tests' four costs, with their helpers and words, on inputs of other shapes:
any layout that meets them passes.
"""

import numpy as np

from labkit.checks import (
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_split_across,
    public_tests,
)

_public = public_tests(__file__)  # the public tests' inputs and helpers
expect_types = _public.expect_types

RNG = np.random.default_rng(12)

TALL = by_devices(RNG.normal(size=(64, 5)).astype(np.float32), shift=0.5)  # 64 rows; copies on larger pods


@check(got=call("place_rows", TALL))
def test_place_rows_puts_a_different_block_of_rows_on_every_device(got, run):
    expect_close(got, TALL.on(run))
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="a mesh of one device types the array float32[...@data] too, and keeps it all on "
        "device 0: take the mesh's size from jax.device_count()",
    )


@check(got=call("types_after", TALL))
def test_types_after_of_another_shape(got, run):
    r, c = TALL.on(run).shape  # 64 x 5 on up to 64 devices
    expect_types(
        got, [f"float32[{r}@data,{c}]", f"float32[{r}@data]", f"float32[{c}]", f"float32[{c},{r}@data]"]
    )


# a's rows and columns, and b's rows, grow on pods of more than 32 devices (copies, each shifted)
A = by_devices(RNG.normal(size=(32, 64)).astype(np.float32), shift=0.25, axis=(0, 1))
B = by_devices(RNG.normal(size=(64, 3)).astype(np.float32), shift=0.25)


@check(got=call("contract_to_rows", A, B))
def test_contract_to_rows_reduce_scatters_instead_of_all_reducing(got, run):
    a, b = A.on(run), B.on(run)
    expect_close(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    sh = got.sharding
    if sh is not None and run.device_count > 1 and sh.fully_replicated:
        raise AssertionError(
            f"every one of the {run.device_count} devices holds the whole product: out_sharding=P() all-reduces. "
            "Ask for the rows split, out_sharding=P('data', None), and each device keeps only its rows "
            "(a reduce-scatter)"
        )
    expect_split_across(got, run.device_count, axis=0)


@check(got=compiled_call("contract_to_rows", A, B))
def test_contract_to_rows_sends_less_than_an_all_reduce_of_the_product(got, run):
    _public.expect_less_than_an_all_reduce_of_the_product(got, run, A.on(run), B.on(run))  # the public budget


SPIKY = by_devices(RNG.normal(size=128).astype(np.float32), shift=0.25)  # 128 values; copies on larger pods


@check(got=call("block_maxima", SPIKY))
def test_block_maxima_of_a_random_vector(got, run):
    n = run.device_count
    spiky = SPIKY.on(run)
    expect_close_naming_mistakes(
        got,
        spiky.reshape(n, -1).max(axis=1),
        {
            "every element is the maximum of the whole vector: a pmax across 'data' compares the devices' maxima; "
            "each device should keep the maximum of its own block": np.full(n, spiky.max())
        },
    )


@check(got=call("constrain_auto", TALL))
def test_constrain_auto_of_a_taller_matrix(got, run):
    expect_close(got, np.sin(TALL.on(run).astype(np.float64)), rtol=1e-5, atol=1e-6)
    expect_split_across(got, run.device_count, axis=0)


# -- exercise 6: mlp_in_types, held to the public tests' costs on other shapes ------------------------------

X6, W1, W2 = _public.make_mlp(60, batch=64, d_in=24, d_hidden=512, d_out=40)


@check(got=call("mlp_in_types", X6, W1, W2))
def test_mlp_in_types_of_other_shapes_is_the_mlp_split_over_data_only(got, run):
    expect_close(got, _public.mlp(X6, W1, W2), rtol=1e-4, atol=1e-5)
    _public.expect_split_over_data_only(got, run.device_count)


# Weights of 800 and 640 KiB, above anything a valid layout gathers; an output of 256 KiB, as the public one.
BX, BW1, BW2 = _public.make_mlp(61, batch=256, d_in=320, d_hidden=640, d_out=256)
BUDGET_CALL = compiled_call("mlp_in_types", BX, BW1, BW2)


@check(got=BUDGET_CALL)
def test_mlp_in_types_splits_the_work_of_a_wider_layer(got, run):
    _public.expect_share_of_the_work(got, run.device_count, BX, BW1, BW2)


@check(got=BUDGET_CALL)
def test_mlp_in_types_never_makes_a_weight_whole(got, run):
    _public.expect_no_weight_whole(got, run.device_count, BW1, BW2)


@check(got=BUDGET_CALL)
def test_mlp_in_types_sends_no_more_than_a_reduce_scatter_of_the_output(got, run):
    _public.expect_sent_within_a_reduce_scatter(got, run.device_count, len(BX) * BW2.shape[1] * 4)
