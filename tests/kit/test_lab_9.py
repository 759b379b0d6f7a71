"""Lab 9 end to end: a bias inside the psum and a psum_scatter left as a sum are right on one device only."""


def test_a_bias_inside_the_psum_and_an_unscaled_psum_scatter_pass_on_cpu_1_and_fail_on_cpu_8(kit, lab_outcomes,
                                                                                             variant):
    buggy = variant(9, ('jax.lax.psum(h @ w2, "model") + b2', 'jax.lax.psum(h @ w2 + b2, "model")'),
                    ("tiled=True) / n for g in grads)", "tiled=True) for g in grads)"))
    done = kit("lab", "9", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(9)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    bias = outcomes["cpu-8"]["test_tensor_parallel_adds_the_output_bias_once_not_once_per_device"]
    assert bias["hidden"] and bias["status"] == "failed"
    assert "7 extra copies of b2" in bias["message"] and "after jax.lax.psum" in bias["message"]
    mean = outcomes["cpu-8"]["test_fsdp_gradient_is_the_mean_of_the_devices_gradients_not_their_sum"]
    assert mean["hidden"] and mean["status"] == "failed"
    assert "8 times the whole batch's" in mean["message"] and "jax.lax.axis_size('data')" in mean["message"]
    assert outcomes["cpu-8"]["test_fsdp_equals_the_unsplit_mlp"]["status"] == "passed"
