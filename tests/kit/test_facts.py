"""The facts of a call's compiled program, as the harness gathers them in a process of eight CPU devices."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from labkit import facts
from labkit.judge import plaindata

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from labkit import facts

    def mesh():
        return Mesh(np.array(jax.devices()), ("data",))

    def psum(x):  # an eager shard_map: each device sums its block, then the sums are added
        return jax.shard_map(lambda b: jax.lax.psum(jnp.sum(b), "data"), mesh=mesh(), in_specs=P("data"),
                             out_specs=P())(x)

    def whole(x):  # right, and every device sums all of x
        return jax.shard_map(jnp.sum, mesh=mesh(), in_specs=P(), out_specs=P())(x)

    def placed_then_jitted(x, w):  # eager device_put, then jit: the placement decides the program
        x = jax.device_put(x, NamedSharding(mesh(), P("data")))
        w = jax.device_put(w, NamedSharding(mesh(), P("data", None)))
        return jax.jit(lambda a, b: a @ b)(x, w)

    def explicit(x):  # an Explicit mesh from jax.make_mesh, entered with jax.set_mesh
        with jax.set_mesh(jax.make_mesh((8,), ("data",))):
            x = jax.reshard(x, P("data"))
            return jax.shard_map(lambda b: jax.lax.psum(b.sum(), "data"), in_specs=P("data"), out_specs=P())(x)

    def untraceable(x):
        return float(x.sum())

    def noisy(x):
        print("traced")
        return jax.jit(lambda a: 2 * a)(x)

    def op_by_op(x):
        return 2 * jnp.sin(x) + 1

    step = jax.jit(lambda w, x: w - 0.1 * x.T @ (x @ w))

    def loaded(w, x):  # host data made into global arrays (as a multi-host load does), then a jitted step
        rows = jax.make_array_from_process_local_data(NamedSharding(mesh(), P("data")), x)
        return step(jax.device_put(w, NamedSharding(mesh(), P())), rows)

    def loaded_whole(w, x):  # the same step with every device given the whole batch
        return step(jax.device_put(w, NamedSharding(mesh(), P())), jax.device_put(x, NamedSharding(mesh(), P())))

    def passed_on(b):  # one step of a ring: each device's block to its neighbour
        return jax.lax.ppermute(b, "data", [(i, (i + 1) % 8) for i in range(8)])

    def ring_in_a_loop(x):  # seven sends written once, inside the body of a loop of seven steps
        return jax.shard_map(lambda b: jax.lax.fori_loop(0, 7, lambda i, c: passed_on(c) + b, b), mesh=mesh(),
                             in_specs=P("data"), out_specs=P("data"))(x)

    def loop_of_unknown_length(x, steps):  # as many sends as an input says: nothing in the program counts them
        return jax.shard_map(lambda b, n: jax.lax.fori_loop(0, n, lambda i, c: passed_on(c), b), mesh=mesh(),
                             in_specs=(P("data"), P()), out_specs=P("data"))(x, steps)

    def one_product(x):  # an (8, 8) matrix times itself
        m = x.reshape(8, 8)
        return jax.jit(lambda a: a @ a)(m)

    def products_in_a_loop(x):  # the same product, then three more, in a loop of four steps
        m = x.reshape(8, 8)
        return jax.jit(lambda a: jax.lax.fori_loop(0, 4, lambda i, c: c @ a, a))(m)

    def moves_only(x):  # no arithmetic at all: a transpose
        return jax.jit(lambda a: a.reshape(8, 8).T)(x)
    def ignores_its_first(unused, x):  # an input the program never reads: jax.jit prunes it
        return psum(x)

    x, w = jnp.arange(64.0), jnp.ones((64, 4))
    host_w, host_x = np.ones(4, np.float32), np.ones((64, 4), np.float32)
    out = {name: facts.gather(fn, args, {}) for name, fn, args in [
        ("psum", psum, (x,)), ("whole", whole, (x,)), ("placed_then_jitted", placed_then_jitted, (x, w)),
        ("explicit", explicit, (x,)), ("untraceable", untraceable, (x,)), ("noisy", noisy, (x,)),
        ("op_by_op", op_by_op, (x,)), ("loaded", loaded, (host_w, host_x)),
        ("loaded_whole", loaded_whole, (host_w, host_x)), ("ring_in_a_loop", ring_in_a_loop, (x,)),
        ("loop_of_unknown_length", loop_of_unknown_length, (x, jnp.int32(3))),
        ("one_product", one_product, (x,)), ("products_in_a_loop", products_in_a_loop, (x,)),
        ("moves_only", moves_only, (x,)), ("ignores_its_first", ignores_its_first, (w, x))]}
    out["makers_are_back"] = jax.make_array_from_process_local_data.__module__.startswith("jax")
    explicit_mesh = jax.make_mesh((8,), ("data",))
    with jax.set_mesh(explicit_mesh):
        doubled = jax.jit(lambda a: 2 * a)(jax.device_put(jnp.arange(16.0).reshape(8, 2), P("data", None)))
    from labkit.judge import plaindata
    out["explicit_value"] = plaindata.encode(doubled)
    out["set_mesh_is_back"] = jax.set_mesh.__module__.startswith("jax")
    out["device_put_is_back"] = jax.device_put.__module__.startswith("jax")
    sys.stdout.write("FACTS " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def gathered():
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    printed, _, data = done.stdout.partition("FACTS ")
    return {"printed": printed, **json.loads(data)}


def test_an_eager_shard_map_shows_its_split_input_and_its_all_reduce_over_every_device(gathered):
    got = plaindata.decode_compiled(gathered["psum"])
    assert got.devices == 8
    assert [(c.op, c.groups) for c in got.collectives] == [("all-reduce", (tuple(range(8)),))]
    (x,) = got.inputs
    assert (x.path, x.bytes, x.device_bytes, x.pieces, x.replicated) == ("args[0]", 256, 32, 8, False)


def test_a_program_that_never_reads_its_first_input_is_examined_over_the_devices_of_the_others(gathered):
    got = plaindata.decode_compiled(gathered["ignores_its_first"])
    assert got.devices == 8
    assert [(c.op, c.groups) for c in got.collectives] == [("all-reduce", (tuple(range(8)),))]
    unread, x = got.inputs
    assert unread.path == "args[0]" and isinstance(unread.device_bytes, plaindata.Unavailable)
    assert "never reads it" in unread.device_bytes.why
    assert (x.path, x.bytes, x.device_bytes, x.pieces, x.replicated) == ("args[1]", 256, 32, 8, False)


def test_a_collective_inside_a_loop_is_listed_once_for_each_step_the_loop_runs(gathered):
    got = plaindata.decode_compiled(gathered["ring_in_a_loop"])
    assert [c.op for c in got.collectives] == ["collective-permute"] * 7


def test_a_collective_inside_a_loop_whose_steps_cannot_be_counted_is_unavailable_and_says_why(gathered):
    got = plaindata.decode_compiled(gathered["loop_of_unknown_length"])
    assert isinstance(got.collectives, plaindata.Unavailable)
    assert "number of steps the compiler cannot count" in got.collectives.why


def test_the_work_of_a_loop_counts_every_step_not_only_the_first(gathered):
    one = plaindata.decode_compiled(gathered["one_product"]).flops
    four = plaindata.decode_compiled(gathered["products_in_a_loop"]).flops
    assert one >= 2 * 8 * 8 * 8
    assert four >= 4 * one * 0.99, (one, four)


def test_a_program_that_only_moves_data_does_no_flops_rather_than_unknown_ones(gathered):
    assert plaindata.decode_compiled(gathered["moves_only"]).flops == 0.0


def test_a_sum_computed_whole_on_every_device_shows_its_input_replicated_and_no_collective(gathered):
    got = plaindata.decode_compiled(gathered["whole"])
    assert got.collectives == ()
    assert got.inputs[0].replicated and got.inputs[0].device_bytes == 256


def test_an_eager_placement_before_jit_decides_the_inputs_of_the_program(gathered):
    got = plaindata.decode_compiled(gathered["placed_then_jitted"])
    assert [p.device_bytes for p in got.inputs] == [32, 128]
    assert [c.op for c in got.collectives] == ["all-reduce"]


def test_an_explicit_mesh_entered_with_set_mesh_is_examined_too(gathered):
    got = plaindata.decode_compiled(gathered["explicit"])
    assert isinstance(got, plaindata.Compiled), got
    assert got.inputs[0].device_bytes == 32 and [c.op for c in got.collectives] == ["all-reduce"]


def test_memory_and_flops_are_per_device_numbers(gathered):
    got = plaindata.decode_compiled(gathered["psum"])
    assert got.memory["argument"] == 32 and got.memory["output"] == 4
    assert 0 < got.flops < 64


def test_a_function_jax_jit_cannot_trace_has_no_facts_and_says_why(gathered):
    got = plaindata.decode_compiled(gathered["untraceable"])
    assert (
        isinstance(got, plaindata.Unavailable)
        and "could not trace" in got.why
        and "Concretization" in got.why
    )


def test_what_the_function_prints_while_traced_again_is_dropped(gathered):
    assert "traced" not in gathered["printed"]
    assert gathered["noisy"]["top_level"] == ["jit"]


def test_work_done_op_by_op_shows_outside_any_jit(gathered):
    assert {"sin", "mul", "add"} <= set(gathered["op_by_op"]["top_level"])


def test_the_functions_replaced_while_tracing_are_put_back(gathered):
    assert gathered["set_mesh_is_back"] and gathered["device_put_is_back"]


# -- reading the HLO text ------------------------------------------------------------------


def test_replica_groups_in_every_form_of_the_hlo_text():
    assert facts.parse_groups("{{0,1},{2,3}}", 4) == [[0, 1], [2, 3]]
    assert facts.parse_groups("{}", 4) == [[0, 1, 2, 3]]
    assert facts.parse_groups("[2,4]<=[8]", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert facts.parse_groups("[4,2]<=[2,4]T(1,0)", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_replica_groups_named_by_mesh_axes_join_the_devices_that_differ_only_along_them():
    assert facts.parse_groups("mesh['data'=2,'model'=4] {'model'}", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert facts.parse_groups("mesh['data'=2,'model'=4] {'data'}", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert facts.parse_groups("mesh['data'=2,'model'=4] {'data','model'}", 8) == [list(range(8))]


def test_a_collective_over_one_axis_of_a_grid_is_not_read_as_over_every_device():
    hlo = (
        "%rs = f32[2,12]{1,0} reduce-scatter(%f), channel_id=1, replica_groups=mesh['data'=2,'model'=4] "
        "{'model'}, use_global_device_ids=true, dimensions={0}, to_apply=%region_0.0"
    )
    found = facts.collectives_in(hlo, 8)
    assert found == [
        {"op": "reduce-scatter", "shape": "f32[2,12]{1,0}", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    ]


def test_replica_groups_in_a_form_not_known_are_refused_rather_than_read_as_every_device():
    with pytest.raises(ValueError, match="does not know"):
        facts.collectives_in("%ar = f32[8]{0} all-reduce(%p), replica_groups=mesh['x'=8] {'x':(2)4}", 8)


def test_collectives_of_an_hlo_module_with_async_pairs_and_permutes():
    hlo = textwrap.dedent("""
        %ars = f32[8]{0} all-reduce-start(f32[8]{0} %p), channel_id=1, replica_groups=[2,4]<=[8], to_apply=%add
        %ard = f32[8]{0} all-reduce-done(f32[8]{0} %ars)
        %cp = f32[2]{0} collective-permute(f32[2]{0} %q), channel_id=2, source_target_pairs={{0,1},{1,0}}
        %rs = f32[1]{0} reduce-scatter(f32[8]{0} %r), channel_id=3, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
        %add.1 = f32[] add(f32[] %a, f32[] %b)
    """)
    found = facts.collectives_in(hlo, 8)
    assert [c["op"] for c in found] == ["all-reduce", "collective-permute", "reduce-scatter"]
    assert found[0]["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert found[1]["pairs"] == [[0, 1], [1, 0]]
    assert plaindata.decode_compiled({"devices": 8, "collectives": found}).collectives[2].widest == 8


def test_the_loops_of_a_module_multiply_the_collectives_of_their_bodies_nested_or_not():
    hlo = textwrap.dedent("""
        %inner_body (p: f32[2]) -> f32[2] {
          %ar = f32[2]{0} all-reduce(f32[2]{0} %p), channel_id=1, replica_groups={}, to_apply=%add
        }
        %outer_body (q: f32[2]) -> f32[2] {
          %cp = f32[2]{0} collective-permute(f32[2]{0} %q), channel_id=2, source_target_pairs={{0,1},{1,0}}
          %w = (f32[2]) while(%t), condition=%c, body=%inner_body, backend_config={"known_trip_count":{"n":"4"}}
        }
        ENTRY %main (x: f32[2]) -> f32[2] {
          %w.1 = (f32[2]) while(%x), condition=%c.1, body=%outer_body, backend_config={"known_trip_count":{"n":"3"}}
          %ag = f32[4]{0} all-gather(f32[2]{0} %x), channel_id=3, replica_groups={{0,1}}, dimensions={0}
        }
    """)
    ops = [c["op"] for c in facts.collectives_in(hlo, 2)]
    assert (
        ops.count("collective-permute") == 3
        and ops.count("all-reduce") == 12
        and ops.count("all-gather") == 1
    )
    uncounted = hlo.replace(',backend_config={"known_trip_count":{"n":"4"}}', "").replace(
        ', backend_config={"known_trip_count":{"n":"4"}}', ""
    )
    with pytest.raises(ValueError, match="cannot count"):
        facts.collectives_in(uncounted, 2)


def test_the_products_of_a_loops_body_are_counted_again_for_each_further_step():
    hlo = textwrap.dedent("""
        %body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
          %d = f32[4,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
          %a = f32[4,16]{1,0} parameter(0)
        }
        ENTRY %main (x: f32[4,16]) -> f32[4,8] {
          %w = (s32[], f32[4,8]) while(%t), condition=%c, body=%body, backend_config={"known_trip_count":{"n":"5"}}
        }
    """)
    assert facts.hlo.loop_flops(hlo) == 4 * 2 * (4 * 8) * 16
    with pytest.raises(ValueError, match="cannot count"):
        facts.hlo.loop_flops(hlo.replace(', backend_config={"known_trip_count":{"n":"5"}}', ""))


def test_facts_a_backend_does_not_give_decode_as_unavailable_with_the_reason():
    got = plaindata.decode_compiled(
        {
            "devices": 2,
            "collectives": [],
            "memory": {"unavailable": "no stats here"},
            "flops": 12.0,
            "inputs": [],
            "outputs": [],
        }
    )
    assert got.memory == plaindata.Unavailable("no stats here") and got.flops == 12.0
    assert plaindata.decode_compiled(None) == plaindata.Unavailable(
        "no facts of the compiled program came back for this call"
    )


def test_an_explicit_sharded_result_is_read_without_indexing_it(gathered):
    got = plaindata.decode(gathered["explicit_value"])
    assert got.value.tolist() == [[2 * (2 * i), 2 * (2 * i + 1)] for i in range(8)]
    assert (
        got.sharding.spec == ("data", None)
        and got.sharding.num_devices == 8
        and len(got.sharding.shards) == 8
    )


def test_arrays_made_from_host_data_are_inputs_placed_as_they_were_made(gathered):
    # Traced as constants they would be folded away (no FLOPs) on one process, and refused by jit
    # on several; as inputs, the step's program is the one that ran.
    got = plaindata.decode_compiled(gathered["loaded"])
    assert [(p.path, p.bytes, p.device_bytes, p.replicated) for p in got.inputs] == [
        ("made[0]", 1024, 128, False),
        ("made[1]", 16, 16, True),
    ]
    assert [(c.op, c.groups) for c in got.collectives] == [("all-reduce", (tuple(range(8)),))]
    assert gathered["makers_are_back"]


def test_a_step_given_the_whole_batch_on_every_device_shows_the_whole_batchs_flops(gathered):
    split = plaindata.decode_compiled(gathered["loaded"])
    whole = plaindata.decode_compiled(gathered["loaded_whole"])
    matmuls = 2 * (2 * 64 * 4)
    assert whole.flops > matmuls > 4 * split.flops
    assert whole.inputs[1].replicated and whole.collectives == ()


def test_a_collective_whose_result_is_a_long_tuple_keeps_its_whole_shape_so_its_bytes_are_all_counted():
    from labkit import cost

    pieces = ", ".join(f"/*index={i}*/f32[4,128]{{1,0}}" for i in range(32))
    hlo = f"%a2a = ({pieces}) all-to-all(%p), channel_id=1, replica_groups={{}}, dimensions={{0}}"
    (found,) = facts.collectives_in(hlo, 32)
    assert cost.shape_bytes(found["shape"]) == 32 * 4 * 128 * 4
