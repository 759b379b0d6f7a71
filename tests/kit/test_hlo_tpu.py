"""Reading the TPU compiler's program (pure Python, no JAX): its loops carry no
`known_trip_count`, it writes `x @ w` as a `convolution` and its async sends as tuples; all must be read.
A step time it gives as zero or less is no estimate."""

import pytest

from labkit.judge import hlo

# The shape of what libtpu 0.0.50 writes for a `lax.scan` of 4 steps over `x @ w` (v5e:2x4), trimmed.
TPU_SCAN = """\
HloModule jit_f, entry_computation_layout={()->f32[]}

%fused (p0: bf16[3,8], p1: bf16[2,3]) -> f32[2,8] {
  %p1 = bf16[2,3]{1,0:T(2,128)(2,1)} parameter(1)
  %p0 = bf16[3,8]{1,0:T(4,128)(2,1)} parameter(0)
  ROOT %convolution.7 = f32[2,8]{1,0:T(2,128)} convolution(%p1, %p0), dim_labels=bf_io->bf, metadata={op_name="dot_general"}
}

%body.sunk (wide.param.2: (s32[], f32[2,8], bf16[2,3], bf16[3,8], s32[])) -> (s32[], f32[2,8], bf16[2,3], bf16[3,8], s32[]) {
  %constant.1.sunk = s32[]{:T(128)} constant(1)
  %wide.param.2 = (s32[]{:T(128)}, f32[2,8], bf16[2,3], bf16[3,8], s32[]{:T(128)}) parameter(0)
  %get-tuple-element.67 = s32[]{:T(128)} get-tuple-element(%wide.param.2), index=0
  %copy.6 = s32[]{:T(128)S(6)} copy(%get-tuple-element.67), backend_config={"flag_configs":[]}
  %add.10 = s32[]{:T(128)} add(%copy.6, %constant.1.sunk), metadata={op_name="while/body/add"}
  %get-tuple-element.74 = bf16[2,3] get-tuple-element(%wide.param.2), index=2
  %get-tuple-element.75 = bf16[3,8] get-tuple-element(%wide.param.2), index=3
  %get-tuple-element.76 = s32[]{:T(128)} get-tuple-element(%wide.param.2), index=4
  %fusion.16 = f32[2,8]{1,0} fusion(%get-tuple-element.75, %get-tuple-element.74), kind=kOutput, calls=%fused
  %all-reduce.1 = f32[2,8]{1,0} all-reduce(%fusion.16), replica_groups=[1,8]<=[8], to_apply=%add
  ROOT %tuple.18 = (s32[]{:T(128)}, f32[2,8], bf16[2,3], bf16[3,8], s32[]{:T(128)}) tuple(%add.10, %all-reduce.1, %get-tuple-element.74, %get-tuple-element.75, %get-tuple-element.76)
}

%cond (wide.param.1: (s32[], f32[2,8], bf16[2,3], bf16[3,8], s32[])) -> pred[] {
  %constant.4.clone.1 = s32[]{:T(128)} constant(4), metadata={op_name="jit(f)"}
  %wide.param.1 = (s32[]{:T(128)}, f32[2,8], bf16[2,3], bf16[3,8], s32[]{:T(128)}) parameter(0)
  %get-tuple-element.41 = s32[]{:T(128)} get-tuple-element(%wide.param.1), index=0
  ROOT %lt.3 = pred[]{:T(512)} compare(%get-tuple-element.41, %constant.4.clone.1), direction=LT, metadata={op_name="cond/lt"}
}

ENTRY %main (a: bf16[2,3], w: bf16[3,8]) -> f32[2,8] {
  %a = bf16[2,3] parameter(0)
  %w = bf16[3,8] parameter(1)
  %constant.8 = s32[]{:T(128)} constant(0)
  %constant.1 = s32[]{:T(128)} constant(1)
  %zero = f32[2,8] constant(0)
  %copy.12 = s32[]{:T(128)} copy(%constant.8)
  %tuple.16 = (s32[]{:T(128)}, f32[2,8], bf16[2,3], bf16[3,8], s32[]{:T(128)}) tuple(%copy.12, %zero, %a, %w, %constant.1)
  %while.10 = (s32[]{:T(128)}, f32[2,8], bf16[2,3], bf16[3,8], s32[]{:T(128)}) while(%tuple.16), condition=%cond, body=%body.sunk
  ROOT %r = f32[2,8] get-tuple-element(%while.10), index=1
}
"""


def test_a_tpu_loop_without_known_trip_count_is_counted_from_its_counter_bound_and_step():
    assert [c["op"] for c in hlo.collectives_in(TPU_SCAN, 8)] == ["all-reduce"] * 4
    step_two = TPU_SCAN.replace(
        "%constant.1.sunk = s32[]{:T(128)} constant(1)", "%constant.1.sunk = s32[]{:T(128)} constant(2)"
    )
    assert len(hlo.collectives_in(step_two, 8)) == 2
    from_one = TPU_SCAN.replace(
        "%constant.8 = s32[]{:T(128)} constant(0)", "%constant.8 = s32[]{:T(128)} constant(1)"
    )
    assert len(hlo.collectives_in(from_one, 8)) == 3


def test_a_tpu_loop_whose_bound_is_not_a_constant_is_still_refused():
    unknown = TPU_SCAN.replace(
        "%constant.4.clone.1 = s32[]{:T(128)} constant(4)",
        "%constant.4.clone.1 = s32[]{:T(128)} get-tuple-element(%wide.param.1), index=4",
    )
    with pytest.raises(ValueError, match="cannot count"):
        hlo.collectives_in(unknown, 8)
    wrong_way = TPU_SCAN.replace("direction=LT", "direction=NE")
    with pytest.raises(ValueError, match="cannot count"):
        hlo.collectives_in(wrong_way, 8)


def test_a_matrix_product_the_tpu_writes_as_a_convolution_is_counted_for_each_further_step():
    # three further steps of the product, and of the counter's add and the condition's compare (XLA's cost
    # analysis counts every instruction of one step, so every one is counted for the others)
    assert hlo.loop_flops(TPU_SCAN) == 3 * 2 * (2 * 8) * 3 + 3 * 1 + 3 * 1
    no_spatial_dimension = TPU_SCAN.replace("dim_labels=bf_io->bf", "window={size=3}, dim_labels=bf_io->bf")
    with pytest.raises(ValueError, match="convolution inside a loop"):
        hlo.loop_flops(no_spatial_dimension)
    dilated = TPU_SCAN.replace("dim_labels=bf_io->bf", "lhs_dilate=2, dim_labels=bf_io->bf")
    with pytest.raises(ValueError, match="convolution inside a loop"):
        hlo.loop_flops(dilated)


def test_a_collective_matmuls_windowed_product_in_a_loop_with_an_unsigned_counter_is_counted():
    # What libtpu writes for FSDP's gathered weights (a windowed dot_general): the loop's counter is u32, and each
    # step's product is a convolution whose window spans a dimension it also sums over: f x window per output.
    windowed = (
        TPU_SCAN.replace("s32[]", "u32[]")
        .replace("%p1 = bf16[2,3]{1,0:T(2,128)(2,1)} parameter(1)", "%p1 = bf16[2,2,3] parameter(1)")
        .replace("%p0 = bf16[3,8]{1,0:T(4,128)(2,1)} parameter(0)", "%p0 = bf16[2,3,8] parameter(0)")
        .replace(
            "ROOT %convolution.7 = f32[2,8]{1,0:T(2,128)} convolution(%p1, %p0), dim_labels=bf_io->bf",
            "ROOT %convolution.7 = f32[2,1,8] convolution(%p1, %p0), window={size=2}, dim_labels=b0f_0io->b0f",
        )
    )
    assert [c["op"] for c in hlo.collectives_in(windowed, 8)] == ["all-reduce"] * 4
    assert hlo.loop_flops(windowed) == 3 * 2 * (2 * 1 * 8) * (3 * 2) + 3 * 1 + 3 * 1


def test_an_async_permute_sends_the_buffer_its_done_gives_not_the_whole_start_tuple():
    text = """\
ENTRY %main (p: f32[16,3]) -> f32[16,3] {
  %fusion = f32[16,3]{0,1:T(4,128)} parameter(0)
  %collective-permute-start = (f32[16,3]{0,1:T(4,128)S(1)}, f32[16,3]{0,1:T(4,128)S(1)}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%fusion), channel_id=1, source_target_pairs={{0,1},{1,0}}
  ROOT %collective-permute-done = f32[16,3]{0,1:T(4,128)S(1)} collective-permute-done(%collective-permute-start), metadata={op_name="ppermute"}
}
"""
    found = hlo.collectives_in(text, 2)
    assert [(c["op"], c["shape"]) for c in found] == [("collective-permute", "f32[16,3]{0,1:T(4,128)S(1)}")]


# The shape of what libtpu 0.0.50 writes for a program exported for CPU and TPU (`jax.export` with
# platforms=["cpu", "tpu"], as the kit's harness exports) and compiled for v5e:2x4: one branch per
# platform, the index a constant. Only the branch taken sends anything.
TWO_PLATFORMS = """\
HloModule jit_run, entry_computation_layout={(f32[64,32])->f32[64,32]}

%region_2.0_spmd (param.2: (f32[64,32], (), (), u32[])) -> (f32[64,32]) {
  %param.2 = (f32[64,32], (), (), u32[]) parameter(0)
  %get-tuple-element.1 = f32[64,32] get-tuple-element(%param.2), index=0
  %all-gather.8 = f32[64,32]{1,0:T(8,128)S(1)} all-gather(%get-tuple-element.1), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  ROOT %tuple.1 = (f32[64,32]) tuple(%all-gather.8)
}

%region_3.0_spmd (param.3: (f32[64,32], (), (), u32[])) -> (f32[64,32]) {
  %param.3 = (f32[64,32], (), (), u32[]) parameter(0)
  %get-tuple-element.2 = f32[64,32] get-tuple-element(%param.3), index=0
  %all-gather.9 = f32[64,32]{1,0:T(8,128)S(1)} all-gather(%get-tuple-element.2), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  ROOT %tuple.2 = (f32[64,32]) tuple(%all-gather.9)
}

ENTRY %main.0_spmd (param.6: f32[64,32]) -> f32[64,32] {
  %param.6 = f32[64,32] parameter(0)
  %constant.18 = s32[] constant(INDEX)
  %tuple.18 = (f32[64,32], (), (), u32[]) tuple(%param.6)
  %conditional.3 = (f32[64,32]{0,1:T(8,128)S(1)}) conditional(%constant.18, %tuple.18, %tuple.18), branch_computations={%region_2.0_spmd, %region_3.0_spmd}
  ROOT %get-tuple-element.38 = f32[64,32]{0,1:T(8,128)S(1)} get-tuple-element(%conditional.3), index=0
}
"""


@pytest.mark.parametrize("index", [0, 1, 7])
def test_a_conditional_on_a_constant_sends_only_what_its_taken_branch_sends(index):
    found = hlo.collectives_in(TWO_PLATFORMS.replace("INDEX", str(index)), 8)
    assert [c["op"] for c in found] == ["all-gather"]  # 7: out of range, the last branch, as XLA runs it


def test_a_conditional_whose_index_is_computed_counts_every_branch_an_upper_bound():
    text = TWO_PLATFORMS.replace("%constant.18 = s32[] constant(INDEX)", "%constant.18 = s32[] parameter(1)")
    assert [c["op"] for c in hlo.collectives_in(text, 8)] == ["all-gather", "all-gather"]


def test_a_step_time_the_tpu_compiler_gives_as_zero_or_less_is_no_estimate():
    from labkit import facts

    class Compiled:
        def __init__(self, seconds):
            self.seconds = seconds

        def cost_analysis(self):
            return {"optimal_seconds": self.seconds, "flops": 8.0, "bytes accessed": 4.0}

    assert facts._compiler_estimate(Compiled(2e-3)) == {"seconds": 2e-3, "flops": 8.0, "bytes": 4.0}
    assert facts._compiler_estimate(Compiled(-3.8)) is None  # libtpu's figure for loops it does not model
    assert facts._compiler_estimate(Compiled(0.0)) is None
