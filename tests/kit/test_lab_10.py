"""Lab 10 end to end: a ppermute that sends backwards is right with one stage only."""

import json

from labkit import catalog


def test_a_ppermute_in_the_wrong_direction_passes_on_cpu_1_and_fails_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(10, ("forward = [(i, (i + 1) % n) for i in range(n)]",
                         "forward = [((i + 1) % n, i) for i in range(n)]"))
    done = kit("lab", "10", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(10)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    ring = outcomes["cpu-8"]["test_blocks_move_to_the_next_stage_not_the_previous_one"]
    assert ring["hidden"] and ring["status"] == "failed"
    assert "moved to the previous device, not the next" in ring["message"] and "(source, destination)" in ring["message"]
    pipe = outcomes["cpu-8"]["test_pipeline_sends_activations_forward_through_every_stage"]
    assert pipe["hidden"] and pipe["status"] == "failed"
    assert "activations travelled backwards" in pipe["message"]


# Right but not a pipeline: every device runs every layer on every microbatch.
EVERY_LAYER_EVERYWHERE = [
    ('run = jax.jit(jax.shard_map(per_stage, mesh=mesh, in_specs=(P("stage"), P("stage"), P()), out_specs=P()))',
     "run = jax.jit(lambda w, b, m: jnp.stack([run_layers(w, b, mb) for mb in m]))"),
]


def test_every_layer_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(kit, lab_outcomes, variant):
    reference = catalog.lab(10).reference.read_text()
    assert all(json.dumps(old)[1:-1] in reference for old, _ in EVERY_LAYER_EVERYWHERE), "a replacement finds nothing"
    everywhere = variant(10, *EVERY_LAYER_EVERYWHERE)
    done = kit("lab", "10", "--notebook", str(everywhere), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(10)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), by_config["cpu-1"]
    named = by_config["cpu-8"]["test_pipeline_keeps_each_stages_layers_on_its_own_device"]
    assert named["hidden"] and named["status"] == "failed", named
    assert "every device holds all of the weights" in named["message"] and "not a pipeline" in named["message"]


RING_STEPS = ("        for _ in range(n - 1):  # after n - 1 steps every block has visited every device once\n"
              "            passing = jax.lax.ppermute(passing, \"stage\", perm=forward)\n"
              "            total = total + passing\n"
              "        return total")


def test_a_stretch_ring_sum_written_with_psum_is_named_by_its_hidden_test_on_one_device_and_on_eight(
        kit, lab_outcomes, variant):
    with_psum = variant(10, (RING_STEPS, '        return jax.lax.psum(block, "stage")'))
    done = kit("lab", "10", "--notebook", str(with_psum), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(10)
    for config, says in (("cpu-1", "1 all-reduce(s)"), ("cpu-8", "no collective-permute over all 8 devices")):
        failed = {t: o for t, o in outcomes[config].items() if o["status"] != "passed"}
        assert set(failed) == {"test_ring_sum_is_made_of_collective_permutes_not_an_all_reduce"}, (config, failed)
        caught = failed.popitem()[1]
        assert caught["hidden"] and caught["points"] == 0 and says in caught["message"], caught
