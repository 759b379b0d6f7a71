"""Lab 7 through the real pipeline: each approach with its one-device-only mistake passes on cpu-1,
and on cpu-8 a hidden test names the mistake."""

import json

import pytest
from test_tpu_references import HAS_LIBTPU, on_v5e_8

from labkit.course import catalog

MISTAKES = [
    # layer_jit: the inputs are never placed on the mesh
    ('    x = jax.device_put(x, NamedSharding(mesh, P("data")))\n', ""),
    ('    w = jax.device_put(w, NamedSharding(mesh, P("data", None)))\n', ""),
    ("    b = jax.device_put(b, NamedSharding(mesh, P()))\n", ""),
    # layer_constrained: constraints to a mesh of one device
    (
        '    mesh = Mesh(np.array(jax.devices()), ("data",))\n    return constrained_program(mesh)',
        '    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n    return constrained_program(mesh)',
    ),
    # layer_shard_map: no psum, its check silenced
    ('jax.nn.sigmoid(jax.lax.psum(x_block @ w_block, "data") + b)', "jax.nn.sigmoid(x_block @ w_block + b)"),
    (
        'in_specs=(P("data"), P("data", None), P()), out_specs=P()))',
        'in_specs=(P("data"), P("data", None), P()), out_specs=P(), check_vma=False))',
    ),
]

NAMED = {
    "test_shard_map_adds_the_partial_products_of_every_device": ["device 0's partial product alone", "psum"],
    "test_jit_runs_on_every_device_when_the_inputs_are_placed": [
        "full copy on each of 8 devices",
        "device_put",
    ],
    "test_constraints_spread_the_layer_over_every_device": [
        "full copy on each of 8 devices",
        "jax.devices()[:1]",
    ],
}


def test_every_mistake_passes_on_cpu_1_and_is_named_by_a_hidden_test_on_cpu_8(kit, lab_outcomes, variant):
    cells = json.loads(catalog.lab(7).reference.read_text())["cells"]
    reference = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert all(old in reference for old, _ in MISTAKES), "a mistake replaces nothing: the reference changed"
    done = kit("lab", "7", "--notebook", str(variant(7, *MISTAKES)), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    runs = lab_outcomes(7)
    assert runs["cpu-1"] and all(o["status"] == "passed" for o in runs["cpu-1"].values()), runs["cpu-1"]
    for test, phrases in NAMED.items():
        outcome = runs["cpu-8"][test]
        assert outcome["hidden"] and outcome["status"] == "failed", outcome
        assert all(p in outcome["message"] for p in phrases), outcome["message"]


# Each approach right but not parallel: every placement, constraint and spec P(), no psum.
WHOLE_ON_EVERY_DEVICE = [
    (
        'x = jax.device_put(x, NamedSharding(mesh, P("data")))',
        "x = jax.device_put(x, NamedSharding(mesh, P()))",
    ),
    (
        'w = jax.device_put(w, NamedSharding(mesh, P("data", None)))',
        "w = jax.device_put(w, NamedSharding(mesh, P()))",
    ),
    (
        'x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("data")))',
        "x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P()))",
    ),
    (
        'w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P("data", None)))',
        "w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P()))",
    ),
    ('jax.nn.sigmoid(jax.lax.psum(x_block @ w_block, "data") + b)', "jax.nn.sigmoid(x_block @ w_block + b)"),
    ('in_specs=(P("data"), P("data", None), P())', "in_specs=(P(), P(), P())"),
]

SPLIT_TESTS = {
    "test_jit_splits_x_and_w_over_the_devices_and_adds_the_partial_products": "NamedSharding(mesh, P('data'))",
    "test_constraints_split_x_and_w_over_the_devices_and_add_the_partial_products": "Constrain x to P('data')",
    "test_shard_map_splits_x_and_w_over_the_devices_and_adds_the_partial_products": "in_specs=P('data')",
}


def test_each_layer_computed_whole_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    cells = json.loads(catalog.lab(7).reference.read_text())["cells"]
    reference = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert all(old in reference for old, _ in WHOLE_ON_EVERY_DEVICE), "a replacement finds nothing"
    whole = variant(7, *WHOLE_ON_EVERY_DEVICE)
    done = kit("lab", "7", "--notebook", str(whole), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(7)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), (
        by_config["cpu-1"]
    )
    for test, phrase in SPLIT_TESTS.items():
        outcome = by_config["cpu-8"][test]
        assert outcome["hidden"] and outcome["status"] == "failed", outcome
        assert "every device holds all of x" in outcome["message"] and phrase in outcome["message"], outcome


# -- layer_grid: designs that meet its budget, and two that do not --------------------------------

# The reference moves x: an all-to-all over 'model' gives each device whole rows, multiplied by a copy of w.
REFERENCE_DESIGN = """    def per_device(tile, w, b):
        # Trade tiles inside the grid row: keep 1/m of the rows with all their features.
        mine = jax.lax.all_to_all(tile, "model", split_axis=0, concat_axis=1, tiled=True)
        return jax.nn.sigmoid(mine @ w + b)

    mapped = jax.jit(jax.shard_map(per_device, mesh=grid, in_specs=(tiles, P(), P()), out_specs=rows))

    def run(x, w, b):
        x = jax.reshard(x, NamedSharding(grid, tiles))
        w = jax.reshard(w, NamedSharding(grid, P()))
        b = jax.reshard(b, NamedSharding(grid, P()))
"""


def design(per_device: str, w_spec: str = "P()", x_spec: str = "tiles") -> tuple[str, str]:
    """The reference with another per-device program, w placed as `w_spec` and x handed over as `x_spec`."""
    return (
        REFERENCE_DESIGN,
        f"""{per_device}
    mapped = jax.jit(jax.shard_map(per_device, mesh=grid, in_specs=({x_spec}, {w_spec}, P()), out_specs=rows))

    def run(x, w, b):
        x = jax.reshard(x, NamedSharding(grid, {x_spec}))
        w = jax.reshard(w, NamedSharding(grid, {w_spec}))
        b = jax.reshard(b, NamedSharding(grid, P()))
""",
    )


# Moves the partial products: each tile times the matching rows of w, added and scattered over 'model'.
PARTIAL_PRODUCTS_SCATTERED = design(
    """    def per_device(tile, w_rows, b):
        mine = jax.lax.psum_scatter(tile @ w_rows, "model", scatter_dimension=0, tiled=True)
        return jax.nn.sigmoid(mine + b)
""",
    w_spec='P("model", None)',
)

# Lets the compiler move x: a reshard to whole rows before shard_map (it chooses an all-to-all over 'model').
ROWS_BY_RESHARD = design(
    """    def per_device(mine, w, b):
        return jax.nn.sigmoid(mine @ w + b)
""",
    x_spec="rows",
)

# The partial products added over the wrong axis, 'data', then each device keeps its own rows.
ADDED_OVER_DATA = design(
    """    def per_device(tile, w_rows, b):
        total = jax.lax.psum(tile @ w_rows, "data")
        k = total.shape[0] // jax.lax.axis_size("model")
        mine = jax.lax.dynamic_slice_in_dim(total, jax.lax.axis_index("model") * k, k)
        return jax.nn.sigmoid(mine + b)
""",
    w_spec='P("model", None)',
)

# Everything copied to every device, the whole layer computed there, its rows handed back split.
COPY_EVERYTHING = (
    REFERENCE_DESIGN + "        return mapped(x, w, b)\n",
    """    def run(x, w, b):
        x = jax.reshard(x, NamedSharding(grid, P()))
        w = jax.reshard(w, NamedSharding(grid, P()))
        b = jax.reshard(b, NamedSharding(grid, P()))
        return jax.reshard(jax.jit(layer)(x, w, b), NamedSharding(grid, rows))
""",
)

GRID_TESTS = {
    "test_layer_grid_computes_the_layer_of_every_row",
    "test_layer_grid_leaves_its_rows_split_over_every_device",
    "test_layer_grid_of_a_random_batch",
    "test_layer_grid_communicates_only_over_model",
    "test_layer_grid_computes_only_its_share_of_the_products",
    "test_layer_grid_never_holds_the_whole_of_x",
}


def reference_code() -> str:
    cells = json.loads(catalog.lab(7).reference.read_text())["cells"]
    return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def run_grid_design(kit, lab_outcomes, notebook) -> dict:
    done = kit("lab", "7", "--notebook", str(notebook), "--configs", "cpu-1,cpu-8", "--hidden")
    outcomes = lab_outcomes(7)
    assert set(outcomes["cpu-8"]) >= GRID_TESTS, sorted(outcomes["cpu-8"])
    assert all(o["status"] == "passed" for o in outcomes["cpu-1"].values()), outcomes["cpu-1"]
    return {
        "returncode": done.returncode,
        "output": done.stdout + done.stderr,
        "failed": {t: o for t, o in outcomes["cpu-8"].items() if o["status"] != "passed"},
    }


# The reference's design on an Auto mesh, Mesh(...), as the other exercises build theirs: its inputs are
# placed with jax.device_put (jax.reshard takes Explicit axes only).
AUTO_MESH = [
    (
        'grid = jax.make_mesh((2, n // 2) if n % 2 == 0 else (1, n), ("data", "model"))',
        'grid = Mesh(np.array(jax.devices()).reshape((2, n // 2) if n % 2 == 0 else (1, n)), ("data", "model"))',
    ),
    ("jax.reshard(", "jax.device_put("),
]


@pytest.mark.parametrize(
    "other",
    [[PARTIAL_PRODUCTS_SCATTERED], [ROWS_BY_RESHARD], AUTO_MESH],
    ids=["psum_scatter", "reshard", "auto-mesh"],
)
def test_another_design_within_the_budget_passes_every_test(kit, lab_outcomes, variant, other):
    assert all(old in reference_code() for old, _ in other), "the reference changed: update the designs here"
    ran = run_grid_design(kit, lab_outcomes, variant(7, *other))
    assert ran["returncode"] == 0 and not ran["failed"], ran


# The hidden budget tests of layer_grid and their twins in the student's own `make lab-7` (the same helpers, a
# public batch of the same size): each design over a budget fails both, in the same words.
TWINS = {
    "test_layer_grid_communicates_only_over_model": "test_layer_grid_sends_only_within_a_row_of_the_grid",
    "test_layer_grid_computes_only_its_share_of_the_products": "test_layer_grid_multiplies_only_its_share_of_the_products",
    "test_layer_grid_never_holds_the_whole_of_x": "test_layer_grid_keeps_x_in_its_tiles",
}


def expect_twins_alike(failed: dict) -> None:
    for hidden, public in TWINS.items():
        if hidden in failed:
            assert failed[hidden]["hidden"] and not failed[public]["hidden"], (failed[hidden], failed[public])
            assert failed[public]["message"] == failed[hidden]["message"], (failed[hidden], failed[public])


def test_partial_products_added_over_data_pass_on_cpu_1_and_are_named_on_cpu_8(kit, lab_outcomes, variant):
    ran = run_grid_design(kit, lab_outcomes, variant(7, ADDED_OVER_DATA))
    assert ran["returncode"] == 1 and set(ran["failed"]) == {
        "test_layer_grid_computes_the_layer_of_every_row",
        "test_layer_grid_of_a_random_batch",
        "test_layer_grid_communicates_only_over_model",
        "test_layer_grid_sends_only_within_a_row_of_the_grid",
    }, ran
    expect_twins_alike(ran["failed"])
    for test in ("test_layer_grid_computes_the_layer_of_every_row", "test_layer_grid_of_a_random_batch"):
        assert (
            "were added over 'data', whose devices hold different examples" in ran["failed"][test]["message"]
        )
    axis = ran["failed"]["test_layer_grid_communicates_only_over_model"]
    assert axis["hidden"] and "an all-reduce that joins devices [0, 4]" in axis["message"], axis
    assert "That collective runs over 'data'" in axis["message"], axis


def test_copying_everything_to_every_device_passes_on_cpu_1_and_breaks_each_budget_on_cpu_8(
    kit, lab_outcomes, variant
):
    assert COPY_EVERYTHING[0] in reference_code(), "the reference's design changed: update REFERENCE_DESIGN"
    ran = run_grid_design(kit, lab_outcomes, variant(7, COPY_EVERYTHING))
    assert ran["returncode"] == 1 and set(ran["failed"]) == set(TWINS) | set(TWINS.values()), ran
    messages = {t: o["message"] for t, o in ran["failed"].items()}
    expect_twins_alike(ran["failed"])
    assert "That collective runs over 'data'" in messages["test_layer_grid_communicates_only_over_model"]
    assert (
        "devices repeat each other's work"
        in messages["test_layer_grid_computes_only_its_share_of_the_products"]
    )
    assert "no device may hold the whole matrix" in messages["test_layer_grid_never_holds_the_whole_of_x"]


# layer_grid_w_in_pieces in layer_grid's design: w copied whole, x moved by an all-to-all.
STRETCH_WITH_W_WHOLE = [
    (
        'w_rows = P("data", "model"), P(("data", "model"), None), P("model", None)',
        'w_rows = P("data", "model"), P(("data", "model"), None), P()',
    ),
    (
        (
            'mine = jax.lax.psum_scatter(tile @ w_rows, "model", scatter_dimension=0, tiled=True)\n'
            "        return jax.nn.sigmoid(mine + b)"
        ),
        (
            'mine = jax.lax.all_to_all(tile, "model", split_axis=0, concat_axis=1, tiled=True)\n'
            "        return jax.nn.sigmoid(mine @ w_rows + b)"
        ),
    ),
]


def test_a_stretch_that_copies_w_to_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    """Right values, and every line of the budget kept but the stretch's own: w in pieces."""
    assert all(old in reference_code() for old, _ in STRETCH_WITH_W_WHOLE), "a replacement finds nothing"
    done = kit(
        "lab",
        "7",
        "--notebook",
        str(variant(7, *STRETCH_WITH_W_WHOLE)),
        "--configs",
        "cpu-1,cpu-8",
        "--hidden",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(7)
    assert all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    failed = {t: o for t, o in outcomes["cpu-8"].items() if o["status"] != "passed"}
    assert set(failed) == {
        "test_layer_grid_w_in_pieces_keeps_w_in_pieces_and_to_the_grid_budget",
        "test_layer_grid_w_in_pieces_holds_its_share_of_w_within_the_grid_budget",  # public, the same budget
    }, failed
    caught = failed.pop("test_layer_grid_w_in_pieces_keeps_w_in_pieces_and_to_the_grid_budget")
    public = failed.popitem()[1]
    assert caught["hidden"] and caught["points"] == 0
    assert not public["hidden"] and public["points"] == 0 and public["message"] == caught["message"], public
    assert "every device holds all of w" in caught["message"] and "does not fit here" in caught["message"], (
        caught
    )


# The all-to-all written by hand as ppermutes inside each grid row: shift s sends each device's block of rows
# (j + s) % m to that device. One collective-permute's pairs span both grid rows, and each pair stays in one.
ALL_TO_ALL_BY_PPERMUTES = design("""    def per_device(tile, w, b):
        m, j = jax.lax.axis_size("model"), jax.lax.axis_index("model")
        blocks = tile.reshape(m, -1, tile.shape[1])  # block k: the rows device k of this grid row keeps
        received = [blocks[j]]  # received[s]: my rows, the features of device (j - s) % m
        for s in range(1, m):
            received.append(jax.lax.ppermute(blocks[(j + s) % m], "model", [(k, (k + s) % m) for k in range(m)]))
        by_device = jnp.stack(received)[(j - jnp.arange(m)) % m]  # (m, my rows, features of each device)
        mine = jnp.transpose(by_device, (1, 0, 2)).reshape(by_device.shape[1], -1)
        return jax.nn.sigmoid(mine @ w + b)
""")


def test_an_all_to_all_written_as_ppermutes_in_each_grid_row_passes_on_1_8_and_32_devices(
    kit, lab_outcomes, variant
):
    assert REFERENCE_DESIGN in reference_code(), "the reference changed: update the design here"
    done = kit(
        "lab",
        "7",
        "--notebook",
        str(variant(7, ALL_TO_ALL_BY_PPERMUTES)),
        "--configs",
        "cpu-1,cpu-8,cpu-32",
        "--hidden",
    )
    outcomes = lab_outcomes(7)
    assert set(outcomes["cpu-32"]) >= GRID_TESTS, sorted(outcomes["cpu-32"])
    failed = {
        (c, t): o["message"] for c in outcomes for t, o in outcomes[c].items() if o["status"] != "passed"
    }
    assert done.returncode == 0 and not failed, failed


def test_the_cancelling_sum_of_the_precision_section_gives_what_the_text_says():
    """A reordered float32 sum can lose everything, not only its last bits: the lab's numbers are checked here."""
    import numpy as np

    text = " ".join("".join(c["source"]) for c in json.loads(catalog.lab(7).reference.read_text())["cells"])
    assert "last\nbits, never by more" not in text and "`[1e8, 1, -1e8, 1]`" in text
    terms = np.array([1e8, 1, -1e8, 1], np.float32)
    left_to_right = np.float32(0)
    for t in terms:
        left_to_right = left_to_right + t
    in_two_blocks = (terms[0] + terms[1]) + (terms[2] + terms[3])
    assert (left_to_right, in_two_blocks, terms.astype(np.float64).sum()) == (1.0, 0.0, 2.0)
    assert (
        "sums to `1.0` left\nto right on one device, to `0.0` on two devices" in text
        and "answer is `2`" in text
    )


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_an_all_to_all_written_as_ppermutes_in_each_grid_row_passes_on_v5e_8(kit, lab_outcomes, variant):
    # the TPU pads its small blocks of rows to tiles of 8 x 128 (300 to 552 KiB of temporaries against x's 32 KiB):
    # whether a device holds all of x is judged there by what it receives
    done = on_v5e_8(kit, 7, str(variant(7, ALL_TO_ALL_BY_PPERMUTES)))
    failed = {t: o["message"] for t, o in lab_outcomes(7)["v5e-8"].items() if o["status"] != "passed"}
    assert done.returncode == 0 and not failed, failed
