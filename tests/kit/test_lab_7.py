"""Lab 7 through the real pipeline: each approach with its one-device-only mistake passes on cpu-1,
and on cpu-8 a hidden test names the mistake."""

import json

from labkit import catalog

MISTAKES = [
    # layer_jit: the inputs are never placed on the mesh
    ('    x = jax.device_put(x, NamedSharding(mesh, P("data")))\n', ""),
    ('    w = jax.device_put(w, NamedSharding(mesh, P("data", None)))\n', ""),
    ('    b = jax.device_put(b, NamedSharding(mesh, P()))\n', ""),
    # layer_constrained: constraints to a mesh of one device
    ('mesh = Mesh(np.array(jax.devices()), ("data",))\n\n    @jax.jit',
     'mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n\n    @jax.jit'),
    # layer_shard_map: no psum, its check silenced
    ('jax.nn.sigmoid(jax.lax.psum(x_block @ w_block, "data") + b)', "jax.nn.sigmoid(x_block @ w_block + b)"),
    ("out_specs=P())\n    return mapped(x, w, b)", "out_specs=P(), check_vma=False)\n    return mapped(x, w, b)"),
]

NAMED = {
    "test_shard_map_adds_the_partial_products_of_every_device": ["device 0's partial product alone", "psum"],
    "test_jit_runs_on_every_device_when_the_inputs_are_placed": ["full copy on each of 8 devices", "device_put"],
    "test_constraints_spread_the_layer_over_every_device": ["full copy on each of 8 devices", "jax.devices()[:1]"],
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
    ('x = jax.device_put(x, NamedSharding(mesh, P("data")))', "x = jax.device_put(x, NamedSharding(mesh, P()))"),
    ('w = jax.device_put(w, NamedSharding(mesh, P("data", None)))', "w = jax.device_put(w, NamedSharding(mesh, P()))"),
    ('x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("data")))',
     "x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P()))"),
    ('w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P("data", None)))',
     "w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P()))"),
    ('jax.nn.sigmoid(jax.lax.psum(x_block @ w_block, "data") + b)', "jax.nn.sigmoid(x_block @ w_block + b)"),
    ('in_specs=(P("data"), P("data", None), P())', "in_specs=(P(), P(), P())"),
]

SPLIT_TESTS = {
    "test_jit_splits_x_and_w_over_the_devices_and_adds_the_partial_products": "NamedSharding(mesh, P('data'))",
    "test_constraints_split_x_and_w_over_the_devices_and_add_the_partial_products": "Constrain x to P('data')",
    "test_shard_map_splits_x_and_w_over_the_devices_and_adds_the_partial_products": "in_specs=P('data')",
}


def test_each_layer_computed_whole_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(kit, lab_outcomes,
                                                                                         variant):
    cells = json.loads(catalog.lab(7).reference.read_text())["cells"]
    reference = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert all(old in reference for old, _ in WHOLE_ON_EVERY_DEVICE), "a replacement finds nothing"
    whole = variant(7, *WHOLE_ON_EVERY_DEVICE)
    done = kit("lab", "7", "--notebook", str(whole), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(7)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), by_config["cpu-1"]
    for test, phrase in SPLIT_TESTS.items():
        outcome = by_config["cpu-8"][test]
        assert outcome["hidden"] and outcome["status"] == "failed", outcome
        assert "every device holds all of x" in outcome["message"] and phrase in outcome["message"], outcome


def test_a_stretch_that_splits_only_the_batch_passes_on_cpu_1_and_is_named_on_cpu_8(kit, lab_outcomes, variant):
    """layer_batched with x cut by rows alone and w whole: data parallelism, right values, 1/2 of x per device."""
    rows_only = variant(7, ('return jax.nn.sigmoid(jax.lax.psum(x_block @ w_block, "model") + b)',
                            "return jax.nn.sigmoid(x_block @ w_block + b)"),
                        ('specs = (P("data", "model"), P("model", None), P())', 'specs = (P("data", None), P(), P())'))
    done = kit("lab", "7", "--notebook", str(rows_only), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(7)
    assert all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    failed = {t: o for t, o in outcomes["cpu-8"].items() if o["status"] != "passed"}
    assert set(failed) == {"test_layer_batched_stores_one_tile_of_x_per_device_and_splits_the_work"}, failed
    caught = failed.popitem()[1]
    assert caught["hidden"] and caught["points"] == 0
    assert "more than 1/8 of it" in caught["message"] and "P('data', 'model')" in caught["message"]
