"""Lab 13, hidden tests: the same predictions on other shapes, and at the turning point itself.

A prediction typed in for the public shapes, or a rule that only holds on one side of the turning
point, fails here: each answer is again read from the programs compiled on these shapes. The inputs grow
with the pod as the public tests' do, and the same checks are not judged on `v5e-256` (`public.AS_ALL_REDUCE`).
"""

from labkit.checks import by_devices, call, check, facts_of, not_judged_for, public_tests

public = public_tests(__file__)  # the public tests' inputs and helpers

WIDE = by_devices(public.f32(96, 64), shift=0.5, axis=(0, 1))  # 768 x 256 on 256 devices


@check(**public.on(WIDE, "all_gather"))
def test_predict_sent_of_all_gather_on_another_shape_matches_the_compiled_program(guess, program, run):
    public.expect_sent_as_compiled(guess, program, "all_gather", WIDE, run)


@check(**public.on(WIDE, "psum_scatter"))
def test_predict_sent_of_psum_scatter_on_another_shape_matches_the_compiled_program(guess, program, run):
    public.expect_sent_as_compiled(guess, program, "psum_scatter", WIDE, run)


@check(**public.on(WIDE, "all_to_all"))
def test_predict_sent_of_all_to_all_on_another_shape_matches_the_compiled_program(guess, program, run):
    public.expect_sent_as_compiled(guess, program, "all_to_all", WIDE, run)


TURNING_POINT = public.mlp_inputs(32, 64, 32)  # batch = d_hidden: 256 = 256 on 256 devices
WIDER_HIDDEN = public.mlp_inputs(96, 32, 128, hidden=4)  # 768 rows under 1024 hidden units on 256 devices


@check(**public.both_designs(TURNING_POINT))
def test_fewer_bytes_at_the_turning_point_matches_the_compiled_programs(answer, fsdp, tensor, run):
    # the two send alike by the rings; libtpu's FSDP, one all-reduce of both weights there, sends twice as much
    not_judged_for(run, public.WRITES_GATHERS_AS_ALL_REDUCES, public.AS_ALL_REDUCE)
    public.expect_fewer_as_compiled(answer, fsdp, tensor, TURNING_POINT, run)


@check(**public.both_designs(WIDER_HIDDEN))
def test_fewer_bytes_with_a_wider_hidden_layer_matches_the_compiled_programs(answer, fsdp, tensor, run):
    public.expect_fewer_as_compiled(answer, fsdp, tensor, WIDER_HIDDEN, run)


OTHER_TWO_BATCHES = public.at_two_batches(512, 256)


@check(**public.fsdp_at_two_batches(OTHER_TWO_BATCHES))
def test_fsdp_compute_bound_batch_on_another_mlp_matches_the_card_of_its_compiled_program(
    answer, low, high, run
):
    public.expect_balance_as_modelled(answer, low, high, OTHER_TWO_BATCHES, run)


# -- stretch (not graded: points=0): predict_flops, on another MLP ---------------------------------------

OTHER_MLP = public.mlp_inputs(96, 64, 32, rows=32)  # 96 rows a device on 256 devices (public.FLOPS_ARGS)


@check(
    points=0,
    guess=call("predict_flops", *public.mlp_sizes(OTHER_MLP)),
    program=facts_of("fsdp_forward", *OTHER_MLP),
)
def test_predict_flops_on_another_mlp_is_within_2_percent_of_the_compiled_program(guess, program, run):
    public.expect_flops_as_compiled(guess, program, run)
