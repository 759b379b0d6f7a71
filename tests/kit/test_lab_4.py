"""Lab 4 through the real pipeline: a shard_map over a mesh of one device is caught on eight, and so is
one that gives every device every row."""

import json

from labkit.course import catalog


def test_a_mesh_of_one_device_passes_on_cpu_1_and_fails_the_hidden_test_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(
        4,
        (
            'mesh = Mesh(np.array(jax.devices()), ("data",))\n    per_device',
            'mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n    per_device',
        ),
    )
    done = kit("lab", "4", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1
    by_config = lab_outcomes(4)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}
    caught = by_config["cpu-8"]["test_the_shard_map_route_spreads_the_rows_over_every_device"]
    assert caught["status"] == "failed" and caught["hidden"]
    assert "all 8 devices" in caught["message"] and "jax.devices()[:1]" in caught["message"]
    assert by_config["cpu-8"]["test_both_routes_agree_on_a_random_batch"]["status"] == "passed"


def test_a_mesh_of_one_device_is_named_by_a_public_test_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(
        4,
        (
            'mesh = Mesh(np.array(jax.devices()), ("data",))\n    per_device',
            'mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n    per_device',
        ),
    )
    done = kit("lab", "4", "--notebook", str(buggy), "--configs", "cpu-8")
    assert done.returncode == 1
    caught = lab_outcomes(4)["cpu-8"]["test_the_shard_map_rows_are_spread_over_every_device"]
    assert caught["status"] == "failed" and not caught["hidden"], caught
    assert "lives on 1 (devices [0])" in caught["message"] and "jax.devices()[:1]" in caught["message"]


# Right in value, not parallel: every device computes the sums of every row (in_specs=P()).
WHOLE_ON_EVERY_DEVICE = (
    'in_specs=P("data"), out_specs=P("data"))\n    sm_result',
    "in_specs=P(), out_specs=P())\n    sm_result",
)


def test_every_row_on_every_device_passes_on_cpu_1_and_fails_the_placement_test_already_there_on_cpu_8(
    kit, lab_outcomes, variant
):
    # The shard_map route's result is its work: computed whole on every device, it is a copy on every
    # device, and the stack with it; the hidden placement test sees that without the compiled program.
    cells = json.loads(catalog.lab(4).reference.read_text())["cells"]
    reference = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert WHOLE_ON_EVERY_DEVICE[0] in reference, "the replacement finds nothing: the reference changed"
    done = kit(
        "lab",
        "4",
        "--notebook",
        str(variant(4, WHOLE_ON_EVERY_DEVICE)),
        "--configs",
        "cpu-1,cpu-8",
        "--hidden",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(4)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}, by_config["cpu-1"]
    assert by_config["cpu-8"]["test_both_routes_agree_on_a_random_batch"]["status"] == "passed"
    named = by_config["cpu-8"]["test_the_shard_map_route_spreads_the_rows_over_every_device"]
    assert named["hidden"] and named["status"] == "failed", named
    assert "full copy on every device" in named["message"], named["message"]


# The per-device sums tiled to the full length, out_specs=P() and check_vma=False: on one device the right answer;
# on eight, device 0's four sums repeated (what plain JAX returns), which the kit's own run of the program must give too.
FIRST_SHARD_ONLY = (
    (
        "per_device = jax.shard_map(lambda block: jax.vmap(sum_of_squares)(block), mesh=mesh,\n"
        '                               in_specs=P("data"), out_specs=P("data"))'
    ),
    (
        "per_device = jax.shard_map(lambda block: jnp.tile(jax.vmap(sum_of_squares)(block), "
        "x.shape[0] // block.shape[0]), mesh=mesh,\n"
        '                               in_specs=P("data"), out_specs=P(), check_vma=False)'
    ),
)


def test_a_shard_map_that_keeps_device_0s_rows_passes_on_cpu_1_and_fails_on_cpu_8(kit, lab_outcomes, variant):
    cells = json.loads(catalog.lab(4).reference.read_text())["cells"]
    reference = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert FIRST_SHARD_ONLY[0] in reference, "the replacement finds nothing: the reference changed"
    done = kit("lab", "4", "--notebook", str(variant(4, FIRST_SHARD_ONLY)), "--configs", "cpu-1,cpu-8")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(4)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}, by_config["cpu-1"]
    failed = {name: o["message"] for name, o in by_config["cpu-8"].items() if o["status"] == "failed"}
    assert any("differs from device to device" in m for m in failed.values()), by_config["cpu-8"]
