"""Lab 6 through the real pipeline: the mistakes of data parallelism with a Flax NNX layer, and what
the tests say about each; the grid exercise, linear_grid, with designs that keep its budget and two that
break it."""

import json

from labkit.course import catalog

# shard_map_linear on a mesh of one device; shard_map_mse with a local mean, its check silenced.
ONE_DEVICE_ONLY = [
    (
        'mesh = Mesh(np.array(jax.devices()), ("data",))\n    mapped = linear_program(mesh, graphdef)',
        'mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n    mapped = linear_program(mesh, graphdef)',
    ),
    ('return jax.lax.pmean(jnp.mean(error ** 2), "data")', "return jnp.mean(error ** 2)"),
    (
        'in_specs=(P(), P("data", None), P("data", None)), out_specs=P()))',
        'in_specs=(P(), P("data", None), P("data", None)), out_specs=P(), check_vma=False))',
    ),
]

# shard_map_simulate building a new layer for every shard from one shared nnx.Rngs.
REBUILT_PER_SHARD = [
    (
        "model = nnx.Linear(x.shape[-1], features, rngs=nnx.Rngs(seed))\n    chunk",
        "rngs = nnx.Rngs(seed)\n    chunk",
    ),
    ("outs.append(model(x_shard))", "outs.append(nnx.Linear(x.shape[-1], features, rngs=rngs)(x_shard))"),
]


def reference_code() -> str:
    cells = json.loads(catalog.lab(6).reference.read_text())["cells"]
    return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_a_one_device_mesh_and_a_local_mean_pass_on_cpu_1_and_are_named_on_cpu_8(kit, lab_outcomes, variant):
    assert all(old in reference_code() for old, _ in ONE_DEVICE_ONLY), "a mistake replaces nothing"
    done = kit(
        "lab", "6", "--notebook", str(variant(6, *ONE_DEVICE_ONLY)), "--configs", "cpu-1,cpu-8", "--hidden"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    runs = lab_outcomes(6)
    assert runs["cpu-1"] and all(o["status"] == "passed" for o in runs["cpu-1"].values()), runs["cpu-1"]
    split = runs["cpu-8"]["test_linear_keeps_the_rows_of_each_device_on_that_device"]
    assert split["hidden"] and split["status"] == "failed"
    assert "all 8 devices" in split["message"] and "jax.devices()[:1]" in split["message"]
    loss = runs["cpu-8"]["test_mse_is_the_mean_over_the_rows_of_every_device"]
    assert loss["hidden"] and loss["status"] == "failed"
    assert "local mean" in loss["message"] and "pmean" in loss["message"]
    assert runs["cpu-8"]["test_simulate_builds_the_model_once_for_eight_shards"]["status"] == "passed"


def test_a_layer_rebuilt_for_every_shard_is_named_even_on_one_device(kit, lab_outcomes, variant):
    assert all(old in reference_code() for old, _ in REBUILT_PER_SHARD), "a mistake replaces nothing"
    done = kit(
        "lab", "6", "--notebook", str(variant(6, *REBUILT_PER_SHARD)), "--configs", "cpu-1", "--hidden"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    runs = lab_outcomes(6)["cpu-1"]
    for test in (
        "test_simulate_equals_the_layer_on_the_whole_batch",
        "test_simulate_builds_the_model_once_for_eight_shards",
    ):
        assert runs[test]["status"] == "failed" and "built inside the loop" in runs[test]["message"], runs[
            test
        ]
    assert runs["test_linear_equals_the_simulation"]["status"] == "failed"
    assert runs["test_linear_applies_the_seeded_layer_to_every_row"]["status"] == "passed"


# shard_map_mse, right but not parallel: every device takes the whole batch, no pmean.
WHOLE_BATCH = [
    ('return jax.lax.pmean(jnp.mean(error ** 2), "data")', "return jnp.mean(error ** 2)"),
    (
        'in_specs=(P(), P("data", None), P("data", None)), out_specs=P())',
        "in_specs=(P(), P(), P()), out_specs=P())",
    ),
]


def test_a_loss_of_the_whole_batch_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    reference = catalog.lab(6).reference.read_text()
    assert all(json.dumps(old)[1:-1] in reference for old, _ in WHOLE_BATCH), "a replacement finds nothing"
    whole = variant(6, *WHOLE_BATCH)
    done = kit("lab", "6", "--notebook", str(whole), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(6)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), (
        by_config["cpu-1"]
    )
    assert by_config["cpu-8"]["test_mse_is_the_mean_over_the_rows_of_every_device"]["status"] == "passed"
    named = by_config["cpu-8"]["test_mse_gives_each_device_its_own_rows_and_averages_the_losses"]
    assert named["hidden"] and named["status"] == "failed", named
    assert "every device holds all of x" in named["message"] and "not data parallelism" in named["message"]


# -- linear_grid: designs that meet its budget, and two that do not --------------------------------

# The reference: x cut along 'data', the kernel and the bias along 'model', each block of the result computed alone.
REFERENCE_DESIGN = """    columns = {"kernel": P(None, "model"), "bias": P("model")}

    def per_device(rows, local_params):
        state = jax.tree.map(lambda leaf: leaf, abstract)  # a copy, filled with this device's columns
        nnx.replace_by_pure_dict(state, local_params)
        return nnx.merge(graphdef, state)(rows)

    return jax.jit(jax.shard_map(per_device, mesh=grid, in_specs=(P("data", None), columns),
                                 out_specs=P("data", "model")))
"""

# No shard_map: the compiler is told where x, the kernel, the bias and the result lie, and plans the rest.
CONSTRAINED = (
    REFERENCE_DESIGN,
    """    def run(x, params):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(grid, P("data", None)))
        kernel = jax.lax.with_sharding_constraint(params["kernel"], NamedSharding(grid, P(None, "model")))
        bias = jax.lax.with_sharding_constraint(params["bias"], NamedSharding(grid, P("model")))
        return jax.lax.with_sharding_constraint(x @ kernel + bias, NamedSharding(grid, P("data", "model")))

    return jax.jit(run)
""",
)

# The layer copied whole to every device: every feature computed, then the device's own columns kept.
LAYER_WHOLE = (
    REFERENCE_DESIGN,
    """    def per_device(rows, params):
        state = jax.tree.map(lambda leaf: leaf, abstract)
        nnx.replace_by_pure_dict(state, params)
        out = nnx.merge(graphdef, state)(rows)
        k = features // jax.lax.axis_size("model")
        return jax.lax.dynamic_slice_in_dim(out, jax.lax.axis_index("model") * k, k, axis=1)

    return jax.jit(jax.shard_map(per_device, mesh=grid, in_specs=(P("data", None), P()),
                                 out_specs=P("data", "model")))
""",
)

# The batch copied whole to every device, each device cutting out its rows itself.
BATCH_WHOLE = (
    REFERENCE_DESIGN,
    """    columns = {"kernel": P(None, "model"), "bias": P("model")}

    def per_device(x, local_params):
        state = jax.tree.map(lambda leaf: leaf, abstract)
        nnx.replace_by_pure_dict(state, local_params)
        k = x.shape[0] // jax.lax.axis_size("data")
        rows = jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index("data") * k, k)
        return nnx.merge(graphdef, state)(rows)

    return jax.jit(jax.shard_map(per_device, mesh=grid, in_specs=(P(), columns), out_specs=P("data", "model")))
""",
)

GRID_TESTS = {
    "test_linear_grid_applies_the_layer_to_every_row",
    "test_linear_grid_leaves_each_block_of_rows_and_features_on_its_own_device",
    "test_linear_grid_of_a_wider_layer",
    "test_linear_grid_holds_only_its_rows_of_x_and_its_columns_of_the_kernel",
    "test_linear_grid_computes_only_its_share_of_the_products",
    "test_linear_grid_communicates_nothing",
}
# The hidden budget tests' twins in the student's own `make lab-6`: the same helpers, a public layer of the same size.
HELD, PUBLIC_HELD = (
    "test_linear_grid_holds_only_its_rows_of_x_and_its_columns_of_the_kernel",
    "test_linear_grid_holds_its_own_rows_of_x_and_columns_of_the_kernel",
)
WORK, PUBLIC_WORK = (
    "test_linear_grid_computes_only_its_share_of_the_products",
    "test_linear_grid_computes_its_own_block_of_the_products",
)


def run_grid_design(kit, lab_outcomes, notebook) -> dict:
    done = kit("lab", "6", "--notebook", str(notebook), "--configs", "cpu-1,cpu-8", "--hidden")
    outcomes = lab_outcomes(6)
    assert set(outcomes["cpu-8"]) >= GRID_TESTS, sorted(outcomes["cpu-8"])
    assert all(o["status"] == "passed" for o in outcomes["cpu-1"].values()), outcomes["cpu-1"]
    return {
        "returncode": done.returncode,
        "output": done.stdout + done.stderr,
        "failed": {t: o for t, o in outcomes["cpu-8"].items() if o["status"] != "passed"},
    }


def test_a_design_of_sharding_constraints_within_the_budget_passes_every_test(kit, lab_outcomes, variant):
    assert REFERENCE_DESIGN in reference_code(), "the reference's design changed: update REFERENCE_DESIGN"
    ran = run_grid_design(kit, lab_outcomes, variant(6, CONSTRAINED))
    assert ran["returncode"] == 0 and not ran["failed"], ran


def test_a_layer_copied_whole_to_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    ran = run_grid_design(kit, lab_outcomes, variant(6, LAYER_WHOLE))
    assert ran["returncode"] == 1 and set(ran["failed"]) == {HELD, WORK, PUBLIC_HELD, PUBLIC_WORK}, ran
    assert all(o["hidden"] == (t in (HELD, WORK)) for t, o in ran["failed"].items())
    held = ran["failed"][HELD]["message"]
    assert "every device holds all of the kernel" in held and "1/4 of it, cut along 'model'" in held, held
    assert ran["failed"][PUBLIC_HELD]["message"] == held, ran  # the same words in the student's own loop
    work = ran["failed"][WORK]["message"]
    assert "devices repeat each other's work" in work, work
    assert "devices repeat each other's work" in ran["failed"][PUBLIC_WORK]["message"], ran


def test_a_batch_copied_whole_to_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    ran = run_grid_design(kit, lab_outcomes, variant(6, BATCH_WHOLE))
    assert ran["returncode"] == 1 and set(ran["failed"]) == {HELD, PUBLIC_HELD}, ran
    held = ran["failed"][HELD]
    assert held["hidden"] and "every device holds all of x" in held["message"], held
    assert "1/2 of x, cut along 'data'" in held["message"], held
    assert ran["failed"][PUBLIC_HELD]["message"] == held["message"], ran
