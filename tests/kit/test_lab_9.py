"""Lab 9 end to end: a bias inside the psum and a psum_scatter left as a sum are right on one device only."""

import json

from labkit import catalog


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


# Right values, no parallelism: every weight whole on every device, no collective.
REPLICATED = [
    # tensor_parallel_mlp: whole weights, no psum
    ('specs = (P(), P(None, "model"), P("model"), P("model", None), P())', "specs = (P(),) * 5"),
    ('return jax.lax.psum(h @ w2, "model") + b2', "return h @ w2 + b2"),
    # fsdp_mlp: the batch split, the weights whole (data parallelism)
    ("in_specs=(P(\"data\"),) * 5, out_specs=P(\"data\")", "in_specs=(P(\"data\"),) + (P(),) * 4, out_specs=P(\"data\")"),
    ('w1, b1, w2, b2 = (jax.lax.all_gather(w, "data", axis=0, tiled=True) for w in (w1, b1, w2, b2))', "pass"),
    # fsdp_gradients: whole weights, whole gradients (psum, not psum_scatter)
    ('whole = tuple(jax.lax.all_gather(w, "data", axis=0, tiled=True) for w in pieces)', "whole = pieces"),
    ('jax.lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True) / n', 'jax.lax.psum(g, "data") / n'),
    ('in_specs=(P("data"),) * 6, out_specs=(P("data"),) * 4', 'in_specs=(P("data"),) * 2 + (P(),) * 4, out_specs=(P(),) * 4'),
]


def test_whole_weights_on_every_device_pass_on_cpu_1_and_are_named_by_the_compiled_program_on_cpu_8(
        kit, lab_outcomes, variant):
    reference = catalog.lab(9).reference.read_text()
    assert all(json.dumps(old)[1:-1] in reference for old, _ in REPLICATED), "a replacement finds nothing"
    replicated = variant(9, *REPLICATED)
    done = kit("lab", "9", "--notebook", str(replicated), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(9)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values()), outcomes["cpu-1"]
    fsdp = outcomes["cpu-8"]["test_fsdp_mlp_stores_each_weight_in_pieces_one_per_device"]
    assert fsdp["hidden"] and fsdp["status"] == "failed", fsdp
    assert "every device holds all of w1" in fsdp["message"] and "data parallelism, not FSDP" in fsdp["message"]
    tensor = outcomes["cpu-8"]["test_tensor_parallel_mlp_splits_the_hidden_layer_and_all_reduces"]
    assert tensor["hidden"] and tensor["status"] == "failed", tensor
    assert "every device holds all of w1" in tensor["message"] and "not tensor parallelism" in tensor["message"]
    gradients = outcomes["cpu-8"]["test_fsdp_gradients_keep_weights_and_gradients_in_pieces"]
    assert gradients["hidden"] and gradients["status"] == "failed", gradients
    assert "data parallelism, not FSDP" in gradients["message"]
    assert outcomes["cpu-8"]["test_fsdp_equals_the_unsplit_mlp_on_a_wider_layer"]["status"] == "passed"


# The stretch with a psum and each device's slice of it: right everywhere, an all-reduce instead of a reduce-scatter.
PSUM_THEN_SLICE = ('return jax.lax.psum_scatter(h @ w2, "model", scatter_dimension=0, tiled=True) + b2',
                   ('total = jax.lax.psum(h @ w2, "model") + b2\n'
                    '        k = total.shape[0] // jax.lax.axis_size("model")\n'
                    '        return jax.lax.dynamic_slice_in_dim(total, jax.lax.axis_index("model") * k, k)'))


def test_a_stretch_that_slices_a_psum_passes_on_cpu_1_and_its_hidden_test_names_the_all_reduce_on_cpu_8(
        kit, lab_outcomes, variant):
    sliced = variant(9, PSUM_THEN_SLICE)
    done = kit("lab", "9", "--notebook", str(sliced), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(9)
    assert all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    failed = {t: o for t, o in outcomes["cpu-8"].items() if o["status"] != "passed"}
    assert set(failed) == {"test_tensor_parallel_scattered_splits_the_hidden_layer_and_reduce_scatters"}, failed
    caught = failed.popitem()[1]
    assert caught["hidden"] and caught["points"] == 0 and caught["exercise"] == "tensor_parallel_scattered"
    assert "no reduce-scatter over all 8 devices" in caught["message"] and "all-reduce over 8" in caught["message"]
