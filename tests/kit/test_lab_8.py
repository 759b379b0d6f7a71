"""Lab 8 end to end: a gradient summed over devices instead of averaged is right on one device only."""

import json

from labkit import catalog


def test_a_gradient_of_replicated_parameters_without_pcast_passes_on_cpu_1_and_fails_on_cpu_8(kit, lab_outcomes, variant):
    # The tutorial recipe: jax.grad of the replicated state, then pmean. In JAX 0.10 the gradient
    # already comes back summed over 'data', so the pmean changes nothing: eight times too large on eight devices.
    buggy = variant(8, ('jax.lax.pcast(state, "data", to="varying")', "state"))
    done = kit("lab", "8", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(8)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    grad = outcomes["cpu-8"]["test_gradient_is_the_mean_over_devices_not_a_sum_or_one_device"]
    assert grad["hidden"] and grad["status"] == "failed"
    assert "8 times the whole batch's gradient" in grad["message"] and "summed, not averaged" in grad["message"]
    assert "jax.lax.pcast" in grad["message"]
    curve = outcomes["cpu-8"]["test_training_follows_the_single_device_loss_curve_on_every_device_count"]
    assert curve["status"] == "failed" and "summed over the 8 devices instead of averaged" in curve["message"]
    assert outcomes["cpu-8"]["test_loss_is_the_whole_batch_loss"]["status"] == "passed"


# Right but not data parallel: every device takes the whole batch (x and y given P()).
WHOLE_BATCH = [
    ('in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())', "in_specs=(P(), P(), P()), out_specs=(P(), P())"),
    ('in_specs=(P(), P(), P("data"), P("data")),', "in_specs=(P(), P(), P(), P()),"),
]


def test_the_whole_batch_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(kit, lab_outcomes, variant):
    reference = catalog.lab(8).reference.read_text()
    assert all(json.dumps(old)[1:-1] in reference for old, _ in WHOLE_BATCH), "a replacement finds nothing"
    whole = variant(8, *WHOLE_BATCH)
    done = kit("lab", "8", "--notebook", str(whole), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(8)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), by_config["cpu-1"]
    for test in ("test_gradients_each_device_works_on_its_own_slice_of_the_batch",
                 "test_training_steps_each_device_works_on_its_own_slice_of_the_batch"):
        named = by_config["cpu-8"][test]
        assert named["hidden"] and named["status"] == "failed", named
        assert "every device holds all of x" in named["message"], named
        assert "gradient of the whole batch: that is not data parallelism" in named["message"], named
