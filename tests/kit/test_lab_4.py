"""Lab 4 through the real pipeline. Exercise 1: a shard_map over a mesh of one device is caught on eight, and so is
one that gives every device every row. Exercise 2, a design: the anchors cut along with x, x whole on every device,
and vmap with no mesh pass on one device and are named on eight; jit told the shardings passes everywhere.

Each run changes both exercises at once where it can, so that the lab runs as few times as it must."""

from notebook_variants import failed_on_cpu_8, reference_code

# Exercise 1, right in value on one device only: the shard_map route on a mesh of device 0 alone.
ONE_DEVICE_MESH = (
    'mesh = Mesh(np.array(jax.devices()), ("data",))\n    per_device',
    'mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n    per_device',
)
# Exercise 1, right in value, not parallel: every device computes the sums of every row (in_specs=P()).
WHOLE_ON_EVERY_DEVICE = (
    '                                 in_specs=P("data"), out_specs=P("data")))',
    "                                 in_specs=P(), out_specs=P()))",
)
# Exercise 1: each device's sums tiled to the full length, out_specs=P() and check_vma=False. On one device the
# right answer; on eight, device 0's four sums repeated (what plain JAX returns), which the kit's own run of the
# program must give too.
FIRST_SHARD_ONLY = (
    (
        "    return jax.jit(jax.shard_map(lambda block: jax.vmap(sum_of_squares)(block), mesh=mesh,\n"
        '                                 in_specs=P("data"), out_specs=P("data")))'
    ),
    (
        "    return jax.jit(jax.shard_map(lambda block: jnp.tile(jax.vmap(sum_of_squares)(block), "
        'mesh.shape["data"]), mesh=mesh,\n'
        '                                 in_specs=P("data"), out_specs=P(), check_vma=False))'
    ),
)

# Exercise 2's shard_map in the reference, with the placing of x by rows before it.
DISTANCES_SHARD_MAP = """    mapped = jax.jit(jax.shard_map(jax.vmap(distances_of_one_row, in_axes=(0, None)), mesh=mesh,
                                   in_specs=(P("data"), P()), out_specs=P("data")))

    def run(x, anchors):
        # x placed by rows first: this lab's mesh would let the shard_map cut it, a jax.make_mesh mesh
        # would not (labs/meshes.md), and jax.device_put works on both.
        return mapped(jax.device_put(x, rows), anchors)
"""
# (a) The anchors cut along with x: each device compares its rows with its own slice of the anchors only.
ANCHORS_CUT_WITH_X = (
    'in_specs=(P("data"), P()), out_specs=P("data")))\n\n    def run(x, anchors):',
    'in_specs=(P("data"), P("data")), out_specs=P("data")))\n\n    def run(x, anchors):',
)
# (b) x whole on every device: each computes every row's distances and keeps its own rows, so the result is
# right and split by rows, and only what the compiled program holds and computes gives it away.
EVERY_ROW_ON_EVERY_DEVICE = (
    DISTANCES_SHARD_MAP,
    """    def every_row_keep_mine(x, anchors):
        everything = jax.vmap(distances_of_one_row, in_axes=(0, None))(x, anchors)
        mine = x.shape[0] // mesh.shape["data"]
        return jax.lax.dynamic_slice_in_dim(everything, jax.lax.axis_index("data") * mine, mine)

    mapped = jax.jit(jax.shard_map(every_row_keep_mine, mesh=mesh, in_specs=(P(), P()), out_specs=P("data")))

    def run(x, anchors):
        return mapped(x, anchors)
""",
)
# (c) jax.vmap alone, no mesh: every row computed on the device x lives on.
VMAP_ALONE = (
    "    return distances_program(mesh)(x, anchors)",
    "    return jax.vmap(distances_of_one_row, in_axes=(0, None))(x, anchors)",
)
# A design the statement allows: no shard_map, jax.jit told where x, the anchors and the result live, built once.
JIT_WITH_SHARDINGS = (
    DISTANCES_SHARD_MAP,
    """    run = jax.jit(jax.vmap(distances_of_one_row, in_axes=(0, None)),
                  in_shardings=(rows, NamedSharding(mesh, P())), out_shardings=rows)
""",
)


def test_each_replacement_finds_its_text_in_the_reference():
    code = reference_code(4)
    for old, _ in (
        ONE_DEVICE_MESH,
        WHOLE_ON_EVERY_DEVICE,
        FIRST_SHARD_ONLY,
        ANCHORS_CUT_WITH_X,
        EVERY_ROW_ON_EVERY_DEVICE,
        VMAP_ALONE,
        JIT_WITH_SHARDINGS,
    ):
        assert code.count(old) == 1, f"found {code.count(old)} times in the reference: {old!r}"


def test_a_mesh_of_one_device_and_anchors_cut_with_x_pass_on_cpu_1_and_are_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 4, ONE_DEVICE_MESH, ANCHORS_CUT_WITH_X)
    hidden = failed["test_the_shard_map_route_spreads_the_rows_over_every_device"]
    assert hidden["status"] == "failed" and hidden["hidden"], hidden
    assert "all 8 devices" in hidden["message"] and "jax.devices()[:1]" in hidden["message"]
    public = failed["test_the_shard_map_rows_are_spread_over_every_device"]
    assert public["status"] == "failed" and not public["hidden"], public
    assert "lives on 1 (devices [0])" in public["message"] and "jax.devices()[:1]" in public["message"]
    assert "test_both_routes_agree_on_a_random_batch" not in failed
    # One anchor of eight on each device: a column where there should be eight, named in the values test.
    values = failed["test_distances_to_anchors_gives_every_squared_distance"]
    assert values["status"] == "failed" and not values["hidden"], values
    assert "got shape (128, 1)" in values["message"], values["message"]
    assert "the anchors are cut along with x" in values["message"], values["message"]


def test_every_row_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(kit, lab_outcomes, variant):
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 4, WHOLE_ON_EVERY_DEVICE, EVERY_ROW_ON_EVERY_DEVICE)
    # Exercise 1: the shard_map route's result is its work, computed whole on every device it is a copy on
    # every device, and the stack with it; the hidden placement test sees that without the compiled program.
    named = failed["test_the_shard_map_route_spreads_the_rows_over_every_device"]
    assert named["hidden"] and named["status"] == "failed", named
    assert "full copy on every device" in named["message"], named["message"]
    assert "test_both_routes_agree_on_a_random_batch" not in failed
    # Exercise 2: right values, split by rows; the compiled program shows x whole and every row computed.
    distances = {t: o for t, o in failed.items() if o["exercise"] == "distances_to_anchors"}
    assert set(distances) == {
        "test_distances_to_anchors_holds_only_its_rows_of_x",
        "test_distances_to_anchors_computes_only_its_share",
    }, distances
    held = distances["test_distances_to_anchors_holds_only_its_rows_of_x"]["message"]
    assert "every device holds all of x" in held and "in_specs P() for x" in held, held
    work = distances["test_distances_to_anchors_computes_only_its_share"]["message"]
    assert "its 1/8 share" in work and "computes every row's distances" in work, work


def test_a_shard_map_that_keeps_device_0s_rows_and_vmap_alone_pass_on_cpu_1_and_fail_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 4, FIRST_SHARD_ONLY, VMAP_ALONE)
    mine = {t: o["message"] for t, o in failed.items() if o["exercise"] == "shard_map_vs_vmap"}
    assert any("differs from device to device" in m for m in mine.values()), failed
    # Exercise 2 with no mesh at all: the result on device 0, and a compiled program of that device alone.
    alone = {t: o for t, o in failed.items() if o["exercise"] == "distances_to_anchors"}
    assert set(alone) == {
        "test_distances_to_anchors_leaves_its_rows_split_over_every_device",
        "test_distances_to_anchors_holds_only_its_rows_of_x",
        "test_distances_to_anchors_computes_only_its_share",
        "test_distances_to_anchors_of_a_new_batch_stay_split_by_rows",
    }, alone
    placed = alone["test_distances_to_anchors_leaves_its_rows_split_over_every_device"]["message"]
    assert "lives on 1 (devices [0])" in placed and "vmap knows nothing of devices" in placed, placed
    for test in (
        "test_distances_to_anchors_holds_only_its_rows_of_x",
        "test_distances_to_anchors_computes_only_its_share",
    ):
        assert "runs on 1 of the 8 devices" in alone[test]["message"], alone[test]["message"]


def test_jit_told_the_shardings_passes_every_test_on_1_8_and_32_devices(kit, lab_outcomes, variant):
    assert JIT_WITH_SHARDINGS[0] in reference_code(4), "the replacement finds nothing: the reference changed"
    done = kit(
        "lab",
        "4",
        "--notebook",
        str(variant(4, JIT_WITH_SHARDINGS)),
        "--configs",
        "cpu-1,cpu-8,cpu-32",
        "--hidden",
    )
    outcomes = lab_outcomes(4)
    assert set(outcomes) == {"cpu-1", "cpu-8", "cpu-32"}, outcomes.keys()
    not_passed = {
        config: {t: o["message"] for t, o in tests.items() if o["status"] != "passed"}
        for config, tests in outcomes.items()
    }
    assert done.returncode == 0 and not any(not_passed.values()), not_passed
    assert any(o["exercise"] == "distances_to_anchors" for o in outcomes["cpu-32"].values())
