"""Lab 8 end to end: a gradient summed over devices instead of averaged is right on one device only."""


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
