"""Lab 8 end to end: a gradient summed over devices instead of averaged is right on one device only; micro-batches
averaged across devices one by one break exercise 3's budget; designs that keep the properties pass."""

import json

import pytest
from notebook_variants import failed_on_cpu_8
from test_tpu_references import HAS_LIBTPU, on_v5e_8

from labkit.course import catalog


def test_a_gradient_of_replicated_parameters_without_pcast_passes_on_cpu_1_and_fails_on_cpu_8(
    kit, lab_outcomes, variant
):
    # The tutorial recipe: jax.grad of the replicated state, then pmean. In JAX 0.10 the gradient
    # already comes back summed over 'data', so the pmean changes nothing: eight times too large on eight devices.
    buggy = variant(8, ('jax.lax.pcast(state, "data", to="varying")', "state"))
    done = kit("lab", "8", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(8)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    grad = outcomes["cpu-8"]["test_gradient_is_the_mean_over_devices_not_a_sum_or_one_device"]
    assert grad["hidden"] and grad["status"] == "failed"
    assert (
        "8 times the whole batch's gradient" in grad["message"] and "summed, not averaged" in grad["message"]
    )
    assert "jax.lax.pcast" in grad["message"]
    curve = outcomes["cpu-8"]["test_training_follows_the_single_device_loss_curve_on_every_device_count"]
    assert curve["status"] == "failed" and "summed over the 8 devices instead of averaged" in curve["message"]
    assert outcomes["cpu-8"]["test_loss_is_the_whole_batch_loss"]["status"] == "passed"


# Right but not data parallel: every device takes the whole batch (x and y given P()).
WHOLE_BATCH = [
    (
        'in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())',
        "in_specs=(P(), P(), P()), out_specs=(P(), P())",
    ),
    ('in_specs=(P(), P(), P("data"), P("data")),', "in_specs=(P(), P(), P(), P()),"),
]


def test_the_whole_batch_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_8(kit, lab_outcomes, variant):
    reference = catalog.lab(8).reference.read_text()
    assert all(json.dumps(old)[1:-1] in reference for old, _ in WHOLE_BATCH), "a replacement finds nothing"
    whole = variant(8, *WHOLE_BATCH)
    done = kit("lab", "8", "--notebook", str(whole), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(8)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), (
        by_config["cpu-1"]
    )
    for test in (
        "test_gradients_each_device_works_on_its_own_slice_of_the_batch",
        "test_training_steps_each_device_works_on_its_own_slice_of_the_batch",
    ):
        named = by_config["cpu-8"][test]
        assert named["hidden"] and named["status"] == "failed", named
        assert "every device holds all of x" in named["message"], named
        assert "gradient of the whole batch: that is not data parallelism" in named["message"], named
    for test in (  # the same budgets in the student's own `make lab-8`
        "test_each_device_takes_the_gradient_of_its_own_rows_and_the_devices_average",
        "test_each_device_takes_a_training_step_on_its_own_rows",
    ):
        named = by_config["cpu-8"][test]
        assert not named["hidden"] and named["status"] == "failed", named
        assert "every device holds all of x" in named["message"], named


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_the_whole_batch_on_every_device_is_named_at_a_production_size_by_the_tpu_compilers_flops(
    kit, lab_outcomes, variant
):
    # a public test a student sees: at d_model 8192 on v5e-8, eight times a chip's share of the products
    on_v5e_8(kit, 8, str(variant(8, *WHOLE_BATCH)))
    at_size = lab_outcomes(8)["v5e-8"][
        "test_at_a_production_size_each_chip_fits_works_on_its_rows_and_sends_one_mean_of_the_gradient"
    ]
    assert at_size["status"] == "failed" and not at_size["hidden"], at_size
    assert "FLOPs" in at_size["message"] and "the gradient of the whole batch" in at_size["message"], at_size


def run_cpu_1_and_8(kit, lab_outcomes, variant, *replacements) -> dict:
    return failed_on_cpu_8(kit, lab_outcomes, variant, 8, *replacements)


ACCUMULATE_WITH_SCAN = """        def add_micro_batch(total, batch):
            return jax.tree.map(jnp.add, total, jax.value_and_grad(local_loss)(mine, *batch)), None

        first = jax.value_and_grad(local_loss)(mine, xs[0], ys[0])
        total, _ = jax.lax.scan(add_micro_batch, first, (xs[1:], ys[1:]))
        loss, grads = jax.tree.map(lambda t: t / count, total)  # a mean of equal-sized means
        return jax.lax.pmean(loss, "data"), jax.lax.pmean(grads, "data")"""

# Exercise 3 as exercise 1 once per micro-batch: right values, an average across devices per micro-batch.
AVERAGE_EVERY_MICRO_BATCH = (
    ACCUMULATE_WITH_SCAN,
    """        steps = [jax.lax.pmean(jax.value_and_grad(local_loss)(mine, xs[i], ys[i]), "data") for i in range(count)]
        return jax.tree.map(lambda *t: sum(t) / count, *steps)""",
)


def test_averaging_every_micro_batch_passes_on_cpu_1_and_is_named_over_budget_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = run_cpu_1_and_8(kit, lab_outcomes, variant, AVERAGE_EVERY_MICRO_BATCH)
    public = "test_accumulated_gradients_are_averaged_across_devices_once_per_step"  # in `make lab-8` too
    assert set(failed) == {"test_accumulation_averages_once_per_step", public}, failed
    caught = failed.pop("test_accumulation_averages_once_per_step")
    assert caught["hidden"] and caught["points"] == 1 and caught["exercise"] == "accumulated_gradients"
    assert "talked once per micro-batch" in caught["message"], caught["message"]
    mine = failed[
        public
    ]  # two micro-batches here, four in the hidden test: 2.0 and 4.0 times the one average
    assert not mine["hidden"] and "2.0 times the" in mine["message"], mine["message"]
    assert "talked once per micro-batch" in mine["message"], mine["message"]


# Designs the prompts allow: the gradient of the loss every device agrees on (no pcast) in every exercise;
# the micro-batches of exercise 3 in a Python loop, averaged across devices once.
GRADIENT_OF_THE_AGREED_LOSS = [
    (
        """        mine = jax.lax.pcast(state, "data", to="varying")  # this device's own copy
        loss, grads = jax.value_and_grad(local_loss)(mine, x, y)
        return jax.lax.pmean(loss, "data"), jax.lax.pmean(grads, "data")""",
        """        return jax.value_and_grad(lambda s: jax.lax.pmean(local_loss(s, x, y), "data"))(state)""",
    ),
    (
        """        mine = jax.lax.pcast(state, "data", to="varying")  # this device's own copy
        loss, grads = jax.value_and_grad(local_loss)(mine, x, y)
        loss, grads = jax.lax.pmean((loss, grads), "data")""",
        """        loss, grads = jax.value_and_grad(lambda s: jax.lax.pmean(local_loss(s, x, y), "data"))(state)""",
    ),
]
MICRO_BATCHES_IN_A_LOOP = (
    ACCUMULATE_WITH_SCAN,
    """        total = [jax.value_and_grad(local_loss)(mine, xs[i], ys[i]) for i in range(count)]
        loss, grads = jax.tree.map(lambda *t: sum(t) / count, *total)
        return jax.lax.pmean(loss, "data"), jax.lax.pmean(grads, "data")""",
)


def test_other_designs_that_keep_the_properties_pass_every_test(kit, lab_outcomes, variant):
    # one run for both: they change different exercises
    assert not run_cpu_1_and_8(
        kit, lab_outcomes, variant, *GRADIENT_OF_THE_AGREED_LOSS, MICRO_BATCHES_IN_A_LOOP
    )


# The stretch's Adam step taken on each device's own gradient, the parameters and moments averaged after: right
# on one device only.
AVERAGE_THE_PARAMETERS = (
    """        loss, grads = jax.lax.pmean(jax.value_and_grad(local_loss)(mine, x, y), "data")
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss""",
    """        loss, grads = jax.value_and_grad(local_loss)(mine, x, y)
        updates, opt_state = tx.update(grads, opt_state, mine)
        state = jax.lax.pmean(optax.apply_updates(mine, updates), "data")
        return state, jax.lax.pmean(opt_state, "data"), jax.lax.pmean(loss, "data")""",
)


def test_a_stretch_that_averages_parameters_after_adam_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant
):
    failed = run_cpu_1_and_8(kit, lab_outcomes, variant, AVERAGE_THE_PARAMETERS)
    assert set(failed) <= {
        "test_adam_averages_gradients_before_the_step_not_parameters_after",
        "test_adam_follows_the_single_device_loss_curve",
    }, failed
    caught = failed["test_adam_averages_gradients_before_the_step_not_parameters_after"]
    assert caught["hidden"] and caught["points"] == 0
    assert "the average of the steps is not the step of the average" in caught["message"], caught["message"]
