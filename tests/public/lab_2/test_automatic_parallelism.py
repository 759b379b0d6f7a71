"""Lab 2, public tests: jit on sharded inputs, partially replicated sums, sharding constraints, collectives in HLO.

The budgets read from the compiled program (where the work runs, no sum made whole on a device, the stretch's
tiles) are held here on these inputs, and by the hidden tests on others with the same helpers and words."""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    collectives_of,
    compiled_call,
    expect_close,
    expect_input_split,
    expect_jitted,
    expect_split_across,
    expect_work_split,
    placed,
)
from labkit.cost import shape_bytes

M = np.linspace(-3.0, 3.0, 32 * 8, dtype=np.float32).reshape(32, 8)  # sizes divide by 1 to 32 devices
# M split by rows over every device: on more than 32 devices, more rows (copies, each 0.5 higher)
ROWS = by_devices(M, shift=0.5)
# 16 rows and 32 columns: a grid of 2 x 16 or smaller cuts both; the 128 columns of a 2 x 128 grid (256
# devices) need more columns, copies each 0.25 higher
TILES = by_devices(np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / 16.0, shift=0.25, axis=1)
NO_CONSTRAINT = (
    "Without jax.lax.with_sharding_constraint(sums, NamedSharding(grid, P(('rows', 'cols')))) "
    "inside the jitted function, the column sums stay partially replicated"
)
LOWERED_NOT_COMPILED = (
    "jax.jit(f).lower(x).as_text() is the program before partitioning and has no collectives "
    "yet: read jax.jit(f).lower(x).compile().as_text()"
)


def grid_shape(n: int) -> tuple[int, int]:
    """The notebook's grid: (2, n // 2) when n is even, else (1, n)."""
    return (2, n // 2) if n % 2 == 0 else (1, n)


def expect_partially_replicated(got, n: int) -> None:
    """On an a x b grid, column sums come back as b distinct pieces, each held by a devices: all n hold one."""
    a, b = grid_shape(n)
    sh = got.sharding
    if sh is None:
        raise Mismatch("expected a JAX array placed on devices, got a plain (numpy or Python) value")
    holders: dict = {}
    for s in sh.shards:
        holders.setdefault(tuple(map(tuple, s["index"])), set()).add(s["device"])
    copies = sorted({len(d) for d in holders.values()})
    if sh.num_devices != n or len(holders) != b or copies != [a]:
        raise Mismatch(
            f"expected the sums on all {n} devices as {b} distinct piece(s), each held by {a} device(s) "
            f"(cut along 'cols', copied along 'rows'); got {len(holders)} piece(s) held by {copies} device(s) each, "
            f"on {sh.num_devices} device(s) ({sh.describe()}). Place x on grid_mesh() with P('rows', 'cols') "
            "before the jitted sum"
        )


def collectives(n: int) -> list[str]:
    """What the compiled total of an array split by rows contains on n devices."""
    return ["all-reduce"] if n > 1 else []


# -- follow_data ---------------------------------------------------------------------------


@check(got=call("follow_data", placed(ROWS, ("data", None))))
def test_follow_data_computes_two_sin_plus_one(got, run):
    expect_close(got, 2 * np.sin(ROWS.on(run)) + 1, rtol=1e-5, atol=1e-5)


@check(got=call("follow_data", placed(ROWS, ("data", None))))
def test_follow_data_keeps_the_rows_split_across_every_device(got, run):
    expect_split_across(
        got,
        run.device_count,
        axis=0,
        hint="jit on a sharded input computes where the data is: return its result as it is",
    )


# Its own input, so that check() in a notebook, which makes each distinct call once, examines this one.
@check(got=compiled_call("follow_data", placed(by_devices(-M, shift=-0.5), ("data", None))))
def test_follow_data_does_its_work_inside_jit(got):
    expect_jitted(
        got,
        hint="The exercise is about compiled programs: compute 2 * sin(x) + 1 in a function decorated with "
        "@jax.jit (or a jitted shard_map), defined once outside follow_data, call it on x, and let the "
        "compiler follow the data",
    )


# -- column_sums ---------------------------------------------------------------------------


@check(got=call("column_sums", TILES))
def test_column_sums_are_the_sums_of_each_column(got, run):
    expect_close(got, TILES.on(run).sum(axis=0), rtol=1e-5, atol=1e-4)


@check(got=call("column_sums", TILES))
def test_column_sums_come_back_partially_replicated(got, run):
    expect_partially_replicated(got, run.device_count)


SUM_ON_ONE_DEVICE = (
    "Tile x over grid_mesh() (P('rows', 'cols')) before the sum, so that each device adds up only the "
    "numbers of its own tile and the compiler adds the partial sums down each grid column. A sum of the "
    "whole matrix placed in pieces afterwards has the right layout, but the work was not split"
)


@check(got=compiled_call("column_sums", TILES))
def test_column_sums_are_added_up_where_the_tiles_are(got, run):
    """The layout alone does not show where the sum ran: one device adding up everything, its result then
    placed partially replicated, passes the value and layout tests. The compiled program's work does."""
    n = run.device_count
    expect_work_split(got, TILES.on(run).size, n, what="the sum of the whole matrix", hint=SUM_ON_ONE_DEVICE)
    expect_input_split(got, 0, n, name="x", hint=SUM_ON_ONE_DEVICE)


# -- column_sums_split ---------------------------------------------------------------------


@check(got=call("column_sums_split", TILES))
def test_column_sums_split_are_the_sums_of_each_column(got, run):
    expect_close(got, TILES.on(run).sum(axis=0), rtol=1e-5, atol=1e-4)


@check(got=call("column_sums_split", TILES))
def test_column_sums_split_one_piece_per_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=NO_CONSTRAINT)


def expect_no_sum_made_whole(got, n: int, x) -> None:
    """The constraint asks the compiler for one piece per device: what it sends are partial sums of a
    device's own columns. Every sum made whole on every device (an all-reduce of all the columns, or a
    gather of the sums) and then cut holds the copies the exercise is about avoiding."""
    if n <= 2:
        # One device, or a grid of 2 x 1: one column of devices, so each device's partial sums span every
        # column, and the reduce-scatter the constraint asks for is over all of them, which the CPU compiler
        # carries out as an all-reduce and a slice (as lab 12 says): every design's program is the same.
        return
    whole = [c for c in collectives_of(got) if shape_bytes(c.shape) >= x.shape[1] * x.itemsize]
    if whole:
        raise Mismatch(
            f"the compiled program's {whole[0].op} hands each device all {x.shape[1]} column sums, which are "
            "then cut into pieces: every device held a whole copy on the way. Constrain the sums inside the "
            "jitted function, where they are computed, so that the compiler adds each device's partial sums "
            "only for the piece it keeps"
        )


@check(got=compiled_call("column_sums_split", TILES))
def test_column_sums_split_adds_the_partial_sums_of_each_device_only_for_its_piece(got, run):
    expect_no_sum_made_whole(got, run.device_count, TILES.on(run))


# -- collectives_of_sum --------------------------------------------------------------------


@check(got=call("collectives_of_sum", M))
def test_collectives_of_a_sum_on_one_device(got):
    if got.kind != "list" or got.value:
        raise Mismatch(f"expected [] (an array on one device needs no communication), got {got!r}")


@check(got=call("collectives_of_sum", placed(ROWS, ("data", None))))
def test_collectives_of_a_sum_over_rows_split_across_the_devices(got, run):
    want = collectives(run.device_count)
    have = [v.value for v in got.value] if got.kind == "list" else None
    if have != want:
        raise Mismatch(
            f"expected {want} on {run.device_count} device(s), got {have if have is not None else got!r}. "
            + ("Partial sums on different devices must be added together. " if want else "")
            + LOWERED_NOT_COMPILED
        )


@check(got=call("collectives_of_sum", placed(M, (None, None))))
def test_collectives_of_a_sum_of_a_replicated_array(got):
    if got.kind != "list" or got.value:
        raise Mismatch(f"expected [] (every device already holds every element), got {got!r}")


# -- stretch (not graded: points=0): matvec_split ---------------------------------------------

# Both sizes divide by 1 to 32 devices. On a larger pod the product's rows need one a device and the grid
# cuts the columns n / 2 ways: the matrix grows both (copies, each 0.125 past the others), v as its columns
MATRIX = by_devices(
    np.linspace(-1.0, 1.0, 32 * 64, dtype=np.float32).reshape(32, 64), shift=0.125, axis=(0, 1)
)
VECTOR = by_devices(np.linspace(2.0, -2.0, 64, dtype=np.float32), shift=0.125)
NO_SPLIT = (
    "Constrain the product inside the jitted function to NamedSharding(grid, P(('rows', 'cols'))): left "
    "to itself, the compiler keeps x @ v on the devices of one grid column, copied along the other axis"
)


def matvec(x, v):
    return np.asarray(x, np.float64) @ np.asarray(v, np.float64)


@check(points=0, got=call("matvec_split", MATRIX, VECTOR))
def test_matvec_split_equals_the_product(got, run):
    expect_close(got, matvec(MATRIX.on(run), VECTOR.on(run)), rtol=1e-5, atol=1e-5)


@check(points=0, got=call("matvec_split", MATRIX, VECTOR))
def test_matvec_split_is_split_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=NO_SPLIT)


NOT_TILED = (
    "Place x with NamedSharding(grid_mesh(), P('rows', 'cols')) and v with P('cols') before the jitted "
    "product, so that each device multiplies only its own tile"
)


def expect_one_tile_per_device(got, n: int, x) -> None:
    """Each device holds 1/n of x and does at most 1/n of the product's work (and a little more)."""
    expect_input_split(got, 0, n, name="x", hint=NOT_TILED)
    expect_work_split(got, 2.0 * x.size, n, what="the whole product", hint=NOT_TILED)


@check(points=0, got=compiled_call("matvec_split", MATRIX, VECTOR))
def test_matvec_split_holds_and_multiplies_one_tile_on_each_device(got, run):
    expect_one_tile_per_device(got, run.device_count, MATRIX.on(run))
