"""Lab 11 through the real pipeline, on one device, on eight and on two processes of four: a step that every
process computes whole on its own is right on one device and named on several; a global batch placed with
jax.device_put from the dataset every process holds passes, as each process still sends only its own rows."""

import json

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


def test_a_step_of_the_whole_batch_is_named_on_several_devices_and_a_loader_by_device_put_passes(
    kit, lab_outcomes, variant
):
    reference = "".join(
        "".join(c["source"]) for c in json.loads(catalog.lab(11).reference.read_text())["cells"]
    )
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
        assert set(failed[config]) == {STEP_TEST}, failed[config]
        caught = failed[config][STEP_TEST]
        assert (
            caught["hidden"] and "Every device computes the gradient of the whole batch" in caught["message"]
        )
