"""A compiled program is read as a structure: what a student writes (a scope's name, a function's name, a
frontend attribute) never reads as an instruction, an async `-done` never sets what a collective sends, an
element type of unknown size is refused by name, and the work and the sends a loop hides are counted for
every step, or refused where the steps cannot be read (never undercounted)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from labkit import cost
from labkit.judge import hlo, plaindata

# ---- attacks on the reader, written as the text XLA prints -------------------------------------------------

SCOPE_THAT_READS_LIKE_A_DONE = """\
ENTRY %main (p: f32[1,16]) -> f32[8,16] {
  %p = f32[1,16]{1,0} parameter(0)
  %all_gather.3 = f32[8,16]{1,0} all-gather(%p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, metadata={op_name="jit(f)/ all-gather-done(%all-gather-start.3)/x = f32[0]{0} all-gather-done(%all_gather.3)" stack_frame_id=4}
  ROOT %r = f32[8,16]{1,0} copy(%all_gather.3), metadata={op_name="%all_gather.3 = f32[0]{0} all-gather-done(%all_gather.3)"}
}
"""


@pytest.mark.fast
def test_a_scope_name_that_reads_like_a_done_changes_nothing_the_program_sends():
    (found,) = hlo.collectives_in(SCOPE_THAT_READS_LIKE_A_DONE, 8)
    assert found["op"] == "all-gather" and cost.shape_bytes(found["shape"]) == 8 * 16 * 4
    honest = "\n".join(line.split(", metadata=")[0] for line in SCOPE_THAT_READS_LIKE_A_DONE.splitlines())
    assert hlo.collectives_in(honest, 8) == [found]


@pytest.mark.fast
@pytest.mark.parametrize(
    "attribute",
    [
        'metadata={op_name="a\\" all-reduce(%p), replica_groups={}\\n %q = f32[0] all-reduce-done(%p)"}',
        'frontend_attributes={note="), replica_groups={{0}}, x={"}',
        "metadata={op_name='all-to-all(' source_file=\"/*\"}",
        'backend_config="{\\"known_trip_count\\":{\\"n\\":\\"1000\\"}}"',
    ],
)
def test_text_a_student_can_write_in_any_attribute_is_never_read_as_an_instruction_or_its_groups(attribute):
    line = f"  %ar = f32[64]{{0}} all-reduce(%p), channel_id=1, replica_groups={{{{0,1,2,3}},{{4,5,6,7}}}}, to_apply=%add, {attribute}"
    (found,) = hlo.collectives_in(line, 8)
    assert found == {"op": "all-reduce", "shape": "f32[64]{0}", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}


TABLES = """\
HloModule jit_f, is_scheduled=true

FileNames
1 "/tmp/x.py"

FunctionNames
1 "f\\n  %ag = f32[999]{0} all-gather(%p), replica_groups={}"
2 "all-gather-done(%x)"

FileLocations
1 {file_name_id=1 function_name_id=1 line=2 end_line=2 column=4 end_column=112}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(%p), replica_groups={}, to_apply=%add
}
"""


@pytest.mark.fast
def test_the_printers_tables_of_names_are_skipped_as_rows_whatever_the_names_say():
    assert hlo.collectives_in(TABLES, 8) == [
        {"op": "all-reduce", "shape": "f32[8]{0}", "groups": [list(range(8))]}
    ]
    broken_out = TABLES.replace('2 "all-gather-done(%x)"', '2 "x" %ag = f32[999]{0} all-gather(%p)')
    with pytest.raises(hlo.Unreadable, match="line 8"):
        hlo.collectives_in(broken_out, 8)


@pytest.mark.fast
def test_a_line_that_starts_as_an_instruction_and_does_not_parse_is_refused_not_skipped():
    with pytest.raises(hlo.Unreadable, match="line 1"):
        hlo.collectives_in('  %ar = f32[64]{0} all-reduce(%p), metadata={op_name="never closed}', 8)


@pytest.mark.fast
def test_an_async_pair_split_across_computations_sends_what_its_start_makes_once():
    text = """\
%body (t: (f32[8,16], s32[])) -> (f32[8,16], s32[]) {
  %t = (f32[8,16], s32[]) parameter(0)
  %s = ((f32[1,16]), f32[8,16]) get-tuple-element(%t), index=0
  %d = f32[800,16]{1,0} all-gather-done(%s)
  ROOT %r = (f32[8,16], s32[]) tuple(%d)
}
ENTRY %main (p: f32[1,16]) -> f32[8,16] {
  %p = f32[1,16]{1,0} parameter(0)
  %ags = (f32[1,16]{1,0}, f32[8,16]{1,0}) all-gather-start(%p), channel_id=1, replica_groups={}, dimensions={0}
  %t = (f32[8,16], s32[]) tuple(%ags)
  %w = (f32[8,16], s32[]) while(%t), condition=%c, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %r = f32[8,16] get-tuple-element(%w), index=0
}
"""
    (found,) = hlo.collectives_in(text, 8)
    assert found["op"] == "all-gather" and cost.shape_bytes(found["shape"]) == 8 * 16 * 4


# The TPU compiler's async collective fusion, as libtpu prints it for lab 13's FSDP forward at precision highest
# (trimmed to the chain): one all-gather of w2, a copy in the start's, the continuation's and the done's
# computations, and w1's all-gather in the entry.
ASYNC_COLLECTIVE_FUSION = """\
%fused_computation.2 (param_0.5: f32[8,32]) -> (f32[8,32], f32[64,32]) {
  %param_0.5 = f32[8,32]{1,0:T(8,128)} parameter(0)
  %all-gather.10 = f32[64,32]{1,0:T(8,128)} all-gather(%param_0.5), channel_id=1, replica_groups=mesh['data'=8] {'data'}, dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
  ROOT %custom-call.1 = (f32[8,32]{1,0:T(8,128)S(1)}, f32[64,32]{1,0:T(8,128)S(1)}) custom-call(%all-gather.10), custom_call_target="AsyncCollectiveStart"
}

%async_collective_fusion.6 (param_0.8: f32[8,32], param_9.2: f32[32,64], param_10.4: f32[16,32]) -> (f32[16,64], f32[8,32], f32[64,32]) {
  %param_10.4 = f32[16,32]{1,0:T(8,128)S(1)} parameter(2)
  %param_9.2 = f32[32,64]{1,0:T(8,128)S(1)} parameter(1)
  %convolution.5 = f32[16,64]{1,0:T(8,128)} convolution(%param_10.4, %param_9.2), dim_labels=bf_io->bf, operand_precision={highest,highest}
  %param_0.8 = f32[8,32]{1,0:T(8,128)S(1)} parameter(0)
  %all-gather.12 = f32[64,32]{1,0:T(8,128)S(1)} all-gather(%param_0.8), channel_id=1, replica_groups=mesh['data'=8] {'data'}, dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
  ROOT %tuple.2 = (f32[16,64]{1,0:T(8,128)S(1)}, f32[8,32]{1,0:T(8,128)S(1)}, f32[64,32]{1,0:T(8,128)S(1)}) tuple(%convolution.5, %param_0.8, %all-gather.12)
}

%fused_computation.4 (param_0.9: f32[8,32], param_1.7: f32[64,32]) -> f32[64,32] {
  %param_0.9 = f32[8,32]{1,0:T(8,128)S(1)} parameter(0)
  %param_1.7 = f32[64,32]{1,0:T(8,128)S(1)} parameter(1)
  %all-gather.14 = f32[64,32]{1,0:T(8,128)} all-gather(%param_0.9), channel_id=1, replica_groups=mesh['data'=8] {'data'}, dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
  ROOT %custom-call.3 = f32[64,32]{1,0:T(8,128)S(1)} custom-call(%param_0.9, %param_1.7, %all-gather.14), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main.2_spmd (param.3: f32[16,32], param.4: f32[4,64], param.5: f32[8,32]) -> f32[64,32] {
  %param.3 = f32[16,32]{1,0:T(8,128)} parameter(0)
  %param.4 = f32[4,64]{1,0:T(4,128)} parameter(1)
  %param.5 = f32[8,32]{1,0:T(8,128)} parameter(2)
  %all-gather.15 = f32[32,64]{1,0:T(8,128)S(1)} all-gather(%param.4), channel_id=2, replica_groups=mesh['data'=8] {'data'}, dimensions={0}, use_global_device_ids=true
  %async-collective-start = (f32[8,32]{1,0:T(8,128)S(1)}, f32[64,32]{1,0:T(8,128)S(1)}) fusion(%param.5), kind=kCustom, calls=%fused_computation.2
  %get-tuple-element = f32[8,32]{1,0:T(8,128)S(1)} get-tuple-element(%async-collective-start), index=0
  %fusion.6 = (f32[16,64]{1,0:T(8,128)S(1)}, f32[8,32]{1,0:T(8,128)S(1)}, f32[64,32]{1,0:T(8,128)S(1)}) fusion(%get-tuple-element, %all-gather.15, %param.3), kind=kCustom, calls=%async_collective_fusion.6
  %get-tuple-element.12 = f32[8,32]{1,0:T(8,128)S(1)} get-tuple-element(%fusion.6), index=1
  %get-tuple-element.13 = f32[64,32]{1,0:T(8,128)S(1)} get-tuple-element(%fusion.6), index=2
  ROOT %async-collective-done = f32[64,32]{1,0:T(8,128)S(1)} fusion(%get-tuple-element.12, %get-tuple-element.13), kind=kCustom, calls=%fused_computation.4
}
"""


@pytest.mark.fast
def test_an_async_collective_fusion_sends_its_collective_once_counted_at_its_start():
    found = hlo.collectives_in(ASYNC_COLLECTIVE_FUSION, 8)
    assert sorted(hlo.without_layouts(c["shape"]) for c in found) == ["f32[32,64]", "f32[64,32]"], found
    # w1 and w2 each gathered once: what the program asks for, not three copies of w2's
    assert sum(cost.bytes_sent(c["op"], cost.shape_bytes(c["shape"]), 8) for c in found) == 7 / 8 * 2 * 8192


@pytest.mark.fast
def test_only_a_copy_of_the_chains_own_collective_is_left_out():
    # another collective computed inside the continuation (another shape) is counted
    other = ASYNC_COLLECTIVE_FUSION.replace(
        "  ROOT %tuple.2 =",
        "  %extra = f32[128,32]{1,0} all-gather(%param_0.8), replica_groups=mesh['data'=8] {'data'}, dimensions={0}\n"
        "  ROOT %tuple.2 =",
    )
    assert len(hlo.collectives_in(other, 8)) == 3
    # the same all-gather written twice, one of them outside the chain: both counted
    twice = ASYNC_COLLECTIVE_FUSION.replace(
        "  %async-collective-start =",
        "  %again = f32[64,32]{1,0:T(8,128)} all-gather(%param.5), channel_id=3, replica_groups=mesh['data'=8] {'data'}, dimensions={0}, use_global_device_ids=true\n"
        "  %async-collective-start =",
    )
    assert len(hlo.collectives_in(twice, 8)) == 3
    # a fusion that ends in a custom-call of another target starts no chain: every copy is counted
    unmarked = ASYNC_COLLECTIVE_FUSION.replace('"AsyncCollectiveStart"', '"SomethingElse"')
    assert len(hlo.collectives_in(unmarked, 8)) == 4


@pytest.mark.fast
def test_a_done_never_overrides_a_synchronous_collective_of_the_same_name():
    text = """\
ENTRY %main (p: f32[1,16]) -> f32[8,16] {
  %p = f32[1,16]{1,0} parameter(0)
  %all-gather.1 = f32[8,16]{1,0} all-gather(%p), channel_id=1, replica_groups={}, dimensions={0}
  %x = f32[0]{0} all-gather-done(%all-gather.1)
  ROOT %r = f32[8,16] copy(%all-gather.1)
}
"""
    (found,) = hlo.collectives_in(text, 8)
    assert cost.shape_bytes(found["shape"]) == 8 * 16 * 4


@pytest.mark.fast
@pytest.mark.parametrize(
    ("dtype", "bytes_"), [("s4", 64), ("u4", 64), ("f4e2m1fn", 64), ("s2", 32), ("pred", 128)]
)
def test_a_collective_of_sub_byte_or_small_elements_sends_their_packed_bytes(dtype, bytes_):
    line = f"%ag = {dtype}[8,16]{{1,0}} all-gather(%p), replica_groups={{}}, dimensions={{0}}"
    (found,) = hlo.collectives_in(line, 8)
    assert cost.shape_bytes(found["shape"]) == bytes_


@pytest.mark.fast
def test_an_element_type_of_unknown_size_is_refused_by_name_never_counted_as_nothing():
    with pytest.raises(hlo.Unreadable, match="'x9'"):
        hlo.collectives_in("%ag = x9[8,16]{1,0} all-gather(%p), replica_groups={}, dimensions={0}", 8)
    with pytest.raises(hlo.Unreadable, match="'x9'"):
        cost.shape_bytes("(f32[2], x9[4])")


@pytest.mark.fast
@pytest.mark.parametrize("op", ["ragged-all-to-all", "collective-broadcast", "send"])
def test_an_op_that_moves_data_between_devices_this_reader_does_not_count_is_refused(op):
    with pytest.raises(hlo.Unreadable, match=op):
        hlo.collectives_in(f"%x = f32[8]{{0}} {op}(%p), replica_groups={{}}", 8)


RANK_ONE_UPDATES = """\
%body (t: (s32[], f32[64,64], f32[64,32], f32[32,64])) -> (s32[], f32[64,64], f32[64,32], f32[32,64]) {
  %t = (s32[], f32[64,64], f32[64,32], f32[32,64]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %acc = f32[64,64] get-tuple-element(%t), index=1
  %a = f32[64,32] get-tuple-element(%t), index=2
  %b = f32[32,64] get-tuple-element(%t), index=3
  %fusion = f32[64,64]{1,0} fusion(%acc, %a, %b, %i), kind=kLoop, calls=%outer_product
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[64,64], f32[64,32], f32[32,64]) tuple(%next, %fusion, %a, %b)
}
%outer_product (acc: f32[64,64], a: f32[64,32], b: f32[32,64], i: s32[]) -> f32[64,64] {
  %acc = f32[64,64] parameter(0)
  %col = f32[64,64] parameter(1)
  %row = f32[64,64] parameter(2)
  %m = f32[64,64] multiply(%col, %row)
  ROOT %s = f32[64,64] add(%acc, %m)
}
%cond (t: (s32[], f32[64,64], f32[64,32], f32[32,64])) -> pred[] {
  %t = (s32[], f32[64,64], f32[64,32], f32[32,64]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(32)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
ENTRY %main (a: f32[64,32], b: f32[32,64]) -> f32[64,64] {
  %a = f32[64,32] parameter(0)
  %b = f32[32,64] parameter(1)
  %zero = s32[] constant(0)
  %z = f32[64,64] constant(0)
  %t = (s32[], f32[64,64], f32[64,32], f32[32,64]) tuple(%zero, %z, %a, %b)
  %w = (s32[], f32[64,64], f32[64,32], f32[32,64]) while(%t), condition=%cond, body=%body
  ROOT %r = f32[64,64] get-tuple-element(%w), index=1
}
"""


@pytest.mark.fast
def test_a_product_written_as_rank_one_updates_in_a_loop_is_counted_for_every_step():
    # 32 steps of a 64 x 64 multiply and add (and the counter's add and compare): XLA's cost analysis counts
    # one step, the reader the 31 others
    per_step = 2 * 64 * 64 + 1 + 1
    assert hlo.loop_flops(RANK_ONE_UPDATES) == 31 * per_step
    assert hlo.loop_flops(RANK_ONE_UPDATES) + per_step >= 2 * 64 * 64 * 32  # the product's own FLOPs


@pytest.mark.fast
def test_work_in_a_loop_whose_steps_cannot_be_read_is_refused_not_counted_once():
    computed_bound = RANK_ONE_UPDATES.replace(
        "%n = s32[] constant(32)", "%n = s32[] get-tuple-element(%t), index=0"
    )
    with pytest.raises(hlo.Unreadable, match="cannot count this loop"):
        hlo.loop_flops(computed_bound)


@pytest.mark.fast
def test_a_reductions_scalar_function_is_not_counted_as_work_of_its_own():
    text = """\
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%body (t: (s32[], f32[64])) -> (s32[], f32[64]) {
  %t = (s32[], f32[64]) parameter(0)
  %x = f32[64] get-tuple-element(%t), index=1
  %zero = f32[] constant(0)
  %r = f32[] reduce(%x, %zero), dimensions={0}, to_apply=%add
}
ENTRY %main (p: f32[64]) -> f32[64] {
  %w = (s32[], f32[64]) while(%p), condition=%c, body=%body, backend_config={"known_trip_count":{"n":"3"}}
}
"""
    assert hlo.loop_flops(text) == 2 * 64


# ---- the same attacks written in JAX, compiled on eight CPU devices -------------------------------------------

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from labkit import facts

    mesh = Mesh(np.array(jax.devices()), ("data",))

    def softmax_by_columns(x):  # each device a block of columns, then x gathered whole: an all-gather
        def rows(b):
            whole = jax.lax.all_gather(b, "data", axis=1, tiled=True)
            return jax.nn.softmax(whole, axis=1)[:, : b.shape[1]]
        return jax.shard_map(rows, mesh=mesh, in_specs=P(None, "data"), out_specs=P(None, "data"))(x)

    def disguised(x):
        with jax.named_scope(" all-gather-done(%all-gather-start.3)"):
            return jax.named_call(softmax_by_columns, name="all_gather_done")(x)

    def product(a, b):
        return a @ b

    def rank_one_updates(a, b):  # the same product as a sum of outer products, one a step
        def step(i, acc):
            return acc + jax.lax.dynamic_slice_in_dim(a, i, 1, 1) * jax.lax.dynamic_slice_in_dim(b, i, 1, 0)
        return jax.lax.fori_loop(0, a.shape[1], step, jnp.zeros((a.shape[0], b.shape[1]), a.dtype))

    def computed_bound(a, b):  # as many steps as a value says: nothing in the program counts them
        def step(c):
            i, acc = c
            return i + 1, acc + jax.lax.dynamic_slice_in_dim(a, i, 1, 1) * jax.lax.dynamic_slice_in_dim(b, i, 1, 0)
        n = jnp.sum(a > -1e9).astype(jnp.int32) // a.shape[0]
        return jax.lax.while_loop(lambda c: c[0] < n, step, (0, jnp.zeros((a.shape[0], b.shape[1]))))[1]

    def on_a_traced_value(a, b):  # cond on a value: either branch may run, the larger counted
        return jax.lax.cond(a.sum() > 0, lambda: a @ b, lambda: jnp.zeros((a.shape[0], b.shape[1])))

    from jax.experimental.custom_partitioning import custom_partitioning

    @custom_partitioning
    def partitioned_by_hand(x):  # its partition rule (Python) never enters the exported program
        return 2 * x

    partitioned_by_hand.def_partition(
        infer_sharding_from_operands=lambda mesh, args, result: args[0].sharding,
        partition=lambda mesh, args, result: (mesh, lambda x: 2 * x, args[0].sharding, (args[0].sharding,)),
        sharding_rule="i j -> i j",
    )

    x = jax.device_put(jnp.ones((16, 64)), NamedSharding(mesh, P(None, "data")))
    a, b = jnp.ones((64, 32)), jnp.ones((32, 64))
    out = {name: facts.gather(fn, args, {}) for name, fn, args in [
        ("honest", softmax_by_columns, (x,)), ("disguised", disguised, (x,)), ("product", product, (a, b)),
        ("rank_one_updates", rank_one_updates, (a, b)), ("computed_bound", computed_bound, (a, b)),
        ("on_a_traced_value", on_a_traced_value, (a, b))]}
    from labkit import checks
    from labkit.judge import verify
    c = checks.compiled_call("partitioned_by_hand", np.ones((16, 64), np.float32))
    exported = facts.export(partitioned_by_hand, (jax.ShapeDtypeStruct((16, 64), jnp.float32),), {})
    out["partitioned_by_hand"] = verify.run_program({"id": c.id, **c.encoded()}, exported["program"])
    traced = jax.jit(disguised).lower(x).compile()
    from labkit.judge import hlo
    out["printed"] = hlo.printed(traced)
    sys.stdout.write("FACTS " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def gathered():
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.partition("FACTS ")[2])


def _sent(facts):
    return sum(cost.shape_bytes(c["shape"]) for c in facts["collectives"])


def test_a_scope_and_a_call_named_like_a_done_send_what_the_same_design_sends_unnamed(gathered):
    honest, disguised = gathered["honest"], gathered["disguised"]
    assert [c["op"] for c in honest["collectives"]] == ["all-gather"]
    assert disguised["collectives"] == honest["collectives"] and _sent(disguised) == 16 * 64 * 4
    assert "all-gather-done(%all-gather-start.3)" in gathered["printed"]  # the text is there; it is not read


def test_a_product_as_rank_one_updates_in_a_loop_counts_the_products_work(gathered):
    assert gathered["product"]["flops"] == 2 * 64 * 64 * 32
    assert gathered["rank_one_updates"]["flops"] >= gathered["product"]["flops"]


def test_work_in_a_while_loop_with_a_computed_bound_is_unavailable_saying_it_cannot_count_the_loop(gathered):
    assert "cannot count this loop" in gathered["computed_bound"]["flops"]["unavailable"]


def test_a_cond_on_a_traced_value_counts_at_least_the_branch_that_computes(gathered):
    assert gathered["on_a_traced_value"]["flops"] >= gathered["product"]["flops"]


def test_a_custom_partitioning_is_verified_and_examined_as_the_program_it_exports(gathered):
    found = gathered["partitioned_by_hand"]
    assert plaindata.decode(found["value"]).value.ravel()[:3].tolist() == [2.0, 2.0, 2.0]
    assert found["facts"]["flops"] == 16 * 64 and found["facts"]["collectives"] == []


WRITTEN_SIZES = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax import export
from jax.sharding import Mesh, PartitionSpec as P
from labkit.judge import program

mesh = Mesh(np.array(jax.devices()), ("data",))

def per_device(g, w):
    return jax.lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True), jax.lax.all_gather(w, "data", tiled=True), jax.lax.psum(w, "data")

f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P("data"), P(), P("data")), check_vma=False))
module = export.export(f)(jnp.zeros((256, 4)), jnp.zeros((64,))).mlir_module()
print("SIZES", json.dumps(program.read_module(module)["written_sizes"]))
"""


def test_the_collectives_a_program_writes_are_read_with_the_dimensions_each_device_holds_whole():
    # what the TPU compiler's all-reduces are matched against (compiled._stands_for): a reduce-scatter by its
    # operand, an all-gather and an all-reduce by their results, each device's own block
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8")
    done = subprocess.run(
        [sys.executable, "-c", WRITTEN_SIZES],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    sizes = json.loads(done.stdout.partition("SIZES ")[2])
    assert sizes == [["all-gather", 64], ["all-reduce", 8], ["reduce-scatter", 256, 4]]
