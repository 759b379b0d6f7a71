"""Lab 13, public tests: predictions of what a compiled program costs, each compared with the program itself.

No expected number is typed here. Each test also compiles the lab's given program in the student's
process and reads the answer from its facts alone (`facts_of`: its value is never read back): the bytes
each device sends, as the cost card counts them (`sent_per_device`), and the card's modelled times on a
TPU v5e (`card_of`).

The inputs are sized for pods of up to 32 devices; on a larger pod every size a program splits over every device
grows with it (`by_devices`), and the student's function is asked at the sizes the run's pod gave the program
(`sizes_of`). On a 256-device axis libtpu writes an all-gather and a reduce-scatter as an all-reduce, twice the
ring's bytes (FSDP's two gathers as one all-reduce of both weights, with its additions): the checks that a ring's
prediction cannot meet there are not judged on `v5e-256` (`not_judged_for`), and are on every other configuration.
"""

import numpy as np

from labkit import cost
from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    card_of,
    check,
    describe,
    facts_of,
    not_judged_for,
    sent_per_device,
    sizes_of,
)

RNG = np.random.default_rng(13)


def f32(*shape):
    return RNG.normal(size=shape).astype(np.float32)


# The topology whose compiler writes an all-gather and a reduce-scatter over every device as an all-reduce
# (compiled for v5e:16x16, 1 to 64 rows a device: all-gathers of 256 x 256 to 16384 x 256, FSDP's weights of
# 256 x 256 to 256 x 1024 at 1 to 4 rows of x a device, reduce-scatters of 512 x 512 and 256 x 1024).
WRITES_GATHERS_AS_ALL_REDUCES = ("v5e:16x16",)
AS_ALL_REDUCE = (
    "libtpu writes an all-gather and a reduce-scatter over a 256-device axis as an all-reduce, which sends twice "
    "a ring's bytes: no prediction by the card's rings can meet it there"
)


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


def expect_sent_as_compiled(guess, program, kind: str, x, run) -> None:
    """`guess`, the student's bytes for `kind` on `x` as `run` got it, against the program compiled on it."""
    if kind in ("all_gather", "psum_scatter"):
        not_judged_for(run, WRITES_GATHERS_AS_ALL_REDUCES, AS_ALL_REDUCE)
    shape, n = x.on(run).shape, run.device_count
    predicted, read = number(guess, "bytes"), sent_per_device(program)
    if not np.isclose(predicted, read, rtol=1e-6, atol=0.5):
        raise Mismatch(
            f"for {kind} on x of shape {tuple(shape)} over {n} device(s) you predicted {predicted:.0f} "
            f"bytes sent per device; the compiled program sends {read:.0f} ({read / max(predicted, 1):.3g}x "
            f"your prediction, counted as the cost card counts rings). {RING_HINT[kind]}"
        )


# rows and columns over every device (psum_scatter and all_to_all cut the columns): 64 x 32 on up to 32 devices,
# 256 x 256 on 256
X = by_devices(f32(64, 32), shift=0.5, axis=(0, 1))


def on(x, kind: str) -> dict:
    """The calls a test of predict_sent needs: the prediction at x's shape as the run's pod gave it, and the
    program of `kind` compiled on x."""
    return {
        "guess": call("predict_sent", kind, sizes_of(x)),
        "program": facts_of("run_collective", kind, x),
    }


@check(**on(X, "psum"))
def test_predict_sent_of_psum_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "psum", X, run)


@check(**on(X, "all_gather"))
def test_predict_sent_of_all_gather_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "all_gather", X, run)


@check(**on(X, "psum_scatter"))
def test_predict_sent_of_psum_scatter_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "psum_scatter", X, run)


@check(**on(X, "all_to_all"))
def test_predict_sent_of_all_to_all_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "all_to_all", X, run)


@check(**on(X, "ppermute"))
def test_predict_sent_of_ppermute_matches_the_compiled_program(guess, program, run):
    expect_sent_as_compiled(guess, program, "ppermute", X, run)


# -- exercise 2: fewer_bytes -------------------------------------------------------------------------


def mlp_inputs(batch, d_model, d_hidden, rows: int = 1, hidden: int = 1) -> tuple:
    """x, w1, w2 of these sizes, as written on up to 32 devices. On a larger pod each size grows until it divides
    over every device (FSDP splits the batch, d_model in w1 and d_hidden in w2; tensor parallelism d_hidden):
    `rows` rows of x a device and `hidden` hidden units a device there, to keep a test on its side of a turning
    point (256 x 256 x 256 on 256 devices, with rows=2: 512 x 256 x 256)."""
    x = by_devices(f32(batch, d_model), shift=1 / 64, axis=(0, 1), per_device=rows)
    w1 = by_devices(f32(d_model, d_hidden), shift=1 / 64, axis=(1, 0), per_device=hidden)
    w2 = by_devices(f32(d_hidden, d_model), shift=1 / 64, axis=(0, 1), per_device=hidden)
    return x, w1, w2


def mlp_sizes(inputs) -> tuple:
    """(batch, d_model, d_hidden) of `mlp_inputs`, as sizes that grow with the pod as the inputs do (`sizes_of`)."""
    x, w1, _ = inputs
    return (*sizes_of(x), sizes_of(w1)[1])


def sizes_on(inputs, run) -> tuple[int, int, int]:
    """(batch, d_model, d_hidden) of `mlp_inputs` as `run` got them."""
    x, w1, _ = inputs
    return (*x.on(run).shape, w1.on(run).shape[1])


def fewer_from_the_programs(fsdp, tensor) -> tuple[str, float, float]:
    """Which program sends fewer bytes per device, read from the two compiled programs."""
    a, b = sent_per_device(fsdp), sent_per_device(tensor)
    return ("same" if np.isclose(a, b, rtol=1e-9, atol=1e-9) else "fsdp" if a < b else "tensor"), a, b


def expect_fewer_as_compiled(answer, fsdp, tensor, inputs, run) -> None:
    want, a, b = fewer_from_the_programs(fsdp, tensor)
    if answer.kind != "str" or answer.value not in ("fsdp", "tensor", "same"):
        raise Mismatch(f"expected 'fsdp', 'tensor' or 'same', got {describe(answer)}")
    if answer.value != want:
        batch, d_model, d_hidden = sizes_on(inputs, run)
        raise Mismatch(
            f"at batch {batch}, d_model {d_model}, d_hidden {d_hidden} on {run.device_count} device(s) you "
            f"answered {answer.value!r}; the compiled programs send "
            f"{a:.0f} bytes per device (fsdp_forward) and {b:.0f} (tensor_forward): {want!r}. One gathers "
            f"the weights, the other sums the output: which grows with the batch?"
        )


def both_designs(inputs) -> dict:
    """The calls a test of fewer_bytes needs: the answer at the inputs' sizes as the run's pod gave them, and the
    two designs compiled on the same inputs."""
    return {
        "answer": call("fewer_bytes", *mlp_sizes(inputs)),
        "fsdp": facts_of("fsdp_forward", *inputs),
        "tensor": facts_of("tensor_forward", *inputs),
    }


# Each on its side of the turning point on every pod: on 256 devices (libtpu's FSDP sending twice a ring's
# bytes there, see AS_ALL_REDUCE) 256 rows under 512 hidden units, and 1024 rows over twice 256.
SMALL_BATCH = mlp_inputs(32, 32, 64, hidden=2)
LARGE_BATCH = mlp_inputs(128, 32, 64, rows=4)


@check(**both_designs(SMALL_BATCH))
def test_fewer_bytes_at_a_small_batch_matches_the_compiled_programs(answer, fsdp, tensor, run):
    expect_fewer_as_compiled(answer, fsdp, tensor, SMALL_BATCH, run)


@check(**both_designs(LARGE_BATCH))
def test_fewer_bytes_at_a_large_batch_matches_the_compiled_programs(answer, fsdp, tensor, run):
    expect_fewer_as_compiled(answer, fsdp, tensor, LARGE_BATCH, run)


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


def expect_balance_as_modelled(answer, low, high, inputs, run) -> None:
    """`answer` against the card of fsdp_forward compiled on `inputs` (its two batches, `at_two_batches`)."""
    not_judged_for(run, WRITES_GATHERS_AS_ALL_REDUCES, AS_ALL_REDUCE)
    (b_low, d_model, d_hidden), n = sizes_on(inputs[0], run), run.device_count
    batches = (b_low, sizes_on(inputs[1], run)[0])
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


def at_two_batches(d_model, d_hidden) -> tuple:
    """The inputs of fsdp_forward at two batches, its card's straight line running through them: 64 and 128 rows
    on up to 32 devices, one row a device and two on a larger pod."""
    return mlp_inputs(64, d_model, d_hidden), mlp_inputs(128, d_model, d_hidden, rows=2)


def fsdp_at_two_batches(inputs) -> dict:
    """The calls a test of fsdp_compute_bound_batch needs: the answer, and fsdp_forward compiled at both batches."""
    low, high = inputs
    return {
        "answer": call("fsdp_compute_bound_batch", *mlp_sizes(low)[1:]),
        "low": facts_of("fsdp_forward", *low),
        "high": facts_of("fsdp_forward", *high),
    }


TWO_BATCHES = at_two_batches(256, 512)


@check(**fsdp_at_two_batches(TWO_BATCHES))
def test_fsdp_compute_bound_batch_matches_the_card_of_the_compiled_program(answer, low, high, run):
    expect_balance_as_modelled(answer, low, high, TWO_BATCHES, run)


# -- stretch (not graded: points=0): predict_flops ----------------------------------------------------

# On a pod larger than 32, 64 rows a device: libtpu gathers FSDP's weights there with an all-reduce (AS_ALL_REDUCE),
# whose additions, 2 d_model d_hidden a device, are then 1 / (2 x 64) of the products' FLOPs, inside the 2%
FLOPS_ARGS = mlp_inputs(64, 32, 64, rows=64)


@check(
    points=0,
    guess=call("predict_flops", *mlp_sizes(FLOPS_ARGS)),
    program=facts_of("fsdp_forward", *FLOPS_ARGS),
)
def test_predict_flops_is_within_2_percent_of_the_compiled_program(guess, program, run):
    expect_flops_as_compiled(guess, program, run)


def expect_flops_as_compiled(guess, program, run) -> None:
    predicted, read = number(guess, "FLOPs"), card_of(program).flops
    if not np.isclose(predicted, read, rtol=0.02):
        raise Mismatch(
            f"you predicted {predicted:.0f} FLOPs per device; the compiled program computes {read:.0f}"
        )
