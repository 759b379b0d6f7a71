"""Lab 3 through the real pipeline: a shard_map that gives every device the whole vector is right on one
device, and on eight the hidden test that reads where the result lives already names it.

shard_map_double's result is all its work: with in_specs=P() and out_specs=P() every device doubles
the whole vector and the result is a copy on every device, which the placement test sees. (A body
that doubles the whole vector and keeps one block of it would need axis_index and slicing: no
solution comes to it by accident.)
"""

import json

from labkit.course import catalog

WHOLE_ON_EVERY_DEVICE = (
    'in_specs=P("data"), out_specs=P("data"))\n    return double(x)',
    "in_specs=P(), out_specs=P())\n    return double(x)",
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
