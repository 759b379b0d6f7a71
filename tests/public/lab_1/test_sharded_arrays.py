"""Lab 1, public tests: placing arrays with a Mesh, a PartitionSpec and a NamedSharding, and reading shards.

shard_rows is a goal (whole rows, one block a device), not a recipe: any mesh and spec that reach it pass."""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    expect_close,
    expect_replicated,
    expect_split_across,
    placed,
    single_process,
)

M = np.arange(32 * 4, dtype=np.float32).reshape(32, 4)  # 32 rows: divides by every pod size, 1 to 32 devices
# M for the designs that cut its rows over every device: as written on 1 to 32 devices; on a larger pod,
# copies of it one after another, each 128 higher (the count goes on: np.arange(4 * rows))
ROWS = by_devices(M, shift=128.0)
# The grid cuts its columns n / 2 ways: on a larger pod (2 x 128 on 256 devices) copies of its columns, each 2 higher
TILES = by_devices(np.linspace(-1.0, 1.0, 16 * 16, dtype=np.float32).reshape(16, 16), shift=2.0, axis=1)
ONE_DEVICE = "A mesh over jax.devices()[:1] keeps everything on device 0: build it from jax.devices()"
# With several processes, x.addressable_shards lists only this process's blocks: lab 11 is about that.
ONE_PROCESS = single_process(
    "block_owners reads addressable_shards, which with several processes lists only "
    "this process's blocks; lab 11 teaches reading shards across processes"
)


def grid_shape(n: int) -> tuple[int, int]:
    """The notebook's grid: (2, n // 2) when n is even, else (1, n)."""
    return (2, n // 2) if n % 2 == 0 else (1, n)


def expect_tiles(got, n: int, shape) -> None:
    """Each of n devices holds one tile of the grid, all tiles different, each of shape R/a x C/b."""
    a, b = grid_shape(n)
    sh = got.sharding
    if sh is None:
        raise Mismatch("expected a JAX array placed on devices, got a plain (numpy or Python) value")
    if sh.mesh != {"rows": a, "cols": b}:
        raise Mismatch(
            f"expected a mesh of {a} x {b} devices with axes ('rows', 'cols'), got {sh.describe()}. "
            "Arrange jax.devices() with .reshape(grid_shape(jax.device_count()))"
        )
    want = (shape[0] // a, shape[1] // b)
    tiles = {tuple(map(tuple, s["index"])) for s in sh.shards}
    sizes = {tuple(stop - start for start, stop in t) for t in tiles}
    if len(tiles) != n or sizes != {want}:
        raise Mismatch(
            f"expected {n} different tiles of shape {want}, one per device; got {len(tiles)} "
            f"different tile(s) of shape(s) {sorted(sizes)} ({sh.describe()}). "
            "Cut axis 0 along 'rows' and axis 1 along 'cols': P('rows', 'cols')"
        )


def as_rows(got) -> list:
    """The student's list of [device, start, stop] entries as plain Python lists."""
    if got.kind == "array":
        return got.value.tolist()
    if got.kind not in ("list", "tuple"):
        raise Mismatch(f"expected a list of [device_id, row_start, row_stop] entries, got a {got.kind}")
    rows = []
    for item in got.value:
        if item.kind == "array":
            rows.append(item.value.tolist())
        elif item.kind in ("list", "tuple") and all(v.kind == "int" for v in item.value):
            rows.append([v.value for v in item.value])
        else:
            raise Mismatch(
                f"each entry must be [device_id, row_start, row_stop] as ints, got {item!r}. "
                "A slice of an axis that is not cut has start None: use sl.indices(length)"
            )
    return rows


def expect_owners(got, want: list, hint: str) -> None:
    rows = as_rows(got)
    if rows != want:
        raise Mismatch(f"expected {want}, got {rows}. {hint}")


# -- shard_rows ----------------------------------------------------------------------------


@check(got=call("shard_rows", ROWS))
def test_shard_rows_keeps_the_values(got, run):
    expect_close(got, ROWS.on(run))


@check(got=call("shard_rows", ROWS))
def test_shard_rows_splits_the_rows_across_every_device(got, run):
    # the goal, whatever mesh and spec reach it: n blocks of whole rows, one on each device
    expect_split_across(got, run.device_count, axis=0, hint=ONE_DEVICE)


# -- replicate -----------------------------------------------------------------------------


@check(got=call("replicate", M))
def test_replicate_keeps_the_values(got):
    expect_close(got, M)


@check(got=call("replicate", M))
def test_replicate_puts_a_full_copy_on_every_device(got, run):
    expect_replicated(
        got, run.device_count, hint="Place it with P(), a spec that cuts no axis, over a mesh of every device"
    )


# -- shard_grid ----------------------------------------------------------------------------


@check(got=call("shard_grid", TILES))
def test_shard_grid_keeps_the_values(got, run):
    expect_close(got, TILES.on(run))


@check(got=call("shard_grid", TILES))
def test_shard_grid_gives_each_device_its_own_tile(got, run):
    expect_tiles(got, run.device_count, TILES.on(run).shape)


# -- block_owners --------------------------------------------------------------------------


@ONE_PROCESS
@check(got=call("block_owners", placed(ROWS, ("data", None))))
def test_block_owners_of_rows_split_across_the_devices(got, run):
    n, step = run.device_count, ROWS.on(run).shape[0] // run.device_count
    expect_owners(
        got,
        [[d, d * step, (d + 1) * step] for d in range(n)],
        "Read each shard's device id and shard.index[0] from x.addressable_shards",
    )


@ONE_PROCESS
@check(got=call("block_owners", placed(M, (None, None))))
def test_block_owners_of_a_replicated_array(got, run):
    expect_owners(
        got,
        [[d, 0, M.shape[0]] for d in range(run.device_count)],
        "A replicated array has one shard per device, each covering every row",
    )


@ONE_PROCESS
@check(got=call("block_owners", M))
def test_block_owners_of_an_array_on_one_device(got):
    expect_owners(
        got, [[0, 0, M.shape[0]]], "A fresh array has a single shard on device 0, covering every row"
    )


# -- stretch (not graded: points=0): shard_shapes ---------------------------------------------

WIDE = np.zeros((32, 64), dtype=np.float32)  # 32 and 64 divide by every grid of 1 to 32 devices
# On a larger pod, copies of WIDE (each 1 higher) along the axis a spec cuts over n / 2 or n devices:
# its columns for P('rows', 'cols') (128 of a 2 x 128 grid), its rows for specs that cut rows along 'cols'
WIDE_BY_COLUMNS = by_devices(WIDE, shift=1.0, axis=1)
WIDE_BY_ROWS = by_devices(WIDE, shift=1.0)


def expect_layout(got, n: int, spec, shape) -> None:
    """{"shapes": [[device, rows, cols], ...], "distinct": k} of `shape` placed with `spec` on the grid of n devices."""
    sizes = dict(zip(("rows", "cols"), grid_shape(n)))
    block, copies = [], n
    for entry, length in zip(spec, shape):
        names = entry if isinstance(entry, list) else [] if entry is None else [entry]
        cut = int(np.prod([sizes[name] for name in names]))
        block.append(length // cut)
        copies //= cut
    if got.kind != "dict" or set(got.value) != {"shapes", "distinct"}:
        raise Mismatch(
            f"expected a dict with the keys 'shapes' and 'distinct', got a {got.kind}"
            + (f" with the keys {sorted(got.value)}" if got.kind == "dict" else "")
        )
    shapes = as_rows(got.value["shapes"])
    want = [[d, *block] for d in range(n)]
    if shapes != want:
        raise Mismatch(
            f"with spec {spec} on a grid of {grid_shape(n)} devices, expected the blocks {want}, got "
            f"{shapes}. One [device_id, block_rows, block_cols] per addressable shard, sorted; build the "
            f"grid from all of jax.devices()"
        )
    if got.value["distinct"].value != n // copies:
        raise Mismatch(
            f"with spec {spec}, expected {n // copies} distinct blocks (each held by {copies} device(s)), "
            f"got {got.value['distinct'].value!r}: devices whose shard.index is the same slice hold "
            f"copies of one block"
        )


@ONE_PROCESS
@check(points=0, got=call("shard_shapes", WIDE_BY_COLUMNS, ["rows", "cols"]))
def test_shard_shapes_of_a_matrix_tiled_over_the_grid(got, run):
    expect_layout(got, run.device_count, ["rows", "cols"], WIDE_BY_COLUMNS.on(run).shape)


@ONE_PROCESS
@check(points=0, got=call("shard_shapes", WIDE_BY_ROWS, ["cols", None]))
def test_shard_shapes_of_rows_cut_along_one_mesh_axis_and_copied_along_the_other(got, run):
    expect_layout(got, run.device_count, ["cols", None], WIDE_BY_ROWS.on(run).shape)


@ONE_PROCESS
@check(points=0, got=call("shard_shapes", WIDE_BY_ROWS, [["rows", "cols"], None]))
def test_shard_shapes_of_rows_cut_over_both_mesh_axes(got, run):
    expect_layout(got, run.device_count, [["rows", "cols"], None], WIDE_BY_ROWS.on(run).shape)
