"""Lab 14, public tests: the training step of the transformer block, on a grid, equals the one-device step.

The expected values are the notebook's `sgd_step` on one device, computed here with JAX on the
judge's CPU: the block's forward pass, its gradient by `jax.grad`, and the momentum update.
"""

import numpy as np

from labkit.checks import (
    FactUnavailable,
    Mismatch,
    by_devices,
    call,
    check,
    collectives_of,
    compiled_call,
    describe,
    expect_close,
    expect_fits_each_chip,
    expect_work_share,
    facts_of,
    sent_per_device,
    shaped,
)
from labkit.cost import bytes_sent, format_bytes

WEIGHTS = ("wq", "wk", "wv", "wo", "w1", "w2")
HEADS, LEARNING_RATE, MOMENTUM = 16, 0.1, 0.9
LOSS_BYTES = 4  # the loss, one float32 every device learns


# ---- the one-device step the tests compare with ------------------------------------------------


def weight_shapes(dim, hidden):
    return {
        "wq": (dim, dim),
        "wk": (dim, dim),
        "wv": (dim, dim),
        "wo": (dim, dim),
        "w1": (dim, hidden),
        "w2": (hidden, dim),
    }


def make_problem(seed, batch=16, seq=8, dim=64, hidden=256):
    """Parameters, momentum, inputs and targets of one step (the notebook's make_problem)."""
    rng = np.random.default_rng(seed)
    shapes = weight_shapes(dim, hidden)
    params = {k: (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32) for k, s in shapes.items()}
    momentum = {k: (0.1 * rng.normal(size=s)).astype(np.float32) for k, s in shapes.items()}
    x, y = (rng.normal(size=(batch, seq, dim)).astype(np.float32) for _ in range(2))
    return params, momentum, x, y


# How each array grows on a pod larger than the problem (`by_devices`): the model dimension and the batch, until
# each divides over every device (64 and 16 on up to 32 devices, as written; 256 and 256 on a pod of 256), so that
# a design may split either over the whole grid; the sequence and (unless said) the hidden units (256) stay as
# written. Each copy is shifted a little past the last, so that no two devices hold the same columns.
MODEL_AXES = {"wq": (0, 1), "wk": (0, 1), "wv": (0, 1), "wo": (0, 1), "w1": 0, "w2": 1}
HIDDEN_AXES = {"w1": (1, 0), "w2": (0, 1)}  # the hidden units first, then the model dimension


def by_the_pod(problem, hidden_per_device: int | None = None):
    """The problem as a run gets it (`on`): as written on 1 to 32 devices, its model dimension and batch grown on
    a larger pod; with `hidden_per_device` k, on a pod of more than 32 devices its hidden units too, to k for each
    device (1,024 on a pod of 256 with k = 4)."""
    params, momentum, x, y = problem

    def one(k, w, shift):
        if hidden_per_device and k in HIDDEN_AXES:
            return by_devices(w, shift=shift, axis=HIDDEN_AXES[k], per_device=hidden_per_device, widen=True)
        return by_devices(w, shift=shift, axis=MODEL_AXES[k])

    def grown(tree, shift):
        return {k: one(k, w, shift) for k, w in tree.items()}

    def batch(a, shift):
        return by_devices(a, shift=shift, axis=(0, 2))

    # x's 64 copies on 256 devices (16 along the batch, 4 along the model dimension) shifted by up to 0.63 in all
    return grown(params, 0.01), grown(momentum, 0.01), batch(x, 0.01), batch(y, 0.01)


def on(problem, run):
    """The (params, momentum, x, y) that `run` got of a problem sized `by_the_pod`."""
    params, momentum, x, y = problem
    return (
        {k: w.on(run) for k, w in params.items()},
        {k: w.on(run) for k, w in momentum.items()},
        x.on(run),
        y.on(run),
    )


def one_device_step(params, momentum, x, y, *, flops: bool = False):
    """(new params, new momentum, loss) of one step of SGD with momentum, as numpy arrays; with `flops`, the
    FLOPs of that step's one-device program instead."""
    import jax

    if not jax.config.jax_platforms:  # the judge: keep off any accelerator a notebook run needs
        jax.config.update("jax_platforms", "cpu")  # (a kernel that already chose its platforms keeps them)
    import jax.numpy as jnp

    def block(p, x):
        b, s, d = x.shape
        heads = [(x @ p[w]).reshape(b, s, HEADS, d // HEADS) for w in ("wq", "wk", "wv")]
        q, k, v = heads
        scores = jnp.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(d // HEADS)
        mixed = jnp.einsum("bhqk,bkhc->bqhc", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
        h = x + mixed @ p["wo"]
        return h + jnp.tanh(h @ p["w1"]) @ p["w2"]

    def step(p, m, x, y):
        loss, g = jax.value_and_grad(lambda p: jnp.mean((block(p, x) - y) ** 2))(p)
        m = {k: MOMENTUM * m[k] + g[k] for k in p}
        return {k: p[k] - LEARNING_RATE * m[k] for k in p}, m, loss

    with jax.default_device(jax.devices("cpu")[0]):
        if flops:  # the FLOPs of the one-device program, as XLA's cost analysis counts them
            analysis = jax.jit(step).lower(params, momentum, x, y).compile().cost_analysis()
            return float((analysis[0] if isinstance(analysis, list) else analysis)["flops"])
        new_p, new_m, loss = jax.jit(step)(params, momentum, x, y)
    return (
        {k: np.asarray(v) for k, v in new_p.items()},
        {k: np.asarray(v) for k, v in new_m.items()},
        np.asarray(loss),
    )


def parts(got):
    """The (params, momentum, loss) that came back, or a message that says what came instead."""
    if got.kind not in ("tuple", "list") or len(got.value) != 3:
        raise Mismatch(f"expected a tuple (params, momentum, loss), got {describe(got)}")
    params, momentum, loss = got.value
    for name, tree in (("params", params), ("momentum", momentum)):
        if tree.kind != "dict" or set(tree.value) != set(WEIGHTS):
            have = sorted(tree.value) if tree.kind == "dict" else describe(tree)
            raise Mismatch(f"expected {name} as a dict of {', '.join(WEIGHTS)}, got {have}")
    return params.value, momentum.value, loss


def expect_the_one_device_step(got, problem) -> None:
    """The new parameters, the new momentum and the loss all equal the one-device step's."""
    params, momentum, loss = parts(got)
    want_p, want_m, want_loss = one_device_step(*problem)
    expect_close(loss, want_loss, rtol=1e-4, atol=1e-6, hint="(the loss: the mean over the whole batch)")
    for name in WEIGHTS:
        expect_close(
            momentum[name],
            want_m[name],
            rtol=1e-3,
            atol=float_rounding(want_m[name]),
            hint=f"(the new momentum of {name}: MOMENTUM * m + the whole batch's gradient)",
        )
        expect_close(
            params[name], want_p[name], rtol=1e-4, atol=float_rounding(want_p[name]), hint=f"(the new {name})"
        )


def float_rounding(want) -> float:
    """What float32 sums in another order may differ by beside an array's largest values: 1e-4 of its largest
    magnitude (1e-5 at least). A gradient is a sum over every token (2,048 on a pod of 256, where wq's momentum
    reaches 20 and a small entry beside it differed from the one-device step's by 2.4e-4); a design that drops or
    repeats a part of the batch is off by far more."""
    return max(1e-5, 1e-4 * float(np.max(np.abs(want)))) if np.size(want) else 1e-5


# On a pod of 256, 256 sequences of 8 tokens on a model dimension of 256: its hidden units grow to 512 there, so that
# the reference's all-reduces of the activations (which grow with the batch, as the budget does not) stay within
# the communication budget, which grows with the parameters (0.76 of it, v5e:16x16's compiler).
PROBLEM = by_the_pod(make_problem(14), hidden_per_device=2)


@check(got=call("train_step", *PROBLEM))
def test_train_step_equals_the_one_device_step(got, run):
    expect_the_one_device_step(got, on(PROBLEM, run))


@check(got=call("train_step", *PROBLEM))
def test_train_step_keeps_every_array_its_shape(got, run):
    params, momentum, loss = parts(got)
    given = on(PROBLEM, run)[0]
    for name in WEIGHTS:
        for what, tree in (("parameter", params), ("momentum", momentum)):
            if tree[name].kind != "array" or tree[name].shape != given[name].shape:
                raise Mismatch(
                    f"the new {what} {name} should have the shape {given[name].shape}, got "
                    f"{describe(tree[name])}"
                )
    if loss.kind != "array" or loss.shape != ():
        raise Mismatch(f"the loss should be one number (a 0-d array), got {describe(loss)}")


# ---- the memory and communication budgets of the handout, read from the compiled program (the hidden tests hold
# them on another batch; the work budget is below)


def state_kept(got, side: str) -> tuple[int, list[str]]:
    """Bytes of the training state one device keeps on one side of the step ("arguments": as it arrives,
    "outputs": as it leaves), and the arrays every device holds whole."""
    facts = got.compiled
    if facts is None or not hasattr(facts, "inputs"):
        raise FactUnavailable(f"the compiled program could not be examined ({getattr(facts, 'why', facts)})")
    placements = facts.inputs if side == "arguments" else facts.outputs
    if not isinstance(placements, tuple):
        raise FactUnavailable(f"this check cannot be made here: {placements.why}")
    prefixes = ("args[0]", "args[1]") if side == "arguments" else ("out[0]", "out[1]")
    state = [p for p in placements if p.path.startswith(prefixes)]
    if len(state) != 2 * len(WEIGHTS):
        raise FactUnavailable(
            f"the compiled program's {side} do not hold the twelve arrays of the state "
            f"({', '.join(p.path for p in placements)})"
        )
    for p in state:
        if not isinstance(p.device_bytes, int):
            raise FactUnavailable(f"this check cannot be made here: {p.device_bytes.why}")
    whole = [
        p.path.replace("args[0]", "params")
        .replace("args[1]", "momentum")
        .replace("out[0]", "params")
        .replace("out[1]", "momentum")
        for p in state
        if p.device_bytes >= p.bytes
    ]
    return sum(p.device_bytes for p in state), whole


def expect_within_the_memory_budget(got, n: int, problem) -> None:
    """Each device keeps at most 2/n of the parameters and momentum, as they arrive and as they leave."""
    state_bytes = 2 * sum(w.nbytes for w in problem[0].values())  # the parameters and their momentum
    budget = 2 * state_bytes / n
    for side, when in (("arguments", "as it arrives"), ("outputs", "as it leaves the step")):
        kept, whole = state_kept(got, side)
        if kept > budget:
            copied = f"; every device holds all of {', '.join(whole)}" if whole else ""
            raise Mismatch(
                f"over the memory budget: each device keeps {format_bytes(kept)} of the training state "
                f"{when}, where the budget is {format_bytes(budget)}, 2/{n} of the "
                f"{format_bytes(state_bytes)} of the parameters and their momentum (the state may "
                f"exist at most twice over the grid){copied}. Split what is copied: the parameters, the "
                f"momentum, or both"
            )


def expect_within_the_communication_budget(got, n: int, problem) -> None:
    """Each device sends at most 4 (n-1)/n of the parameters' bytes and the loss's: twice data parallelism's
    all-reduce of the gradient and the loss. (On 256 devices libtpu writes FSDP's gathers of these small weights as
    an all-reduce, and so sends exactly that: twice data parallelism's all-reduce.)"""
    parameter_bytes = sum(w.nbytes for w in problem[0].values())
    budget = 2 * bytes_sent("all-reduce", parameter_bytes + LOSS_BYTES, n)
    sent = sent_per_device(got)
    if sent > budget:
        by_op = {}
        for c in collectives_of(got):
            by_op[c.op] = by_op.get(c.op, 0) + 1
        ran = ", ".join(f"{count} {op}" for op, count in sorted(by_op.items()))
        shown = [format_bytes(sent), format_bytes(budget)]
        if shown[0] == shown[1]:  # over by less than the rounding shows: the bytes themselves
            shown = [f"{sent:,.0f} bytes", f"{budget:,.0f} bytes"]
        raise Mismatch(
            f"over the communication budget: each device sends {shown[0]} in one step, where "
            f"the budget is {shown[1]}, 4 ({n}-1)/{n} of the {format_bytes(parameter_bytes)} "
            f"of the parameters and the loss's {LOSS_BYTES} bytes (twice the all-reduce of the gradient and "
            f"the loss that plain data parallelism sends); the program runs {ran}. Run cost_of on your program: which collective runs more "
            f"often, or moves more, than the step needs?"
        )


STEP = compiled_call("train_step", *PROBLEM)


@check(got=STEP)
def test_train_step_keeps_within_the_memory_budget(got, run):
    expect_within_the_memory_budget(got, run.device_count, on(PROBLEM, run))


@check(got=STEP)
def test_train_step_sends_within_the_communication_budget(got, run):
    expect_within_the_communication_budget(got, run.device_count, on(PROBLEM, run))


# ---- the work budget: each device computes its share of the step, a little more at most ------------------

# Wide enough that the block's products are nearly all of the step's work (the softmax, the norms and the
# update around them are a few percent at this size): 128 sequences of 8 tokens. On a pod of 256 (256 sequences, a
# model dimension of 256) the 'model' axis of the reference's 2 x 128 grid cuts the products 128 ways, and every
# device repeats the work on the residual stream (the sums, the loss) beside its 1/128 of each: its hidden units grow
# there to 4 a device (1,024), where the reference computes 1.13 times its share and FSDP 1.02 (v5e:16x16's
# compiler), as the reference does 1.1 times on 8 devices. The test reads the program's FLOPs, never its value.
WORK_PROBLEM = by_the_pod(make_problem(43, batch=128, seq=8), hidden_per_device=4)
WORK_SLACK = 1.3  # the reference's grid computes 1.1 times its share here: the work around the products


def expect_a_share_of_the_work(got, n: int, problem, whole: float, slack: float = WORK_SLACK) -> None:
    """One device's FLOPs within `slack` times its 1/n share of the one-device step's (`whole`); the hidden test
    holds the same budget, in the same words, on its own batch."""
    expect_work_share(
        got,
        whole,
        n,
        slack=slack,
        what="the one-device step",
        hint=f"Each device should compute 1/{n} of the step, and at most {slack} times that. Devices that "
        "repeat one another's work (the whole batch on every device; half the grid computing what the other "
        "half computes; the weights gathered and every unit computed) give the right numbers at several "
        "times the cost. Split the batch over one axis of the grid and the heads and hidden units over the "
        "other, so that no two devices compute the same thing",
    )


@check(got=facts_of("train_step", *WORK_PROBLEM))
def test_each_device_computes_its_share_of_the_step(got, run):
    problem = on(WORK_PROBLEM, run)
    expect_a_share_of_the_work(got, run.device_count, problem, one_device_step(*problem, flops=True))


# ---- at a production size: the TPU compiler's program, on the compile-only TPU configurations alone


PRODUCTION = {"batch": 384, "seq": 512, "dim": 4096, "hidden": 16384}  # a block of a real model, float32


def production_problem(batch, seq, dim, hidden):
    """The step's inputs by their shapes alone, never made: 768 MiB of parameters, 3 GiB in each of x and y. The
    batch grows where it does not divide over the devices (twice, to 768 sequences, on a pod of 256), so that a
    design may split it over the whole grid; the reference then holds 12.5 GiB of v5e's 15.75 on each chip."""
    params = {k: shaped(s) for k, s in weight_shapes(dim, hidden).items()}
    batch_of = by_devices(shaped((batch, seq, dim)))
    return params, dict(params), batch_of, batch_of


AT_PRODUCTION_SIZE = production_problem(**PRODUCTION)


@check(got=compiled_call("train_step", *AT_PRODUCTION_SIZE))
def test_at_a_production_size_the_step_fits_each_chip_and_keeps_the_memory_budget(got, run):
    n, sequences = run.device_count, AT_PRODUCTION_SIZE[2].on(run).shape[0]
    expect_fits_each_chip(
        got,
        where=f"at a production size (d_model {PRODUCTION['dim']}, hidden {PRODUCTION['hidden']}, a batch of "
        f"{sequences} sequences of {PRODUCTION['seq']} tokens, on {n} chips)",
        what="step",
        hint="A design that works on the small problem can still ask each chip for more than it has: split "
        "the batch and the weights so that no chip computes or keeps the whole",
    )
    expect_within_the_memory_budget(got, n, AT_PRODUCTION_SIZE)
