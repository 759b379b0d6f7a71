"""Lab 2, hidden tests: inputs the student has not seen, and answers that are only right on one device."""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_split_across,
    placed,
    public_tests,
)

_public = public_tests(__file__)  # the public tests' inputs and helpers

RNG = np.random.default_rng(2)
# split by columns over a grid (WIDE) and by rows over every device (TALL): copies on larger pods
WIDE = by_devices(RNG.normal(size=(8, 32)).astype(np.float32), shift=0.25, axis=1)
TALL = by_devices(RNG.normal(size=(64, 4)).astype(np.float32), shift=0.25)


@check(got=call("follow_data", placed(TALL, ("data", None))))
def test_follow_data_on_a_tall_random_matrix(got, run):
    expect_close(got, 2 * np.sin(TALL.on(run)) + 1, rtol=1e-5, atol=1e-5)
    expect_split_across(got, run.device_count, axis=0)


@check(got=call("column_sums", WIDE))
def test_column_sums_of_a_wide_random_matrix(got, run):
    expect_close(got, WIDE.on(run).sum(axis=0), rtol=1e-5, atol=1e-5)
    _public.expect_partially_replicated(got, run.device_count)


@check(got=call("column_sums_split", WIDE))
def test_column_sums_split_is_not_left_partially_replicated(got, run):
    expect_close(got, WIDE.on(run).sum(axis=0), rtol=1e-5, atol=1e-5)
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint=_public.NO_CONSTRAINT + ": two copies of each piece rather than one piece per device. "
        "On one device every layout is the same, so only a run on several devices shows it",
    )


@check(got=compiled_call("column_sums_split", WIDE))
def test_column_sums_split_never_makes_every_sum_whole_on_a_device(got, run):
    # the public test's budget, on other sums
    _public.expect_no_sum_made_whole(got, run.device_count, WIDE.on(run))


@check(got=call("collectives_of_sum", placed(TALL, ("data", None))))
def test_collectives_are_read_from_the_compiled_not_the_lowered_program(got, run):
    want = _public.collectives(run.device_count)
    have = [v.value for v in got.value] if got.kind == "list" else None
    if have != want:
        raise Mismatch(
            f"expected {want} on {run.device_count} device(s), got {have if have is not None else got!r}. "
            "An empty list is right on one device but not on eight: " + _public.LOWERED_NOT_COMPILED
        )


EMPTY_ROWS = by_devices(np.zeros((64, 0), np.float32))  # 64 rows of nothing; more rows on larger pods


@check(got=call("collectives_of_sum", placed(EMPTY_ROWS, ("data", None))))
def test_collectives_of_an_empty_array_split_by_rows_come_from_the_program_not_the_placement(got, run):
    have = [v.value for v in got.value] if got.kind == "list" else None
    if have != []:
        raise Mismatch(
            f"expected [] for an array of shape {EMPTY_ROWS.on(run).shape} split by rows over "
            f"{run.device_count} device(s), "
            f"got {have if have is not None else got!r}. It has no elements: its compiled sum is the "
            "constant 0 and needs no communication, whatever x.sharding says. Read the collectives from "
            "the text of jax.jit(jnp.sum).lower(x).compile(), not from the placement"
        )


# -- stretch (not graded: points=0): matvec_split ---------------------------------------------

SKINNY = by_devices(RNG.normal(size=(64, 32)).astype(np.float32), shift=0.25, axis=(0, 1))
WEIGHTS = by_devices(RNG.normal(size=(32,)).astype(np.float32), shift=0.25)


@check(points=0, got=call("matvec_split", SKINNY, WEIGHTS))
def test_matvec_split_of_a_random_matrix(got, run):
    expect_close(got, _public.matvec(SKINNY.on(run), WEIGHTS.on(run)), rtol=1e-5, atol=1e-5)
    expect_split_across(got, run.device_count, axis=0, hint=_public.NO_SPLIT)


@check(points=0, got=compiled_call("matvec_split", SKINNY, WEIGHTS))
def test_matvec_split_stores_and_multiplies_one_tile_per_device(got, run):
    _public.expect_one_tile_per_device(got, run.device_count, SKINNY.on(run))
