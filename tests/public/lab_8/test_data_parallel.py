"""Lab 8, public tests: the global batch's gradient from per-device gradients, and data-parallel training.

The expected values are computed here, on one device, in float64 numpy: the loss and gradient of
the two-layer perceptron on the whole batch, and SGD with momentum 0.9 on the whole batch. The budgets read
from the compiled program (each device on its own rows of the batch, its share of the work, one average of
the gradient per step) are held here on these inputs, and by the hidden tests on others with the same helpers
and words.
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    describe,
    expect_array,
    expect_close,
    expect_collective,
    expect_fits_each_chip,
    expect_input_split,
    expect_replicated,
    expect_sent_within,
    expect_shape,
    expect_work_share,
    expect_work_split,
    placed,
    sent_per_device,
    shaped,
)
from labkit.cost import bytes_sent

MOMENTUM = 0.9
NAMES = (("hidden", "kernel"), ("hidden", "bias"), ("out", "kernel"), ("out", "bias"))


# ---- the single-device computation the tests compare with --------------------------------


def make_params(seed, d_in=4, d_hidden=16, d_out=2):
    rng = np.random.default_rng(seed)
    return {
        "hidden": {
            "kernel": (rng.normal(size=(d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32),
            "bias": (0.1 * rng.normal(size=d_hidden)).astype(np.float32),
        },
        "out": {
            "kernel": (rng.normal(size=(d_hidden, d_out)) / np.sqrt(d_hidden)).astype(np.float32),
            "bias": (0.1 * rng.normal(size=d_out)).astype(np.float32),
        },
    }


def make_batch(seed, batch=32, d_in=4, d_out=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, d_in)).astype(np.float32)
    # sin and cos in float64, then rounded: numpy's float32 sin and cos differ in their last bit between processors,
    # and a call's id is its inputs' bytes
    wide = x.astype(np.float64)
    columns = [np.sin(wide.sum(axis=1)), np.cos(wide[:, 0])] + [wide[:, 1]] * (d_out - 2)
    y = np.stack(columns, axis=1)[:, :d_out]
    return x, y.astype(np.float32)


def loss_and_grads(params, x, y):
    """The mse of the batch and its gradient, by hand, in float64."""
    p = {layer: {k: np.asarray(v, np.float64) for k, v in d.items()} for layer, d in params.items()}
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    h = np.tanh(x @ p["hidden"]["kernel"] + p["hidden"]["bias"])
    pred = h @ p["out"]["kernel"] + p["out"]["bias"]
    loss = np.mean((pred - y) ** 2)
    d_pred = 2.0 * (pred - y) / pred.size
    d_pre = (d_pred @ p["out"]["kernel"].T) * (1.0 - h**2)
    grads = {
        "hidden": {"kernel": x.T @ d_pre, "bias": d_pre.sum(axis=0)},
        "out": {"kernel": h.T @ d_pred, "bias": d_pred.sum(axis=0)},
    }
    return loss, grads


def train(params, x, y, steps, learning_rate, grad_scale=1.0):
    """SGD with momentum on the whole batch; grad_scale lets a test ask what a wrong gradient would give."""
    p = {layer: {k: np.asarray(v, np.float64) for k, v in d.items()} for layer, d in params.items()}
    trace = {layer: {k: np.zeros_like(v) for k, v in d.items()} for layer, d in p.items()}
    losses = []
    for _ in range(steps):
        loss, g = loss_and_grads(p, x, y)
        losses.append(loss)
        for layer, key in NAMES:
            trace[layer][key] = grad_scale * g[layer][key] + MOMENTUM * trace[layer][key]
            p[layer][key] = p[layer][key] - learning_rate * trace[layer][key]
    return np.array(losses), p


# ---- reading what came back ---------------------------------------------------------------


def pair(got, what):
    if got.kind not in ("tuple", "list") or len(got.value) != 2:
        raise Mismatch(f"expected a pair {what}, got {describe(got)}")
    return got.value


def leaf(got, layer, key):
    """params[layer][key] of a nested dict that came back."""
    if (
        got.kind != "dict"
        or layer not in got.value
        or got.value[layer].kind != "dict"
        or key not in got.value[layer].value
    ):
        raise Mismatch(
            f"expected a nested dict with [{layer!r}][{key!r}] like the parameters "
            f"(nnx.to_pure_dict gives one), got {describe(got)}"
        )
    return got.value[layer].value[key]


PARAMS = make_params(1)  # the same on every device: never grown
# x and y split by rows over every device: 32 rows divide over 1 to 32 devices; a larger pod gets copies, each
# 0.125 higher than the last, until every device has two rows of its own (one row a device compiles its sums
# over the batch away, and the production size would be another design)
X, Y = (by_devices(rows, shift=0.125, per_device=2) for rows in make_batch(2))
STEPS, LR = 5, 0.05
REPLICATED = (
    "Every device should hold the whole gradient: pmean over 'data' and out_specs=P() with a mesh "
    "over all of jax.devices()"
)


@check(got=compiled_call("global_gradients", PARAMS, X, Y))
def test_loss_is_the_whole_batch_loss(got, run):
    loss, _ = pair(got, "(loss, grads)")
    expect_close(loss, loss_and_grads(PARAMS, X.on(run), Y.on(run))[0], rtol=1e-4, atol=1e-6)


@check(got=call("global_gradients", PARAMS, X, Y))
def test_gradient_is_the_whole_batch_gradient(got, run):
    _, grads = pair(got, "(loss, grads)")
    want = loss_and_grads(PARAMS, X.on(run), Y.on(run))[1]
    for layer, key in NAMES:
        expect_close(
            leaf(grads, layer, key),
            want[layer][key],
            rtol=1e-4,
            atol=1e-6,
            hint=f"(gradient of [{layer!r}][{key!r}])",
        )


@check(got=call("global_gradients", PARAMS, X, Y))
def test_every_device_holds_the_whole_gradient(got, run):
    _, grads = pair(got, "(loss, grads)")
    for layer, key in NAMES:
        expect_replicated(leaf(grads, layer, key), run.device_count, hint=REPLICATED)


@check(got=call("global_gradients", PARAMS, placed(X, ("data", None)), placed(Y, ("data", None))))
def test_accepts_a_batch_that_is_already_split(got, run):
    _, grads = pair(got, "(loss, grads)")
    want = loss_and_grads(PARAMS, X.on(run), Y.on(run))[1]
    for layer, key in NAMES:
        expect_close(leaf(grads, layer, key), want[layer][key], rtol=1e-4, atol=1e-6)


@check(got=call("train_data_parallel", PARAMS, X, Y, STEPS, LR))
def test_loss_curve_equals_single_device_training(got, run):
    losses, _ = pair(got, "(losses, final_params)")
    expect_shape(losses, (STEPS,), hint="one loss per step, the loss before that step's update")
    expect_close(
        losses,
        train(PARAMS, X.on(run), Y.on(run), STEPS, LR)[0],
        rtol=1e-4,
        atol=1e-6,
        hint="losses[i] is the whole batch's loss before step i, with optax.sgd(learning_rate, momentum=0.9)",
    )


@check(got=call("train_data_parallel", PARAMS, X, Y, STEPS, LR))
def test_final_parameters_equal_single_device_training(got, run):
    _, final = pair(got, "(losses, final_params)")
    want = train(PARAMS, X.on(run), Y.on(run), STEPS, LR)[1]
    for layer, key in NAMES:
        expect_close(
            leaf(final, layer, key),
            want[layer][key],
            rtol=1e-4,
            atol=1e-5,
            hint=f"(final [{layer!r}][{key!r}])",
        )


@check(got=compiled_call("train_data_parallel", PARAMS, X, Y, 1, LR))
def test_one_step_is_one_sgd_update(got, run):
    losses, final = pair(got, "(losses, final_params)")
    expect_shape(losses, (1,), hint="steps=1 gives one loss")
    loss, grads = loss_and_grads(PARAMS, X.on(run), Y.on(run))
    expect_close(losses, [loss], rtol=1e-4, atol=1e-6)
    for layer, key in NAMES:
        expect_close(
            leaf(final, layer, key),
            PARAMS[layer][key] - LR * grads[layer][key],
            rtol=1e-4,
            atol=1e-6,
            hint="the first step of SGD with momentum is params - learning_rate * grads",
        )


# ---- the budget: each device on its own rows, and one average of the gradient --------------------------

WHOLE_BATCH = (
    "Every device computes the gradient of the whole batch: that is not data parallelism. Give x and y "
    "in_specs=P('data'), so that each device takes 1/{n} of the rows, and average the gradients with "
    "jax.lax.pmean(..., 'data')"
)


def whole_batch_flops(params, x, steps=1):
    """The matrix products of the forward pass and of the weight gradients over all of x, for `steps` steps."""
    (d_in, d_hidden), d_out = params["hidden"]["kernel"].shape, params["out"]["kernel"].shape[1]
    return steps * 2 * (2 * len(x) * (d_in * d_hidden + d_hidden * d_out))


def expect_own_rows_and_a_mean(got, n: int, params, x) -> None:
    """x and y split by rows, one device's FLOPs within its share of the whole batch's, and an all-reduce."""
    expect_input_split(got, 1, n, name="x", hint=WHOLE_BATCH.format(n=n))
    expect_input_split(got, 2, n, name="y", hint=WHOLE_BATCH.format(n=n))
    expect_work_split(
        got,
        whole_batch_flops(params, x),
        n,
        what="the gradient of the whole batch",
        hint=WHOLE_BATCH.format(n=n),
    )
    expect_collective(
        got, "all-reduce", n, hint="The devices' gradients are averaged by jax.lax.pmean(grads, 'data')"
    )


def expect_a_step_on_own_rows(got, n: int, params, x) -> None:
    """x split by rows, and one device's FLOPs within its share of a step on the whole batch."""
    expect_input_split(got, 1, n, name="x", hint=WHOLE_BATCH.format(n=n))
    expect_work_split(
        got,
        whole_batch_flops(params, x),
        n,
        what="a step on the whole batch",
        hint=WHOLE_BATCH.format(n=n),
    )


@check(got=compiled_call("global_gradients", PARAMS, X, Y))
def test_each_device_takes_the_gradient_of_its_own_rows_and_the_devices_average(got, run):
    expect_own_rows_and_a_mean(got, run.device_count, PARAMS, X.on(run))


@check(got=compiled_call("train_data_parallel", PARAMS, X, Y, 1, LR))
def test_each_device_takes_a_training_step_on_its_own_rows(got, run):
    expect_a_step_on_own_rows(got, run.device_count, PARAMS, X.on(run))


# ---- global_gradients at a production size: the TPU compiler's program, on the compile-only TPU configurations

PRODUCTION = {"batch": 8192, "d_in": 8192, "d_hidden": 32768, "d_out": 8192}  # a large model's MLP, float32


def production_problem(batch, d_in, d_hidden, d_out):
    """global_gradients' inputs by their shapes alone, never made: 2 GiB of parameters, 256 MiB of x."""
    params = {
        "hidden": {"kernel": shaped((d_in, d_hidden)), "bias": shaped((d_hidden,))},
        "out": {"kernel": shaped((d_hidden, d_out)), "bias": shaped((d_out,))},
    }
    return params, shaped((batch, d_in)), shaped((batch, d_out))


AT_PRODUCTION_SIZE = production_problem(**PRODUCTION)
# the forward pass's two products and the weights' gradients, for the whole batch
PRODUCTION_FLOPS = (
    2 * 2 * PRODUCTION["batch"] * PRODUCTION["d_hidden"] * (PRODUCTION["d_in"] + PRODUCTION["d_out"])
)
PARAMETER_BYTES = 4 * (
    PRODUCTION["d_hidden"] * (PRODUCTION["d_in"] + PRODUCTION["d_out"] + 1) + PRODUCTION["d_out"]
)


@check(got=compiled_call("global_gradients", *AT_PRODUCTION_SIZE))
def test_at_a_production_size_each_chip_fits_works_on_its_rows_and_sends_one_mean_of_the_gradient(got, run):
    n = run.device_count
    expect_fits_each_chip(
        got,
        where=f"at a production size (d_model {PRODUCTION['d_in']}, {PRODUCTION['d_hidden']} hidden units, a "
        f"batch of {PRODUCTION['batch']} rows, on {n} chips)",
        what="gradient step",
        hint="Data parallelism keeps one copy of the parameters on each chip and gives each chip 1/n of the rows",
    )
    expect_work_share(
        got,
        PRODUCTION_FLOPS,
        n,
        slack=1.5,
        what="the gradient of the whole batch",
        hint="Give x and y in_specs=P('data'): each chip computes the gradient of its own rows only",
    )
    expect_sent_within(
        got,
        2 * (n - 1) / n * PARAMETER_BYTES,
        n,
        what="one all-reduce of the gradient, as jax.lax.pmean sends it",
        hint="Average the gradients once, with jax.lax.pmean(grads, 'data'); send nothing else",
    )


# -- exercise 3: accumulated_gradients ----------------------------------------------------------

MICRO = 2
# 64 rows: two micro-batches of at least one row on up to 32 devices; on a larger pod, copies each 0.125 higher
# until every device has two rows
X64, Y64 = (by_devices(rows, shift=0.125, per_device=MICRO) for rows in make_batch(3, batch=64))


def expect_whole_batch_step(got, params, x, y, micro: int) -> None:
    loss, grads = pair(got, "(loss, grads)")
    want_loss, want = loss_and_grads(params, x, y)
    for what, value, right in [("the loss", loss, want_loss)] + [
        (f"[{layer!r}][{key!r}]", leaf(grads, layer, key), want[layer][key]) for layer, key in NAMES
    ]:
        if micro > 1 and np.allclose(expect_array(value), micro * right, rtol=1e-4, atol=1e-6):
            raise Mismatch(
                f"{what} is {micro} times the whole batch's: the losses and gradients of the {micro} "
                f"micro-batches were added up. Each is a mean over its rows: divide their sum by the "
                f"number of micro-batches"
            )
        expect_close(value, right, rtol=1e-4, atol=1e-6, hint=f"({what})")


@check(got=call("accumulated_gradients", PARAMS, X64, Y64, MICRO))
def test_accumulated_gradients_equal_the_whole_batch_gradient(got, run):
    expect_whole_batch_step(got, PARAMS, X64.on(run), Y64.on(run), MICRO)


@check(got=call("accumulated_gradients", PARAMS, X64, Y64, MICRO))
def test_accumulated_gradients_are_whole_on_every_device(got, run):
    _, grads = pair(got, "(loss, grads)")
    for layer, key in NAMES:
        expect_replicated(leaf(grads, layer, key), run.device_count, hint=REPLICATED)


def expect_accumulation_on_own_rows(got, n: int, params, x) -> None:
    """x split by rows, and one device's FLOPs within its share of the whole batch's gradient."""
    expect_input_split(got, 1, n, name="x", hint=WHOLE_BATCH.format(n=n))
    expect_work_split(
        got,
        whole_batch_flops(params, x),
        n,
        what="the gradient of the whole batch",
        hint=WHOLE_BATCH.format(n=n),
    )


def expect_one_average_per_step(got, n: int, params) -> None:
    """Each device sends at most 1.25 times one all-reduce of the gradient and the loss."""
    gradient_and_loss = 4 * (1 + sum(np.size(params[layer][key]) for layer, key in NAMES))
    budget, sent = bytes_sent("all-reduce", gradient_and_loss, n), sent_per_device(got)
    if n > 1 and sent > 1.25 * budget:
        raise Mismatch(
            f"each device sends {sent:.0f} bytes, {sent / budget:.1f} times the {budget:.0f} that one "
            f"average of the gradient and the loss needs: the devices talked once per micro-batch. "
            f"Add up the micro-batches' gradients on each device first, and average across devices "
            f"once, at the end"
        )


ACCUMULATED = compiled_call("accumulated_gradients", PARAMS, X64, Y64, MICRO)


@check(got=ACCUMULATED)
def test_accumulated_gradients_keep_each_device_on_its_own_rows(got, run):
    expect_accumulation_on_own_rows(got, run.device_count, PARAMS, X64.on(run))


@check(got=ACCUMULATED)
def test_accumulated_gradients_are_averaged_across_devices_once_per_step(got, run):
    expect_one_average_per_step(got, run.device_count, PARAMS)


# -- stretch (not graded: points=0): train_data_parallel_adam --------------------------------------


def train_adam(params, x, y, steps, learning_rate, b1=0.9, b2=0.999, eps=1e-8):
    """Adam on the whole batch (optax.adam's defaults), in float64."""
    p = {layer: {k: np.asarray(v, np.float64) for k, v in d.items()} for layer, d in params.items()}
    m = {layer: {k: np.zeros_like(v) for k, v in d.items()} for layer, d in p.items()}
    v = {layer: {k: np.zeros_like(w) for k, w in d.items()} for layer, d in p.items()}
    losses = []
    for t in range(1, steps + 1):
        loss, g = loss_and_grads(p, x, y)
        losses.append(loss)
        for layer, key in NAMES:
            m[layer][key] = b1 * m[layer][key] + (1 - b1) * g[layer][key]
            v[layer][key] = b2 * v[layer][key] + (1 - b2) * g[layer][key] ** 2
            m_hat, v_hat = m[layer][key] / (1 - b1**t), v[layer][key] / (1 - b2**t)
            p[layer][key] = p[layer][key] - learning_rate * m_hat / (np.sqrt(v_hat) + eps)
    return np.array(losses), p


@check(points=0, got=call("train_data_parallel_adam", PARAMS, X, Y, STEPS, LR))
def test_adam_follows_the_single_device_loss_curve(got, run):
    losses, final = pair(got, "(losses, final_params)")
    want_losses, want = train_adam(PARAMS, X.on(run), Y.on(run), STEPS, LR)
    expect_close(
        losses,
        want_losses,
        rtol=1e-4,
        atol=1e-6,
        hint="losses[i] is the whole batch's loss before step i, with optax.adam(learning_rate)",
    )
    for layer, key in NAMES:
        expect_close(leaf(final, layer, key), want[layer][key], rtol=1e-4, atol=1e-5)
        expect_replicated(leaf(final, layer, key), run.device_count, hint=REPLICATED)
