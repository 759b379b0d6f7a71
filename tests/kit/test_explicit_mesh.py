"""Every lab accepts a correct solution written with an Explicit mesh from `jax.make_mesh`.

`jax.make_mesh` gives `AxisType.Explicit` axes by default (JAX 0.10). A student who follows the
current JAX documentation builds meshes that way, and meets sharding in types: inputs must be
placed (`jax.reshard`) before `shard_map` with a spec that names a mesh axis; a matmul contracting
a sharded dimension needs `out_sharding=`; `with_sharding_constraint` gives way to `jax.reshard`.
For each lab, a copy of its reference rewritten that way must pass its public and hidden tests on
one device and on eight, exactly as the reference does.
"""

from __future__ import annotations

import json
import re

import pytest
import sweep

from labkit.course import catalog

ONE_AXIS = re.compile(r'Mesh\(np\.array\(jax\.devices\(\)\), \(("\w+"),\)\)')
GRID = 'Mesh(np.array(jax.devices()).reshape(grid_shape(jax.device_count())), ("rows", "cols"))'
NS = "jax.sharding.NamedSharding"


def explicit_meshes(source: str) -> str:
    """Every mesh of the text built with jax.make_mesh (whose axes are Explicit by default)."""
    source = ONE_AXIS.sub(r"jax.make_mesh((jax.device_count(),), (\1,))", source)
    return source.replace(GRID, 'jax.make_mesh(grid_shape(jax.device_count()), ("rows", "cols"))')


DATA, ROWS, STAGE = 'P("data")', 'P("data", None)', 'P("stage")'
TENSOR_SPECS = '(P(), P(None, "model"), P("model"), P("model", None), P())'  # lab 9: the hidden layer split


def placed(arg: str, spec: str) -> str:
    return f"jax.reshard({arg}, {NS}(mesh, {spec}))"


# (text of the reference, its Explicit rewrite), lab by lab, applied after explicit_meshes().
REWRITES: dict[int, list[tuple[str, str]]] = {
    1: [],
    2: [
        # with_sharding_constraint refers to Auto axes only: reshard is its Explicit counterpart
        (
            'return jax.lax.with_sharding_constraint(total, NamedSharding(grid, P(("rows", "cols"))))',
            'return jax.reshard(total, NamedSharding(grid, P(("rows", "cols"))))',
        ),
        # stretch: a contraction over the sharded 'cols' says where its result lives
        (
            'return jax.lax.with_sharding_constraint(a @ b, NamedSharding(grid, P(("rows", "cols"))))',
            'return jnp.matmul(a, b, out_sharding=NamedSharding(grid, P(("rows", "cols"))))',
        ),
    ],
    3: [
        ("    return double(x)", f"    return double({placed('x', DATA)})"),
        ("    return softmax_program(mesh)(x)", f"    return softmax_program(mesh)({placed('x', ROWS)})"),
    ],
    # x may arrive placed on another (Auto) mesh: move it onto this one once, for both routes
    4: [("    sm_result = per_device(x)", f"    x = {placed('x', DATA)}\n    sm_result = per_device(x)")],
    5: [
        # each exercise's program, built once per mesh, takes x placed as its in_specs say
        (
            "    return column_sums_program(mesh)(x)",
            f"    return column_sums_program(mesh)({placed('x', ROWS)})",
        ),
        (
            "    return rows_to_columns_program(mesh)(x)",
            f"    return rows_to_columns_program(mesh)({placed('x', ROWS)})",
        ),
        # the other five and the stretch take x split along 'data'
        ("_program(mesh)(x)", f"_program(mesh)({placed('x', DATA)})"),
    ],
    6: [
        ("    return mapped(state, x)\n", f"    return mapped(state, {placed('x', ROWS)})\n"),
        (
            "    return mapped(state, x, y)\n",
            f"    return mapped(state, {placed('x', ROWS)}, {placed('y', ROWS)})\n",
        ),
    ],
    7: [
        # a contraction over the sharded axis: say where its result lives
        (
            "    return jax.jit(layer)(x, w, b)",
            (
                "    with jax.set_mesh(mesh):\n"
                "        return jax.jit(lambda x, w, b: jax.nn.sigmoid(jnp.matmul(x, w, out_sharding=P()) + b))(x, w, b)"
            ),
        ),
        (
            'x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("data")))',
            'x = jax.reshard(x, NamedSharding(mesh, P("data")))',
        ),
        (
            'w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P("data", None)))',
            'w = jax.reshard(w, NamedSharding(mesh, P("data", None)))',
        ),
        (
            "        return layer(x, w, b)",
            "        return jax.nn.sigmoid(jnp.matmul(x, w, out_sharding=P()) + b)",
        ),
        # a jitted function that reshards unplaced inputs runs under the mesh it reshards to
        (
            "    return constrained_program(mesh)(x, w, b)",
            "    with jax.set_mesh(mesh):\n        return constrained_program(mesh)(x, w, b)",
        ),
        (
            "    return shard_map_program(mesh)(x, w, b)",
            f"    return shard_map_program(mesh)({placed('x', DATA)}, {placed('w', ROWS)}, b)",
        ),
        # layer_grid and its stretch build their grid with jax.make_mesh already
    ],
    8: [
        (
            "    loss, grads = gradients_program(mesh, graphdef)(state, x, y)",
            f"    loss, grads = gradients_program(mesh, graphdef)(state, {placed('x', DATA)}, {placed('y', DATA)})",
        ),
        (
            "    loss, grads = accumulated_program(mesh, graphdef, int(micro_batches))(state, x, y)",
            (
                f"    loss, grads = accumulated_program(mesh, graphdef, int(micro_batches))(state, {placed('x', DATA)}, "
                f"{placed('y', DATA)})"
            ),
        ),
        ("    losses = []\n", f"    x, y = {placed('x', DATA)}, {placed('y', DATA)}\n    losses = []\n"),
    ],
    9: [
        # each program is built once per mesh; its inputs are placed as its specs say at every call
        (
            "    return tensor_parallel_program(mesh)(x, w1, b1, w2, b2)",
            (
                f"    return tensor_parallel_program(mesh)(*(jax.reshard(a, {NS}(mesh, s)) for a, s in zip("
                f"(x, w1, b1, w2, b2), {TENSOR_SPECS})))"
            ),
        ),
        (
            "    return fsdp_program(mesh)(x, w1, b1, w2, b2)",
            f"    return fsdp_program(mesh)(*(jax.reshard(a, {NS}(mesh, {DATA})) for a in (x, w1, b1, w2, b2)))",
        ),
        (
            "    return fsdp_gradients_program(mesh)(x, y, w1, b1, w2, b2)",
            (
                f"    return fsdp_gradients_program(mesh)(*(jax.reshard(a, {NS}(mesh, {DATA})) "
                f"for a in (x, y, w1, b1, w2, b2)))"
            ),
        ),
        (
            "    return tensor_parallel_scattered_program(mesh)(x, w1, b1, w2, b2)",
            (
                f"    return tensor_parallel_scattered_program(mesh)(*(jax.reshard(a, {NS}(mesh, s)) for a, s in zip("
                f"(x, w1, b1, w2, b2), {TENSOR_SPECS})))"
            ),
        ),
        # stretch: every input placed as its spec says before the shard_map
        (
            "    return _layer_by_layer(mesh)(x, w1, b1, w2, b2)",
            f"    return _layer_by_layer(mesh)(*(jax.reshard(a, {NS}(mesh, {DATA})) for a in (x, w1, b1, w2, b2)))",
        ),
    ],
    10: [
        # pass_to_next_stage, ring_sum and the stretch ring_sum_both_ways end the same way: each has x placed
        ("_program(mesh)(x)", f"_program(mesh)({placed('x', STAGE)})"),
        (
            "    return pipeline_program(mesh)(weights, biases, microbatches)",
            f"    return pipeline_program(mesh)({placed('weights', STAGE)}, {placed('biases', STAGE)}, microbatches)",
        ),
    ],
    11: [
        # the mesh of every exercise (the stretch global_mse included), its devices grouped by process
        (
            'Mesh(np.array(devices_by_process()), ("data",))',
            'jax.make_mesh((jax.device_count(),), ("data",), devices=devices_by_process())',
        ),
    ],
    # the grid of every design, made with jax.make_mesh; the step's shardings then name Explicit axes
    14: [
        (
            'Mesh(np.array(jax.devices()).reshape((2, n // 2) if n % 2 == 0 else (1, n)), ("data", "model"))',
            'jax.make_mesh((2, n // 2) if n % 2 == 0 else (1, n), ("data", "model"))',
        )
    ],
}


def explicit_variant(lab: int) -> dict:
    """The reference notebook of `lab` with every mesh Explicit and the solutions written for it."""
    nb = json.loads(catalog.lab(lab).reference.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if "### BEGIN SOLUTION" not in source and "def grid_mesh" not in source:
            continue  # worked examples stay as they are: only the exercises are judged
        source = explicit_meshes(source)
        for old, new in REWRITES[lab]:
            source = source.replace(old, new)
        cell["source"] = source
    return nb


@pytest.mark.parametrize("lab", sorted(REWRITES))
def test_each_rewrite_replaces_text_of_the_reference(lab):
    reference = "".join(
        explicit_meshes("".join(c["source"]))
        for c in json.loads(catalog.lab(lab).reference.read_text())["cells"]
    )
    for old, _ in REWRITES[lab]:
        assert old in reference, f"lab {lab}: the reference no longer has {old!r}"


def _passes(lab: int, configs: str, kit, lab_outcomes, tmp_path) -> None:
    nb = explicit_variant(lab)
    assert "jax.make_mesh(" in json.dumps(nb), "the variant builds no mesh"
    path = tmp_path / f"lab-{lab}-explicit.ipynb"
    path.write_text(json.dumps(nb))
    done = kit("lab", str(lab), "--notebook", str(path), "--configs", configs, "--hidden")
    outcomes = lab_outcomes(lab)
    failed = {
        config: {t: o["message"] for t, o in tests.items() if o["status"] != "passed"}
        for config, tests in outcomes.items()
    }
    assert done.returncode == 0, failed or done.stdout + done.stderr
    assert set(outcomes) == set(configs.split(",")), outcomes.keys()


@pytest.mark.parametrize("lab", sweep.share(sorted(REWRITES), 0))
def test_a_solution_with_explicit_meshes_passes_every_test_on_one_device_and_on_eight(
    lab, kit, lab_outcomes, tmp_path
):
    _passes(lab, "cpu-1,cpu-8", kit, lab_outcomes, tmp_path)


def test_the_multi_host_lab_with_explicit_meshes_passes_on_two_processes(kit, lab_outcomes, tmp_path):
    _passes(11, "cpu-2x4", kit, lab_outcomes, tmp_path)
