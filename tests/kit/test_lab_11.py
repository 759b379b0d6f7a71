"""Lab 11 through the real pipeline, on one device, on eight and on two processes of four: a step that every
process computes whole on its own is right on one device and named on several; the other ways in each
exercise's text pass everything the reference passes: a global batch placed with jax.device_put from the
dataset every process holds (each process still sends only its own rows) or built by a callback, the whole
array read after a jitted copy to every device, and a step written with shard_map."""

import json

from notebook_variants import not_passed

from labkit.course import catalog

REFERENCE_LOAD = (
    "    start, stop = process_rows(data.shape[0])\n"
    '    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), data[start:stop])'
)
# Every process holds the whole dataset here, and device_put copies to each device only the rows it holds.
PLACED_FROM_THE_WHOLE_DATASET = '    return jax.device_put(data, NamedSharding(mesh, P("data")))'

REFERENCE_STEP = "    ws = jax.device_put(w, NamedSharding(mesh, P()))\n    return _sgd_step(ws, xs, ys)"
# The whole batch's step in each process, on arrays nobody placed, its result copied to every device after.
STEP_OF_THE_WHOLE_BATCH = (
    "    step = _sgd_step(jnp.asarray(w), jnp.asarray(x), jnp.asarray(y))\n"
    "    return jax.device_put(step, NamedSharding(mesh, P()))"
)

STEP_TEST = "test_a_step_gives_each_device_only_its_own_rows_of_the_batch"
PUBLIC_STEP_TEST = "test_a_step_computes_only_the_rows_of_each_device_and_averages_with_an_all_reduce"

# The batch built by a callback that JAX asks for this process's devices' blocks only.
LOADED_BY_CALLBACK = (
    '    rows = NamedSharding(mesh, P("data"))\n'
    "    return jax.make_array_from_callback(data.shape, rows, lambda index: data[index])"
)
REFERENCE_GATHER = "    return np.asarray(multihost_utils.process_allgather(x, tiled=True))"
# A jitted copy, defined once per mesh, puts the whole array on every device; each process reads its own copy.
COPIED_TO_EVERY_DEVICE = """    return np.asarray(copy_everywhere(Mesh(np.array(devices_by_process()), ("data",)))(x))


import functools


@functools.cache
def copy_everywhere(mesh):
    return jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P()))"""
# Each device's gradient of its own rows, averaged over the job with pmean, in a shard_map defined once per mesh.
STEP_BY_HAND = """    ws = jax.device_put(w, NamedSharding(mesh, P()))
    return step_by_hand(mesh)(ws, xs, ys)


import functools


@functools.cache
def step_by_hand(mesh):
    def each_device(w, x, y):
        grad = 2.0 * x.T @ (x @ w - y) / x.shape[0]  # of the mean over this device's rows
        return w - LEARNING_RATE * jax.lax.pmean(grad, "data")

    specs = (P(), P("data"), P("data"))
    return jax.jit(jax.shard_map(each_device, mesh=mesh, in_specs=specs, out_specs=P()))"""


def reference_code() -> str:
    return "".join("".join(c["source"]) for c in json.loads(catalog.lab(11).reference.read_text())["cells"])


def test_a_step_of_the_whole_batch_is_named_on_several_devices_and_a_loader_by_device_put_passes(
    kit, lab_outcomes, variant
):
    reference = reference_code()
    assert REFERENCE_LOAD in reference and REFERENCE_STEP in reference, "the reference changed"
    designs = variant(
        11, (REFERENCE_LOAD, PLACED_FROM_THE_WHOLE_DATASET), (REFERENCE_STEP, STEP_OF_THE_WHOLE_BATCH)
    )
    done = kit("lab", "11", "--notebook", str(designs), "--configs", "cpu-1,cpu-8,cpu-2x4", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    failed = {
        config: {t: o for t, o in outcomes.items() if o["status"] != "passed"}
        for config, outcomes in lab_outcomes(11).items()
    }
    assert failed["cpu-1"] == {}, failed["cpu-1"]
    for config in ("cpu-8", "cpu-2x4"):
        assert set(failed[config]) == {STEP_TEST, PUBLIC_STEP_TEST}, failed[config]
        for test in (STEP_TEST, PUBLIC_STEP_TEST):  # grading's and the student's own `make lab-11`
            caught = failed[config][test]
            assert caught["hidden"] == (test == STEP_TEST), caught
            assert "Every device computes the gradient of the whole batch" in caught["message"], caught


def test_a_batch_built_by_a_callback_a_copy_to_every_device_and_a_step_by_hand_pass_everywhere(
    kit, lab_outcomes, variant
):
    designs = (
        (REFERENCE_LOAD, LOADED_BY_CALLBACK),
        (REFERENCE_GATHER, COPIED_TO_EVERY_DEVICE),
        (REFERENCE_STEP, STEP_BY_HAND),
    )
    assert all(old in reference_code() for old, _ in designs), "the reference changed"
    done = kit(
        "lab", "11", "--notebook", str(variant(11, *designs)), "--configs", "cpu-1,cpu-8,cpu-2x4", "--hidden"
    )
    outcomes = lab_outcomes(11)
    assert set(outcomes) == {"cpu-1", "cpu-8", "cpu-2x4"} and STEP_TEST in outcomes["cpu-2x4"], sorted(
        outcomes
    )
    failed = {config: not_passed(o) for config, o in outcomes.items() if not_passed(o)}
    assert done.returncode == 0 and not failed, (failed, done.stdout[-1500:])
