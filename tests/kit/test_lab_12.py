"""Lab 12 through the real pipeline: mistakes of sharding in types that are right on one device, and
on eight the hidden tests name each one."""

import importlib.util
import json

import pytest

from labkit.course import catalog

# (text in the reference, the mistake put in its place)
MISTAKES = [
    # place_rows: a mesh of one device, still typed float32[...@data]
    (
        '    mesh = jax.make_mesh((jax.device_count(),), ("data",))\n    return jax.reshard(x, NamedSharding(mesh, P("data", None)))',
        (
            '    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])\n'
            '    return jax.reshard(x, NamedSharding(mesh, P("data", None)))'
        ),
    ),
    # contract_to_rows: an all-reduce where a reduce-scatter belongs
    ('out_sharding=NamedSharding(mesh, P("data", None)))', "out_sharding=NamedSharding(mesh, P()))"),
    # block_maxima: the maximum across devices instead of each block's own
    ("jnp.max(block, keepdims=True)", 'jax.lax.pmax(jnp.max(block, keepdims=True), "data")'),
]

NAMED = {
    "test_place_rows_puts_a_different_block_of_rows_on_every_device": "take the mesh's size from jax.device_count()",
    "test_contract_to_rows_reduce_scatters_instead_of_all_reducing": "out_sharding=P() all-reduces",
    "test_block_maxima_of_a_random_vector": "a pmax across 'data'",
}


def test_the_reference_passes_every_test_on_one_device_and_on_eight(kit, lab_outcomes):
    done = kit(
        "lab", "12", "--notebook", str(catalog.lab(12).reference), "--configs", "cpu-1,cpu-8", "--hidden"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    by_config = lab_outcomes(12)
    for config in ("cpu-1", "cpu-8"):
        assert by_config[config] and all(o["status"] == "passed" for o in by_config[config].values()), (
            by_config[config]
        )


def test_every_mistake_passes_on_cpu_1_and_is_named_by_a_hidden_test_on_cpu_8(kit, lab_outcomes, variant):
    reference = "".join(
        "".join(c["source"]) for c in json.loads(catalog.lab(12).reference.read_text())["cells"]
    )
    assert all(old in reference for old, _ in MISTAKES), "a mistake replaces nothing: the reference changed"
    buggy = variant(12, *MISTAKES)
    done = kit("lab", "12", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(12)
    assert by_config["cpu-1"] and all(o["status"] == "passed" for o in by_config["cpu-1"].values()), (
        by_config["cpu-1"]
    )
    for test, phrase in NAMED.items():
        outcome = by_config["cpu-8"][test]
        assert outcome["hidden"] and outcome["status"] == "failed", outcome
        assert phrase in outcome["message"], outcome["message"]


def test_the_reference_passes_on_two_processes_of_four_devices(kit, lab_outcomes):
    done = kit("lab", "12", "--notebook", str(catalog.lab(12).reference), "--configs", "cpu-2x4", "--hidden")
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = lab_outcomes(12)["cpu-2x4"]
    assert outcomes and all(o["status"] == "passed" for o in outcomes.values()), outcomes


# The product made whole on every device and then cut to rows: its layout is right, and XLA:CPU compiles it as
# it compiles the reference (one all-reduce), so only the TPU program names it.
WHOLE_THEN_ROWS = (
    'return jnp.matmul(a, b, out_sharding=NamedSharding(mesh, P("data", None)))',
    'return jax.reshard(jnp.matmul(a, b, out_sharding=NamedSharding(mesh, P())), NamedSharding(mesh, P("data", None)))',
)
SENDS_LESS = "test_contract_to_rows_sends_less_than_an_all_reduce_of_the_product"
PUBLIC_SENDS_LESS = "test_contract_to_rows_sends_each_device_less_than_an_all_reduce_of_the_product"


@pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed: make setup EXTRAS=tpu"
)
def test_the_product_made_whole_then_cut_passes_on_cpu_8_and_is_named_on_v5e_8(kit, lab_outcomes, variant):
    done = kit(
        "lab", "12", "--notebook", str(variant(12, WHOLE_THEN_ROWS)), "--configs", "cpu-8,v5e-8", "--hidden"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(12)
    assert SENDS_LESS not in by_config["cpu-8"]  # skipped there: XLA:CPU writes both designs alike
    assert all(o["status"] == "passed" for o in by_config["cpu-8"].values()), by_config["cpu-8"]
    failed = {t: o for t, o in by_config["v5e-8"].items() if o["status"] != "passed"}
    # the hidden test and its public twin, in the same words
    assert set(failed) == {SENDS_LESS, PUBLIC_SENDS_LESS}, failed
    assert "an all-reduce of the whole product" in failed[PUBLIC_SENDS_LESS]["message"], failed
    message = failed[SENDS_LESS]["message"]
    assert "an all-reduce of the whole product" in message and "out_sharding=P('data', None)" in message, (
        message
    )


# The same rows by hand: shard_map over the contracted dimension and a psum_scatter of the partial products.
# libtpu sums this small reduce-scatter (384 bytes) with an all-reduce, its own choice of form: the design is
# charged as the reduce-scatter it asks for, and passes on both.
BY_HAND = (
    '    return jnp.matmul(a, b, out_sharding=NamedSharding(mesh, P("data", None)))',
    "    return jax.shard_map(\n"
    '        lambda x, y: jax.lax.psum_scatter(x @ y, "data", scatter_dimension=0, tiled=True),\n'
    '        mesh=mesh, in_specs=(P(None, "data"), P("data", None)), out_specs=P("data", None),\n'
    "    )(a, b)",
)


@pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed: make setup EXTRAS=tpu"
)
def test_the_rows_by_a_hand_written_psum_scatter_pass_on_cpu_8_and_on_v5e_8(kit, lab_outcomes, variant):
    done = kit("lab", "12", "--notebook", str(variant(12, BY_HAND)), "--configs", "cpu-8,v5e-8", "--hidden")
    by_config = lab_outcomes(12)
    for config in ("cpu-8", "v5e-8"):
        assert all(o["status"] in ("passed", "skipped") for o in by_config[config].values()), by_config[
            config
        ]
    assert done.returncode == 0, done.stdout + done.stderr
