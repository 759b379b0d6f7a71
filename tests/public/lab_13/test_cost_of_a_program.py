"""Lab 13, public tests: predictions of what a compiled program costs, each compared with the program itself.

No expected number is typed here. Each test also compiles the lab's given program in the student's
process (`compiled_call`) and reads the answer from its facts: the bytes each device sends, as the
cost card counts them (`sent_per_device`), and the card's modelled times on a TPU v5e (`card_of`).
"""

import numpy as np

from labkit import cost
from labkit.checks import Mismatch, call, card_of, check, compiled_call, describe, sent_per_device

RNG = np.random.default_rng(13)


def f32(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def number(got, what: str) -> float:
    if got.kind in ("int", "float") or (
        got.kind == "array" and got.value.ndim == 0 and got.value.dtype.kind in "iuf"
    ):
        return float(np.asarray(got.value))
    raise Mismatch(f"expected a number of {what}, got {describe(got)}")


# -- exercise 1: predict_sent ----------------------------------------------------------------------

RING_HINT = {
    "psum": "an all-reduce sends 2 (n-1)/n of the array it sums: a reduce-scatter, then an all-gather",
    "all_gather": "the B of an all-gather is its result, the gathered array of n blocks, not one block",
    "psum_scatter": "the B of a reduce-scatter is the array it sums (n times its scattered result)",
    "all_to_all": "an all-to-all keeps 1/n of the block on its device and sends the rest",
    "ppermute": "a ring shift sends each device's block once, to one neighbour; on one device nothing moves",
}


def expect_sent_as_compiled(guess, program, kind: str, shape, n: int) -> None:
    predicted, read = number(guess, "bytes"), sent_per_device(program)
    if not np.isclose(predicted, read, rtol=1e-6, atol=0.5):
        raise Mismatch(
            f"for {kind} on x of shape {tuple(shape)} over {n} device(s) you predicted {predicted:.0f} "
            f"bytes sent per device; the compiled program sends {read:.0f} ({read / max(predicted, 1):.3g}x "
            f"your prediction, counted as the cost card counts rings). {RING_HINT[kind]}"
        )


X = f32(64, 32)


@check(guess=call("predict_sent", "psum", X.shape), program=compiled_call("run_collective", "psum", X))
def test_predict_sent_of_psum_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "psum", X.shape, run.device_count)


@check(
    guess=call("predict_sent", "all_gather", X.shape),
    program=compiled_call("run_collective", "all_gather", X),
)
def test_predict_sent_of_all_gather_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "all_gather", X.shape, run.device_count)


@check(
    guess=call("predict_sent", "psum_scatter", X.shape),
    program=compiled_call("run_collective", "psum_scatter", X),
)
def test_predict_sent_of_psum_scatter_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "psum_scatter", X.shape, run.device_count)


@check(
    guess=call("predict_sent", "all_to_all", X.shape),
    program=compiled_call("run_collective", "all_to_all", X),
)
def test_predict_sent_of_all_to_all_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "all_to_all", X.shape, run.device_count)


@check(
    guess=call("predict_sent", "ppermute", X.shape), program=compiled_call("run_collective", "ppermute", X)
)
def test_predict_sent_of_ppermute_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "ppermute", X.shape, run.device_count)


# -- exercise 2: fewer_bytes -------------------------------------------------------------------------


def mlp_inputs(batch, d_model, d_hidden):
    return f32(batch, d_model), f32(d_model, d_hidden), f32(d_hidden, d_model)


def fewer_from_the_programs(fsdp, tensor) -> tuple[str, float, float]:
    """Which program sends fewer bytes per device, read from the two compiled programs."""
    a, b = sent_per_device(fsdp), sent_per_device(tensor)
    return ("same" if np.isclose(a, b, rtol=1e-9, atol=1e-9) else "fsdp" if a < b else "tensor"), a, b


def expect_fewer_as_compiled(answer, fsdp, tensor, batch, n) -> None:
    want, a, b = fewer_from_the_programs(fsdp, tensor)
    if answer.kind != "str" or answer.value not in ("fsdp", "tensor", "same"):
        raise Mismatch(f"expected 'fsdp', 'tensor' or 'same', got {describe(answer)}")
    if answer.value != want:
        raise Mismatch(
            f"at batch {batch} on {n} device(s) you answered {answer.value!r}; the compiled programs send "
            f"{a:.0f} bytes per device (fsdp_forward) and {b:.0f} (tensor_forward): {want!r}. One gathers "
            f"the weights, the other sums the output: which grows with the batch?"
        )


def both_designs(batch, d_model, d_hidden) -> dict:
    """The calls a test of fewer_bytes needs: the answer, and the two designs compiled on the same inputs."""
    args = mlp_inputs(batch, d_model, d_hidden)
    return {
        "answer": call("fewer_bytes", batch, d_model, d_hidden),
        "fsdp": compiled_call("fsdp_forward", *args),
        "tensor": compiled_call("tensor_forward", *args),
    }


@check(**both_designs(32, 32, 64))
def test_fewer_bytes_at_a_small_batch_matches_the_compiled_programs(answer, fsdp, tensor, run):
    expect_fewer_as_compiled(answer, fsdp, tensor, 32, run.device_count)


@check(**both_designs(128, 32, 64))
def test_fewer_bytes_at_a_large_batch_matches_the_compiled_programs(answer, fsdp, tensor, run):
    expect_fewer_as_compiled(answer, fsdp, tensor, 128, run.device_count)


# -- exercise 3: fsdp_compute_bound_batch --------------------------------------------------------------

V5E = cost.chips()["v5e"]


def balance_batch(low, high, b_low: int, b_high: int) -> float:
    """The global batch at which the card's compute time reaches its communication time on a v5e, from the
    cards of the program compiled at two batch sizes: FLOPs grow in a straight line with the batch, the
    bytes a device sends stay as they are."""
    t_low, t_high = low.timing(V5E, precision="highest"), high.timing(V5E, precision="highest")
    slope = (t_high.compute - t_low.compute) / (b_high - b_low)
    gap = t_low.communication - t_low.compute  # what the compute time still has to catch up at b_low
    return max(0.0, b_low + gap / slope)


def expect_balance_as_modelled(answer, low, high, batches, d_model, d_hidden, n) -> None:
    low, high = card_of(low), card_of(high)
    want, got = balance_batch(low, high, *batches), number(answer, "rows")
    if abs(got - want) > 0.05 * want + n:
        per_row = (high.flops - low.flops) / (batches[1] - batches[0])
        raise Mismatch(
            f"for d_model={d_model}, d_hidden={d_hidden} on a v5e x{n} you answered a batch of {got:.0f}; "
            f"the card of fsdp_forward's compiled program reaches compute = communication at about "
            f"{want:.0f} (each device sends {low.sent_total:.0f} bytes, computes {per_row:.0f} FLOPs per "
            f"row of the global batch, at {V5E.f32_flops:.3g} float32 FLOP/s and "
            f"{V5E.ring_bandwidth(n):.3g} B/s into a ring of {n}: a v5e slice smaller than the pod's 16 x 16 has "
            "no wraparound link, so its ring is a line at half of `send_bandwidth`)"
        )


BATCHES = (64, 128)  # the two sizes fsdp_forward is compiled at: its card's straight line runs through them


def fsdp_at_two_batches(d_model, d_hidden) -> dict:
    """The calls a test of fsdp_compute_bound_batch needs: the answer, and fsdp_forward compiled at BATCHES."""
    low, high = (mlp_inputs(b, d_model, d_hidden) for b in BATCHES)
    return {
        "answer": call("fsdp_compute_bound_batch", d_model, d_hidden),
        "low": compiled_call("fsdp_forward", *low),
        "high": compiled_call("fsdp_forward", *high),
    }


@check(**fsdp_at_two_batches(256, 512))
def test_fsdp_compute_bound_batch_matches_the_card_of_the_compiled_program(answer, low, high, run):
    expect_balance_as_modelled(answer, low, high, BATCHES, 256, 512, run.device_count)


# -- stretch (not graded: points=0): predict_flops ----------------------------------------------------

FLOPS_ARGS = mlp_inputs(64, 32, 64)


@check(points=0, guess=call("predict_flops", 64, 32, 64), program=compiled_call("fsdp_forward", *FLOPS_ARGS))
def test_predict_flops_is_within_2_percent_of_the_compiled_program(guess, program):
    expect_flops_as_compiled(guess, program)


def expect_flops_as_compiled(guess, program) -> None:
    predicted, read = number(guess, "FLOPs"), card_of(program).flops
    if not np.isclose(predicted, read, rtol=0.02):
        raise Mismatch(
            f"you predicted {predicted:.0f} FLOPs per device; the compiled program computes {read:.0f}"
        )
