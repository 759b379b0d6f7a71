"""Lab 9 end to end: a bias inside the psum and a psum_scatter left as a sum are right on one device only;
designs that copy what they should split, or send more than they need, are named by the compiled program;
designs that keep to the properties pass, whichever collectives they chose."""

import json

import pytest
from notebook_variants import failed_on_cpu_8
from test_tpu_references import HAS_LIBTPU, on_v5e_8

from labkit.course import catalog


def test_a_bias_inside_the_psum_and_an_unscaled_psum_scatter_pass_on_cpu_1_and_fail_on_cpu_8(
    kit, lab_outcomes, variant
):
    buggy = variant(
        9,
        ('jax.lax.psum(h @ w2, "model") + b2', 'jax.lax.psum(h @ w2 + b2, "model")'),
        ("tiled=True) / n for g in grads)", "tiled=True) for g in grads)"),
    )
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
    (
        'in_specs=(P("data"),) * 5, out_specs=P("data")',
        'in_specs=(P("data"),) + (P(),) * 4, out_specs=P("data")',
    ),
    (
        'w1, b1, w2, b2 = (jax.lax.all_gather(w, "data", axis=0, tiled=True) for w in (w1, b1, w2, b2))',
        "pass",
    ),
    # fsdp_gradients: whole weights, whole gradients (psum, not psum_scatter)
    ('whole = tuple(jax.lax.all_gather(w, "data", axis=0, tiled=True) for w in pieces)', "whole = pieces"),
    ('jax.lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True) / n', 'jax.lax.psum(g, "data") / n'),
    (
        'in_specs=(P("data"),) * 6, out_specs=(P("data"),) * 4',
        'in_specs=(P("data"),) * 2 + (P(),) * 4, out_specs=(P(),) * 4',
    ),
]


def test_whole_weights_on_every_device_pass_on_cpu_1_and_are_named_by_the_compiled_program_on_cpu_8(
    kit, lab_outcomes, variant
):
    reference = catalog.lab(9).reference.read_text()
    assert all(json.dumps(old)[1:-1] in reference for old, _ in REPLICATED), "a replacement finds nothing"
    replicated = variant(9, *REPLICATED)
    done = kit("lab", "9", "--notebook", str(replicated), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(9)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values()), [
        o for o in outcomes["cpu-1"].values() if o["status"] != "passed"
    ]
    fsdp = outcomes["cpu-8"]["test_fsdp_mlp_stores_each_weight_in_pieces_one_per_device"]
    assert fsdp["hidden"] and fsdp["status"] == "failed", fsdp
    assert (
        "every device holds all of w1" in fsdp["message"] and "data parallelism, not FSDP" in fsdp["message"]
    )
    tensor = outcomes["cpu-8"]["test_tensor_parallel_mlp_splits_the_hidden_layer_and_its_work"]
    assert tensor["hidden"] and tensor["status"] == "failed", tensor
    assert (
        "every device holds all of w1" in tensor["message"] and "not tensor parallelism" in tensor["message"]
    )
    public = outcomes["cpu-8"][
        "test_fsdp_mlp_keeps_every_weight_split_over_the_devices"
    ]  # in `make lab-9` too
    assert not public["hidden"] and public["status"] == "failed", public
    assert (
        "every device holds all of w1" in public["message"]
        and "data parallelism, not FSDP" in public["message"]
    )
    gradients = outcomes["cpu-8"]["test_fsdp_gradients_keep_weights_and_gradients_in_pieces"]
    assert gradients["hidden"] and gradients["status"] == "failed", gradients
    assert "data parallelism, not FSDP" in gradients["message"]
    assert outcomes["cpu-8"]["test_fsdp_equals_the_unsplit_mlp_on_a_wider_layer"]["status"] == "passed"


def run_cpu_1_and_8(kit, lab_outcomes, variant, *replacements) -> dict:
    return failed_on_cpu_8(kit, lab_outcomes, variant, 9, *replacements)


# The hidden budget tests and their twins in the student's own `make lab-9` (the same helpers, public inputs).
SCATTERED_SENDS, PUBLIC_SCATTERED_SENDS = (
    "test_tensor_parallel_scattered_sends_only_its_share_of_the_output",
    "test_tensor_parallel_scattered_sends_a_share_of_the_output_not_all_of_it",
)


def hidden_and_public(failed: dict, hidden: str, public: str) -> dict:
    """The hidden test's outcome, once its public twin is checked to have failed in the same words."""
    assert failed[hidden]["hidden"] and not failed[public]["hidden"], failed
    assert failed[public]["message"] == failed[hidden]["message"], failed
    return failed[hidden]


# Exercise 4 with a psum and each device's slice of it: right everywhere, twice the traffic of a reduce-scatter.
PSUM_THEN_SLICE = (
    'return jax.lax.psum_scatter(h @ w2, "model", scatter_dimension=0, tiled=True) + b2',
    (
        'total = jax.lax.psum(h @ w2, "model") + b2\n'
        '        k = total.shape[0] // jax.lax.axis_size("model")\n'
        '        return jax.lax.dynamic_slice_in_dim(total, jax.lax.axis_index("model") * k, k)'
    ),
)


def test_a_scattered_output_sliced_from_a_psum_passes_on_cpu_1_and_is_named_over_budget_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = run_cpu_1_and_8(kit, lab_outcomes, variant, PSUM_THEN_SLICE)
    assert set(failed) == {SCATTERED_SENDS, PUBLIC_SCATTERED_SENDS}, failed
    caught = hidden_and_public(failed, SCATTERED_SENDS, PUBLIC_SCATTERED_SENDS)
    assert caught["hidden"] and caught["points"] == 1 and caught["exercise"] == "tensor_parallel_scattered"
    assert "adds the whole output on every device (an all-reduce)" in caught["message"], caught["message"]
    assert "all-reduce of f32[256,128] over 8 devices" in caught["message"], caught["message"]


# Exercise 4 as jax.jit with the rows split in out_shardings: the CPU compiler makes it an all-reduce and a slice.
# Over budget on cpu-8, and told so without being blamed for a psum it never wrote.
SCATTERED_BY_JIT = (
    '    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=P("model", None)))',
    "    return jax.jit(mlp, in_shardings=[jax.sharding.NamedSharding(mesh, s) for s in specs],\n"
    '                   out_shardings=jax.sharding.NamedSharding(mesh, P("model", None)))',
)


def test_a_scattered_output_by_jit_shardings_is_told_the_compilers_choice_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = run_cpu_1_and_8(kit, lab_outcomes, variant, SCATTERED_BY_JIT)
    assert set(failed) == {SCATTERED_SENDS, PUBLIC_SCATTERED_SENDS}, failed
    message = hidden_and_public(failed, SCATTERED_SENDS, PUBLIC_SCATTERED_SENDS)["message"]
    assert "jax.jit with the rows split in out_shardings when the compiler chooses the all-reduce" in message
    assert "as XLA:CPU did here" in message, message
    assert "all-reduce of f32[256,128] over 8 devices" in message, message


# Exercise 1 gathering its split weights and computing everything on every device: right, the work not split.
GATHER_AND_COMPUTE_ALL = [
    (
        (
            "        h = jnp.tanh(x @ w1 + b1)  # this device's columns of the hidden layer\n"
            '        return jax.lax.psum(h @ w2, "model") + b2'
        ),
        (
            '        w1, b1, w2 = (jax.lax.all_gather(w, "model", axis=a, tiled=True) for w, a in ((w1, 1), (b1, 0), (w2, 0)))\n'
            "        return jnp.tanh(x @ w1 + b1) @ w2 + b2"
        ),
    ),
    ("in_specs=specs, out_specs=P()))", "in_specs=specs, out_specs=P(), check_vma=False))"),
]


def test_weights_gathered_whole_for_the_forward_pass_pass_on_cpu_1_and_are_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = run_cpu_1_and_8(kit, lab_outcomes, variant, *GATHER_AND_COMPUTE_ALL)
    hidden, public = (
        "test_tensor_parallel_mlp_splits_the_hidden_layer_and_its_work",
        "test_tensor_parallel_mlp_gives_each_device_its_own_hidden_units_and_their_work",
    )
    assert set(failed) == {hidden, public}, failed
    caught = hidden_and_public(failed, hidden, public)
    assert caught["hidden"] and "devices repeat each other's work" in caught["message"], caught["message"]


# Designs the prompts allow: exercise 1's partial outputs added by a reduce-scatter then an all-gather (a psum
# in its two halves). all_gather's result stays varying for check_vma, so this design turns the check off to
# return it with out_specs=P(); so does the one above.
NO_CHECK = ("in_specs=specs, out_specs=P()))", "in_specs=specs, out_specs=P(), check_vma=False))")
REDUCE_SCATTER_THEN_ALL_GATHER = (
    'return jax.lax.psum(h @ w2, "model") + b2',
    (
        'rows = jax.lax.psum_scatter(h @ w2, "model", scatter_dimension=0, tiled=True)\n'
        '        return jax.lax.all_gather(rows, "model", axis=0, tiled=True) + b2'
    ),
)
# Exercise 4's reduce-scatter written by hand as a ring of ppermutes (lab 10's way): n - 1 blocks of rows, each
# 1/n of the output, leave each device: exactly the budget.
SCATTERED_BY_A_RING = (
    '        return jax.lax.psum_scatter(h @ w2, "model", scatter_dimension=0, tiled=True) + b2\n',
    (
        '        n, i = jax.lax.axis_size("model"), jax.lax.axis_index("model")\n'
        "        blocks = (h @ w2).reshape(n, -1, w2.shape[1])\n"
        "        total = blocks[(i - 1) % n]\n"
        "        for s in range(1, n):  # pass the running sum on; add this device's term of the next block\n"
        '            total = jax.lax.ppermute(total, "model", [(j, (j + 1) % n) for j in range(n)])\n'
        "            total = total + blocks[(i - s - 1) % n]\n"
        "        return total + b2\n"
    ),
)


@pytest.mark.parametrize(
    "other",
    [[REDUCE_SCATTER_THEN_ALL_GATHER, NO_CHECK], [SCATTERED_BY_A_RING]],
    ids=["reduce-scatter-then-all-gather", "ring-of-ppermutes"],
)
def test_another_design_that_keeps_the_properties_passes_every_test(kit, lab_outcomes, variant, other):
    assert not run_cpu_1_and_8(kit, lab_outcomes, variant, *other)


# The stretch gathering both layers at once, as exercise 2 does: only the stretch's memory test names it.
BOTH_LAYERS_AT_ONCE = (
    "        h, w2 = jax.lax.optimization_barrier((h, w2))  # w2 is gathered only once h exists\n",
    "",
)


def test_a_stretch_that_gathers_both_layers_at_once_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = run_cpu_1_and_8(kit, lab_outcomes, variant, BOTH_LAYERS_AT_ONCE)
    hidden, public = (
        "test_fsdp_layer_by_layer_never_holds_both_layers_whole",
        "test_fsdp_layer_by_layer_gathers_one_layer_at_a_time",
    )
    assert set(failed) == {hidden, public}, failed
    assert not failed[public]["hidden"] and "both layers were gathered at once" in failed[public]["message"]
    caught = failed[hidden]
    assert (
        caught["hidden"]
        and caught["points"] == 0
        and "both layers were gathered at once" in caught["message"]
    )


# FSDP with the whole batch on every device: each gathers the batch, computes it all, and keeps its own rows (of
# the output, of each gradient). Right values, pieces where they belong; only the FLOPs per device tell.
WHOLE_BATCH_EVERYWHERE = [
    (
        (
            '        w1, b1, w2, b2 = (jax.lax.all_gather(w, "data", axis=0, tiled=True) for w in (w1, b1, w2, b2))\n'
            "        return jnp.tanh(x @ w1 + b1) @ w2 + b2"
        ),
        (
            '        w1, b1, w2, b2 = (jax.lax.all_gather(w, "data", axis=0, tiled=True) for w in (w1, b1, w2, b2))\n'
            '        x = jax.lax.all_gather(x, "data", axis=0, tiled=True)  # the whole batch on every device\n'
            "        out = jnp.tanh(x @ w1 + b1) @ w2 + b2\n"
            '        k = out.shape[0] // jax.lax.axis_size("data")\n'
            '        return jax.lax.dynamic_slice_in_dim(out, jax.lax.axis_index("data") * k, k)'
        ),
    ),
    (
        (
            "        grads = jax.grad(local_loss)(whole, x, y)  # this device's slice of the batch, whole weights\n"
            '        n = jax.lax.axis_size("data")\n'
            '        return tuple(jax.lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True) / n for g in grads)'
        ),
        (
            '        x, y = (jax.lax.all_gather(a, "data", axis=0, tiled=True) for a in (x, y))  # the whole batch\n'
            "        grads = jax.grad(local_loss)(whole, x, y)\n"
            '        n, i = jax.lax.axis_size("data"), jax.lax.axis_index("data")\n'
            "        return tuple(jax.lax.dynamic_slice_in_dim(g, i * (len(g) // n), len(g) // n) for g in grads)"
        ),
    ),
]


def test_fsdp_with_the_whole_batch_on_every_device_passes_on_cpu_1_and_is_named_by_its_flops_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = run_cpu_1_and_8(kit, lab_outcomes, variant, *WHOLE_BATCH_EVERYWHERE)
    assert {
        "test_fsdp_mlp_splits_the_batch_and_its_work",
        "test_fsdp_gradients_split_the_batch_and_its_work",
    } <= set(failed), failed
    assert {  # and the same budgets in the student's own `make lab-9`
        "test_fsdp_mlp_computes_only_the_rows_of_its_own_slice",
        "test_fsdp_gradients_compute_only_the_rows_of_their_own_slice",
    } <= set(failed), failed
    for caught in failed.values():
        assert "FLOPs" in caught["message"] and "the whole batch" in caught["message"], caught


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_fsdp_with_the_whole_batch_is_named_at_a_production_size_by_the_tpu_compilers_flops(
    kit, lab_outcomes, variant
):
    # the design the board must never rank above a split one: on v5e-8 its program at d_model 8192 does
    # eight times a chip's share of the products, which the public test names with the compiler's count
    on_v5e_8(kit, 9, str(variant(9, WHOLE_BATCH_EVERYWHERE[0])))
    at_size = lab_outcomes(9)["v5e-8"]["test_at_a_production_size_fsdp_fits_each_chip_and_splits_the_work"]
    assert at_size["status"] == "failed" and not at_size["hidden"], at_size
    assert "FLOPs" in at_size["message"] and "the whole batch" in at_size["message"], at_size


# What a program compiled for the TPU is judged on: the lowering whose value is verified, and one design at every
# size. tensor_parallel_mlp gives its design on CPU and zeros on the TPU (jax.lax.platform_dependent); fsdp_mlp
# computes nothing at the production size (a Python branch on the input's size).
PLATFORM_AND_SIZE = [
    (
        "    return tensor_parallel_program(mesh)(x, w1, b1, w2, b2)",
        "    return jax.lax.platform_dependent(x, w1, b1, w2, b2, cpu=tensor_parallel_program(mesh),"
        " default=lambda x, w1, b1, w2, b2: jnp.zeros((x.shape[0], w2.shape[1]), x.dtype))",
    ),
    (
        "    return fsdp_program(mesh)(x, w1, b1, w2, b2)",
        "    if x.shape[0] > 4096:\n        return jnp.zeros((x.shape[0], w2.shape[1]), x.dtype)\n"
        "    return fsdp_program(mesh)(x, w1, b1, w2, b2)",
    ),
]


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_a_platform_branch_is_judged_by_its_tpu_lowering_and_a_size_branch_is_refused_at_the_production_size(
    kit, lab_outcomes, variant
):
    on_v5e_8(kit, 9, str(variant(9, *PLATFORM_AND_SIZE)))
    outcomes = lab_outcomes(9)["v5e-8"]
    equal = outcomes["test_tensor_parallel_equals_the_unsplit_mlp"]
    assert equal["status"] == "failed", equal  # the value graded is the TPU lowering's zeros
    at_size = outcomes["test_at_a_production_size_fsdp_fits_each_chip_and_splits_the_work"]
    assert at_size["status"] != "passed" and "branches on its input's size" in at_size["message"], at_size
    assert outcomes["test_fsdp_equals_the_unsplit_mlp"]["status"] == "passed"  # the course size is the design


# fsdp_mlp as tensor parallelism: x whole on every device, the weights split by hidden units, the partial outputs
# summed into rows. Right, a share of the work, the weights in pieces: only where x is kept names it.
FSDP_AS_TENSOR_PARALLEL = [
    (
        '        w1, b1, w2, b2 = (jax.lax.all_gather(w, "data", axis=0, tiled=True) for w in (w1, b1, w2, b2))\n'
        "        return jnp.tanh(x @ w1 + b1) @ w2 + b2",
        "        h = jnp.tanh(x @ w1 + b1)\n"
        '        return jax.lax.psum_scatter(h @ w2, "data", scatter_dimension=0, tiled=True) + b2',
    ),
    (
        'in_specs=(P("data"),) * 5, out_specs=P("data")',
        'in_specs=(P(), P(None, "data"), P("data"), P("data", None), P()), out_specs=P("data")',
    ),
]
# tensor_parallel_scattered as FSDP: the weights gathered whole, each device its own rows of x.
SCATTERED_AS_FSDP = [
    (
        "        h = jnp.tanh(x @ w1 + b1)  # this device's columns of the hidden layer\n"
        '        return jax.lax.psum_scatter(h @ w2, "model", scatter_dimension=0, tiled=True) + b2',
        '        w1, b1, w2 = (jax.lax.all_gather(w, "model", axis=a, tiled=True) for w, a in ((w1, 1), (b1, 0), (w2, 0)))\n'
        '        rows = x.shape[0] // jax.lax.axis_size("model")\n'
        '        mine = jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index("model") * rows, rows)\n'
        "        return jnp.tanh(mine @ w1 + b1) @ w2 + b2",
    ),
]
# fsdp_gradients with pmean, then each device's slice: right, split like the weights, twice a reduce-scatter's bytes.
PMEAN_THEN_SLICE = [
    (
        '        return tuple(jax.lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True) / n for g in grads)',
        '        i = jax.lax.axis_index("data")\n'
        "        mine = lambda g: jax.lax.dynamic_slice_in_dim(g, i * (len(g) // n), len(g) // n)\n"
        '        return tuple(mine(jax.lax.pmean(g, "data")) for g in grads)',
    ),
]


def test_wrong_designs_of_three_exercises_pass_on_cpu_1_and_are_named_by_their_budgets_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = failed_on_cpu_8(
        kit, lab_outcomes, variant, 9, *FSDP_AS_TENSOR_PARALLEL, *SCATTERED_AS_FSDP, *PMEAN_THEN_SLICE
    )
    assert {
        "test_fsdp_splits_the_batch_as_well_as_the_weights",
        "test_tensor_parallel_scattered_moves_partial_outputs_never_weights",
        "test_fsdp_gradients_are_summed_into_pieces_with_a_reduce_scatters_traffic",
    } <= set(failed), failed
    assert (
        "every device holds all of x"
        in failed["test_fsdp_splits_the_batch_as_well_as_the_weights"]["message"]
    )
    traffic = failed["test_fsdp_gradients_are_summed_into_pieces_with_a_reduce_scatters_traffic"]
    assert not traffic["hidden"] and "all-reduce" in traffic["message"], traffic
