"""Lab 3 through the real pipeline: a shard_map that gives every device the whole vector is right on one
device, and on eight the hidden test that reads where the result lives already names it. The design
exercise, row_softmax: each plausible wrong cut passes on one device and is named on eight, and a design
the handout does not show (jax.jit with shardings) passes on 1, 8 and 32 devices.

shard_map_double's result is all its work: with in_specs=P() and out_specs=P() every device doubles
the whole vector and the result is a copy on every device, which the placement test sees. (A body
that doubles the whole vector and keeps one block of it would need axis_index and slicing: no
solution comes to it by accident.)
"""

import json

import pytest
from notebook_variants import LAB_3_TESTS, failures_by_config, not_passed

from labkit.course import catalog

WHOLE_ON_EVERY_DEVICE = (
    'block: block * 2.0, mesh=mesh, in_specs=P("data"), out_specs=P("data")',
    "block: block * 2.0, mesh=mesh, in_specs=P(), out_specs=P()",
)


def test_doubling_the_whole_vector_on_every_device_passes_on_cpu_1_and_fails_the_hidden_test_on_cpu_8(
    kit, lab_outcomes, variant
):
    cells = json.loads(catalog.lab(3).reference.read_text())["cells"]
    reference = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert WHOLE_ON_EVERY_DEVICE[0] in reference, "the replacement finds nothing: the reference changed"
    done = kit(
        "lab",
        "3",
        "--notebook",
        str(variant(3, WHOLE_ON_EVERY_DEVICE)),
        "--configs",
        "cpu-1,cpu-8",
        "--hidden",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    by_config = lab_outcomes(3)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}, by_config["cpu-1"]
    assert by_config["cpu-8"]["test_doubles_a_longer_random_vector"]["status"] == "passed"
    named = by_config["cpu-8"]["test_every_device_holds_a_different_block"]
    assert named["hidden"] and named["status"] == "failed", named
    assert "got a full copy on every device" in named["message"], named["message"]


def test_the_count_the_kits_tests_grade_lab_3_by_is_the_labs_own():
    import subprocess
    import sys

    counted = subprocess.run(
        [
            sys.executable,
            "-c",
            "from labkit.course import catalog; from labkit.grading.state import course; "
            "print(len(course.test_points(catalog.lab(3))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(counted.stdout.split()[-1]) == LAB_3_TESTS, counted.stdout


def test_a_shard_map_error_is_kept_whole_where_its_fix_comes_after_its_first_line():
    """out_specs=P() on a value that is not replicated: JAX's first line ends "given the mesh:", and the fix
    (a psum, or check_vma=False) comes after it. The student must see all of it."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from labkit.judge.harness import describe_exception

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    with pytest.raises(ValueError) as e:
        jax.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P("data"), out_specs=P())(jnp.arange(4.0))
    message = describe_exception(e.value)["message"]
    assert "given the mesh: The mesh given has shape (1,)" in message, message
    assert "check_vma=False" in message and "revising the corresponding out_specs" in message, message
    assert "\n" not in message


# -- row_softmax: the cut is the design ------------------------------------------------------------

REFERENCE_SOFTMAX = """    def my_rows(block):  # whole rows: everything each row's softmax needs is on this device
        e = jnp.exp(block - jnp.max(block, axis=1, keepdims=True))
        return e / jnp.sum(e, axis=1, keepdims=True)

    return jax.jit(jax.shard_map(my_rows, mesh=mesh, in_specs=P("data", None), out_specs=P("data", None)))"""
SOFTMAX_TESTS = {
    "test_row_softmax_gives_the_softmax_of_every_row",
    "test_row_softmax_keeps_the_rows_split_across_every_device",
    "test_row_softmax_holds_a_piece_of_x_and_sends_nothing",
    "test_row_softmax_on_a_wider_random_matrix_with_large_values",
}

# Cut by columns, no word between devices: each device normalises its own columns (right on one device).
BY_COLUMNS = """    def my_columns(block):
        e = jnp.exp(block - jnp.max(block, axis=1, keepdims=True))
        return e / jnp.sum(e, axis=1, keepdims=True)

    return jax.jit(jax.shard_map(my_columns, mesh=mesh, in_specs=P(None, "data"), out_specs=P(None, "data")))"""

# Cut by columns and made right by two collectives: the row's max and sum over 'data'. Right everywhere, and it talks.
BY_COLUMNS_TALKING = """    def my_columns(block):
        e = jnp.exp(block - jax.lax.pmax(jnp.max(block, axis=1, keepdims=True), "data"))
        p = e / jax.lax.psum(jnp.sum(e, axis=1, keepdims=True), "data")
        return jax.lax.all_to_all(p, "data", 0, 1, tiled=True)

    return jax.jit(jax.shard_map(my_columns, mesh=mesh, in_specs=P(None, "data"), out_specs=P("data", None)))"""

# The whole of x on every device, each keeping its own rows of the answer: right values, n times the memory.
WHOLE_X = """    def my_rows(x):
        e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
        p = e / jnp.sum(e, axis=1, keepdims=True)
        rows = x.shape[0] // jax.lax.axis_size("data")
        return jax.lax.dynamic_slice_in_dim(p, jax.lax.axis_index("data") * rows, rows)

    return jax.jit(jax.shard_map(my_rows, mesh=mesh, in_specs=P(), out_specs=P("data", None)))"""


@pytest.mark.parametrize(
    "design, named, says",
    [
        (
            BY_COLUMNS,
            "test_row_softmax_gives_the_softmax_of_every_row",
            "every device made a softmax of its own columns only",
        ),
        (
            BY_COLUMNS_TALKING,
            "test_row_softmax_holds_a_piece_of_x_and_sends_nothing",
            "where the budget is 0 bytes",
        ),
        (WHOLE_X, "test_row_softmax_holds_a_piece_of_x_and_sends_nothing", "every device holds all of x"),
    ],
    ids=["by-columns", "by-columns-talking", "whole-x"],
)
def test_a_plausible_wrong_cut_passes_on_cpu_1_and_is_named_on_cpu_8(
    kit, lab_outcomes, variant, design, named, says
):
    ran = failures_by_config(kit, lab_outcomes, variant, 3, REFERENCE_SOFTMAX, design, SOFTMAX_TESTS)
    assert ran["returncode"] == 1 and not ran["cpu-1"], ran
    assert named in ran["cpu-8"] and says in ran["cpu-8"][named]["message"], ran
    assert set(ran["cpu-8"]) <= SOFTMAX_TESTS, ran


# The handout shows shard_map; jax.jit told where x and the result live is as good a design.
JIT_SHARDINGS = """    from jax.sharding import NamedSharding

    rows = NamedSharding(mesh, P("data", None))
    return jax.jit(lambda x: jax.nn.softmax(x, axis=1), in_shardings=rows, out_shardings=rows)"""


def test_jit_with_shardings_passes_every_test_on_1_8_and_32_devices(kit, lab_outcomes, variant):
    notebook = variant(3, (REFERENCE_SOFTMAX, JIT_SHARDINGS))
    done = kit("lab", "3", "--notebook", str(notebook), "--configs", "cpu-1,cpu-8,cpu-32", "--hidden")
    outcomes = lab_outcomes(3)
    for config in ("cpu-1", "cpu-8", "cpu-32"):
        assert set(outcomes[config]) >= SOFTMAX_TESTS, sorted(outcomes[config])
        assert not not_passed(outcomes[config]), (config, not_passed(outcomes[config]))
    assert done.returncode == 0, done.stdout[-2000:]
