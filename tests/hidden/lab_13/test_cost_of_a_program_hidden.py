"""Lab 13, hidden tests: the same predictions on other shapes, and at the turning point itself.

A prediction typed in for the public shapes, or a rule that only holds on one side of the turning
point, fails here: each answer is again read from the programs compiled on these shapes.
"""

from labkit.checks import call, check, compiled_call, public_tests

public = public_tests(__file__)  # the public tests' inputs and helpers

WIDE = public.f32(96, 64)


def on_the_wide_array(kind: str) -> dict:
    return {
        "guess": call("predict_sent", kind, WIDE.shape),
        "program": compiled_call("run_collective", kind, WIDE),
    }


@check(**on_the_wide_array("all_gather"))
def test_predict_sent_of_all_gather_on_another_shape_matches_the_compiled_program(guess, program, run):
    public.expect_sent_as_compiled(guess, program, "all_gather", WIDE.shape, run.device_count)


@check(**on_the_wide_array("psum_scatter"))
def test_predict_sent_of_psum_scatter_on_another_shape_matches_the_compiled_program(guess, program, run):
    public.expect_sent_as_compiled(guess, program, "psum_scatter", WIDE.shape, run.device_count)


@check(**on_the_wide_array("all_to_all"))
def test_predict_sent_of_all_to_all_on_another_shape_matches_the_compiled_program(guess, program, run):
    public.expect_sent_as_compiled(guess, program, "all_to_all", WIDE.shape, run.device_count)


@check(**public.both_designs(32, 64, 32))
def test_fewer_bytes_at_the_turning_point_matches_the_compiled_programs(answer, fsdp, tensor, run):
    public.expect_fewer_as_compiled(answer, fsdp, tensor, 32, run.device_count)


@check(**public.both_designs(96, 32, 128))
def test_fewer_bytes_with_a_wider_hidden_layer_matches_the_compiled_programs(answer, fsdp, tensor, run):
    public.expect_fewer_as_compiled(answer, fsdp, tensor, 96, run.device_count)


@check(**public.fsdp_at_two_batches(512, 256))
def test_fsdp_compute_bound_batch_on_another_mlp_matches_the_card_of_its_compiled_program(
    answer, low, high, run
):
    public.expect_balance_as_modelled(answer, low, high, public.BATCHES, 512, 256, run.device_count)


# -- stretch (not graded: points=0): predict_flops, on another MLP ---------------------------------------

OTHER_MLP = public.mlp_inputs(96, 64, 32)


@check(points=0, guess=call("predict_flops", 96, 64, 32), program=compiled_call("fsdp_forward", *OTHER_MLP))
def test_predict_flops_on_another_mlp_is_within_2_percent_of_the_compiled_program(guess, program):
    public.expect_flops_as_compiled(guess, program)
