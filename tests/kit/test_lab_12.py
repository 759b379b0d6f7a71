"""Lab 12 through the real pipeline: mistakes of sharding in types that are right on one device, and
on eight the hidden tests name each one. Exercise 6 is a design judged by its costs: a wrong layout of each
kind (weights whole on every device, the batch whole, an all-reduce of the whole output) is refused on cpu-8
and on v5e-8 by the cost it breaks, in the hidden test and its public twin; another valid layout passes."""

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


# ---- exercise 6: mlp_in_types, a layout judged by its costs on cpu-8 and on v5e-8 --------------------------

# Each cost's hidden test and its public twin, which `make lab-12` runs: (hidden, public).
WORK = (
    "test_mlp_in_types_splits_the_work_of_a_wider_layer",
    "test_mlp_in_types_gives_each_device_only_its_share_of_the_work",
)
WHOLE = (
    "test_mlp_in_types_never_makes_a_weight_whole",
    "test_mlp_in_types_never_holds_the_whole_of_w1_or_w2",
)
SENT = (
    "test_mlp_in_types_sends_no_more_than_a_reduce_scatter_of_the_output",
    "test_mlp_in_types_sends_at_most_a_reduce_scatter_of_the_output",
)
# cpu-8, and the TPU compiler's program of the same design where libtpu is installed
DESIGN_CONFIGS = ("cpu-8", "v5e-8") if importlib.util.find_spec("libtpu") is not None else ("cpu-8",)

X_LINE = '    x = jax.reshard(x, NamedSharding(mesh, P("data", None)))  # each row of the grid its own rows of the batch\n'
W1_LINE = '    w1 = jax.reshard(w1, NamedSharding(mesh, P(None, "model")))  # each device of a row its own hidden units:\n'
W2_LINE = '    w2 = jax.reshard(w2, NamedSharding(mesh, P("model", None)))  # w1 by columns, w2 by rows; neither whole\n'
OUT_LINE = '    return jnp.matmul(h, w2, out_sharding=NamedSharding(mesh, P("data", None)))\n'

# Data parallelism over the whole grid: the batch split over both axes, both weights whole on every device. Its
# share of the work, little sent, the output where it belongs: only the weights' budget names it.
WEIGHTS_WHOLE = [
    (X_LINE, '    x = jax.reshard(x, NamedSharding(mesh, P(("data", "model"), None)))\n'),
    (W1_LINE, "    w1 = jax.reshard(w1, NamedSharding(mesh, P()))\n"),
    (W2_LINE, "    w2 = jax.reshard(w2, NamedSharding(mesh, P()))\n"),
]
# FSDP over the whole grid: each weight stored in pieces, gathered whole for its product, the batch split over both
# axes. Its share of the work, the output where it belongs: the weights whole in its temporaries, and their gathers
# sent, name it.
WEIGHTS_GATHERED = [
    (X_LINE, '    x = jax.reshard(x, NamedSharding(mesh, P(("data", "model"), None)))\n'),
    (
        W1_LINE,
        '    w1 = jax.reshard(jax.reshard(w1, NamedSharding(mesh, P(None, "model"))), NamedSharding(mesh, P()))\n',
    ),
    (
        W2_LINE,
        '    w2 = jax.reshard(jax.reshard(w2, NamedSharding(mesh, P("model", None))), NamedSharding(mesh, P()))\n',
    ),
    (OUT_LINE, '    return jax.reshard(h @ w2, NamedSharding(mesh, P("data", None)))\n'),
]
# The hidden units split over 'model' but the batch whole on every device: each row of the grid computes every row
# of the batch, and keeps half.
BATCH_WHOLE = [(X_LINE, "    x = jax.reshard(x, NamedSharding(mesh, P()))\n")]
# The layout right, the partial sums added on all eight devices (out_sharding=P()) and the rows cut after: an
# all-reduce of the whole output, twice a reduce-scatter's bytes.
ALL_REDUCED = [
    (
        OUT_LINE,
        "    whole = jnp.matmul(h, w2, out_sharding=NamedSharding(mesh, P()))\n"
        '    return jax.reshard(whole, NamedSharding(mesh, P("data", None)))\n',
    ),
]
# Valid alternatives, the same layout with its sum written by hand in shard_map over the grid: the partial outputs
# added over 'model' by a psum, or by a psum_scatter and an all_gather (a psum in its two halves, the same bytes).
# (out_sharding=P("data", "model") and a reshard to rows after, the halves asked of jit, is not one: both compilers
# write it as an all-reduce, a slice and an all-gather, over the traffic budget.)
SUMMED_BY_HAND = [
    (
        OUT_LINE,
        '    add = lambda h, w2: jax.lax.psum(h @ w2, "model")\n'
        '    specs = (P("data", "model"), P("model", None))\n'
        '    return jax.shard_map(add, mesh=mesh, in_specs=specs, out_specs=P("data", None))(h, w2)\n',
    ),
]
SCATTERED_THEN_GATHERED_BY_HAND = [
    (
        OUT_LINE,
        "    def add(h, w2):\n"
        '        rows = jax.lax.psum_scatter(h @ w2, "model", scatter_dimension=0, tiled=True)\n'
        '        return jax.lax.all_gather(rows, "model", axis=0, tiled=True)\n'
        '    specs = (P("data", "model"), P("model", None))\n'
        '    return jax.shard_map(add, mesh=mesh, in_specs=specs, out_specs=P("data", None), check_vma=False)(h, w2)\n',
    ),
]


def judged_on_designs(kit, lab_outcomes, variant, replacements) -> dict:
    """Lab 12's reference with `replacements` in mlp_in_types, graded with the hidden tests on DESIGN_CONFIGS:
    each configuration's tests that did not pass (a test skipped there is left out)."""
    reference = "".join(
        "".join(c["source"]) for c in json.loads(catalog.lab(12).reference.read_text())["cells"]
    )
    assert all(old in reference for old, _ in replacements), (
        "a design replaces nothing: the reference changed"
    )
    kit(
        "lab",
        "12",
        "--notebook",
        str(variant(12, *replacements)),
        "--configs",
        ",".join(DESIGN_CONFIGS),
        "--hidden",
        "--timeout",
        "600",
        timeout=1200,
    )
    outcomes = lab_outcomes(12)
    return {
        config: {
            t: o for t, o in outcomes[config].items() if o["status"] not in ("passed", "skipped", "skip")
        }
        for config in DESIGN_CONFIGS
    }


REPEATS = ("FLOPs", "devices repeat each other's work", "with the batch whole")
WRONG = {
    # each design: for each cost it breaks, (hidden, public), the words both tests' messages must hold
    "weights-whole-on-every-device": (
        WEIGHTS_WHOLE,
        {WHOLE: ("every device stores the whole of w1", "data parallelism's layout"), WORK: REPEATS},
    ),
    "weights-gathered-for-their-products": (
        WEIGHTS_GATHERED,
        {
            WHOLE: ("the compiled program gathers f32[", "onto each device, the whole of w", "FSDP's"),
            SENT: ("all-gather of f32[", "gathering a weight sends far more than the output"),
        },
    ),
    "batch-whole-on-every-device": (BATCH_WHOLE, {WORK: REPEATS}),
    "all-reduce-of-the-whole-output": (
        ALL_REDUCED,
        {
            SENT: (
                "where the budget is 224 KiB (one reduce-scatter of the whole output over all 8 devices",
                "all-reduce of f32[256,256] over 4 devices",
                "out_sharding=P() on the product adds up every row of the output on every device",
            ),
            WORK: REPEATS,
        },
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_layout_is_refused_by_the_costs_it_breaks_on_cpu_8_and_v5e_8(
    kit, lab_outcomes, variant, name
):
    design, broken = WRONG[name]
    failed = judged_on_designs(kit, lab_outcomes, variant, design)
    for config in DESIGN_CONFIGS:
        shown = {t: o["message"][:300] for t, o in failed[config].items()}
        assert set(failed[config]) == {t for pair in broken for t in pair}, (config, shown)
        for (hidden, public), phrases in broken.items():
            assert failed[config][hidden]["hidden"] and not failed[config][public]["hidden"], (config, shown)
            assert failed[config][hidden]["points"] == 1, failed[config][hidden]
            for outcome in (failed[config][hidden], failed[config][public]):
                assert all(p in outcome["message"] for p in phrases), (config, phrases, outcome["message"])


@pytest.mark.parametrize(
    "design",
    [SUMMED_BY_HAND, SCATTERED_THEN_GATHERED_BY_HAND],
    ids=["psum-over-model", "psum-scatter-then-all-gather-over-model"],
)
def test_the_layout_summed_by_hand_is_accepted_on_cpu_8_and_v5e_8(kit, lab_outcomes, variant, design):
    failed = judged_on_designs(kit, lab_outcomes, variant, design)
    assert not any(failed.values()), {
        c: {t: o["message"][:300] for t, o in f.items()} for c, f in failed.items()
    }
