"""Lab 1 through the real pipeline: a placement that is right on one device and wrong on eight is caught."""

import json

from labkit.course import catalog


def test_a_copy_on_a_mesh_of_one_device_passes_on_cpu_1_and_fails_the_hidden_test_on_cpu_8(
    kit, lab_outcomes, variant
):
    buggy = variant(
        1,
        (
            "everywhere = NamedSharding(Mesh(np.array(jax.devices())",
            "everywhere = NamedSharding(Mesh(np.array(jax.devices()[:1])",
        ),
    )
    done = kit("lab", "1", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1
    by_config = lab_outcomes(1)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}
    caught = by_config["cpu-8"]["test_replicate_gives_every_device_a_copy_not_only_device_0"]
    assert caught["status"] == "failed" and caught["hidden"]
    assert "full copy on each of 8 devices" in caught["message"] and "jax.devices()[:1]" in caught["message"]
    assert by_config["cpu-8"]["test_shard_rows_of_a_tall_random_matrix"]["status"] == "passed"


# Right in value, not parallel: a copy on every device (P()) where the exercise asks for pieces.
ROWS_WHOLE = (
    'return jax.device_put(x, NamedSharding(mesh, P("data", None)))',
    "return jax.device_put(x, NamedSharding(mesh, P()))",
)
GRID_WHOLE = (
    'return jax.device_put(x, NamedSharding(grid, P("rows", "cols")))',
    "return jax.device_put(x, NamedSharding(grid, P()))",
)


def reference_code() -> str:
    cells = json.loads(catalog.lab(1).reference.read_text())["cells"]
    return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


# Lab 1's exercises are placements: their result is all there is, and the tests read where it
# lives. A copy on every device needs no compiled program to be caught.


def test_a_grid_copied_to_every_device_passes_on_cpu_1_and_fails_the_hidden_tile_test_on_cpu_8(
    kit, lab_outcomes, variant
):
    assert GRID_WHOLE[0] in reference_code(), "the replacement finds nothing: the reference changed"
    done = kit("lab", "1", "--notebook", str(variant(1, GRID_WHOLE)), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(1)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}, by_config["cpu-1"]
    grid = by_config["cpu-8"]["test_shard_grid_of_a_rectangular_matrix"]
    assert grid["hidden"] and grid["status"] == "failed", grid
    assert "expected 8 different tiles" in grid["message"] and "got 1 different tile(s)" in grid["message"]
    assert "P('rows', 'cols')" in grid["message"]
    assert by_config["cpu-8"]["test_shard_rows_of_a_tall_random_matrix"]["status"] == "passed"


def test_rows_copied_to_every_device_pass_on_cpu_1_and_are_named_a_copy_on_cpu_8(kit, lab_outcomes, variant):
    # shard_rows states a goal, not a recipe: on one device a copy is the one block the goal asks for
    assert ROWS_WHOLE[0] in reference_code(), "the replacement finds nothing: the reference changed"
    done = kit("lab", "1", "--notebook", str(variant(1, ROWS_WHOLE)), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(1)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}, by_config["cpu-1"]
    for name in (
        "test_shard_rows_splits_the_rows_across_every_device",
        "test_shard_rows_of_a_tall_random_matrix",
    ):
        rows = by_config["cpu-8"][name]
        assert rows["status"] == "failed" and "got a full copy on every device" in rows["message"], rows


# Another design that reaches shard_rows's goal: the rows cut over both axes of the notebook's 2-D grid.
ROWS_OVER_A_GRID = (
    ROWS_WHOLE[0],
    "return jax.device_put(x, NamedSharding(Mesh(np.array(jax.devices()).reshape(grid_shape(jax.device_count())), "
    '("rows", "cols")), P(("rows", "cols"), None)))',
)


def test_rows_cut_over_both_axes_of_a_grid_pass_on_1_8_and_32_devices(kit, lab_outcomes, variant):
    assert ROWS_OVER_A_GRID[0] in reference_code(), "the replacement finds nothing: the reference changed"
    done = kit(
        "lab",
        "1",
        "--notebook",
        str(variant(1, ROWS_OVER_A_GRID)),
        "--configs",
        "cpu-1,cpu-8,cpu-32",
        "--hidden",
    )
    by_config = lab_outcomes(1)
    for config in ("cpu-1", "cpu-8", "cpu-32"):
        assert {o["status"] for o in by_config[config].values()} == {"passed"}, by_config[config]
    assert done.returncode == 0, done.stdout + done.stderr


def markdown(lab: int) -> str:
    cells = json.loads(catalog.lab(lab).reference.read_text())["cells"]
    return " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").replace("\n", " ")


def test_make_mesh_orders_a_tpus_devices_by_its_interconnect_as_labs_1_and_12_say():
    """jax.make_mesh on TPU devices (stand-ins with a TPU's coordinates, as libtpu reports them) need not keep
    jax.devices()'s order: the labs may not promise the same shards on the same devices."""
    import dataclasses

    import jax

    @dataclasses.dataclass(frozen=True)
    class Tpu:
        id: int
        coords: tuple
        core_on_chip: int = 0
        platform: str = "tpu"
        device_kind: str = "TPU v3"
        process_index: int = 0
        slice_index: int = 0

    v3 = [Tpu(i, ((i // 2) % 2, i // 4, 0), i % 2) for i in range(8)]  # 2 x 2 chips of two cores each
    assert [d.id for d in jax.make_mesh((8,), ("data",), devices=v3).devices.flat] == [0, 1, 2, 3, 6, 7, 4, 5]
    v5p = [Tpu(i, (i % 2, (i // 2) % 2, i // 4), device_kind="TPU v5") for i in range(8)]  # a 2 x 2 x 2 cube
    assert [d.id for d in jax.make_mesh((8,), ("data",), devices=v5p).devices.flat] != list(range(8))
    for lab in (1, 12):
        text = markdown(lab)
        assert (
            "same arrays on the same devices" not in text and "same shards on the same devices;" not in text
        )
        assert "on a TPU, `jax.make_mesh`" in text.replace("On a TPU", "on a TPU"), lab
