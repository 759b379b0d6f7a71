"""Lab 8, hidden tests: new data, and the mistakes that one device cannot show.

On one device a sum over devices, a mean over devices and device 0's own value are all the
same number. On eight they are not, and these tests say which of them came back. Nor can every
device compute the gradient of the whole batch (x and y given P()): the compiled program shows the
batch whole on each device, and one device's FLOPs those of the whole batch.
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_replicated,
    public_tests,
)

public = public_tests(__file__)  # the public tests' inputs and helpers
NAMES, leaf, pair, loss_and_grads, train = (
    public.NAMES,
    public.leaf,
    public.pair,
    public.loss_and_grads,
    public.train,
)

PARAMS = public.make_params(81, d_in=6, d_hidden=24, d_out=3)
# split by rows over every device: 64 rows on up to 32 devices, copies each 0.25 higher on a larger pod
X, Y = (
    by_devices(rows, shift=0.25, per_device=2) for rows in public.make_batch(82, batch=64, d_in=6, d_out=3)
)
STEPS, LR = 6, 0.03


def close(a, b) -> bool:
    return np.allclose(a, b, rtol=1e-4, atol=1e-6)


def slice_of_device_0(x, y, n):
    return x[: len(x) // n], y[: len(y) // n]


def summed_gradient(n, layer, key):
    return (
        f"[{layer!r}][{key!r}] is {n} times the whole batch's gradient: the {n} devices' gradients were "
        f"summed, not averaged. With check_vma on, jax.grad of parameters passed in with P() comes back "
        f"already summed over 'data', and a pmean after it changes nothing: give each device its own copy "
        f"with jax.lax.pcast(state, 'data', to='varying') before jax.grad, then pmean (pmean, not psum)"
    )


def local_gradient(n, layer, key):
    return (
        f"[{layer!r}][{key!r}] is the gradient of device 0's slice alone (1/{n} of the batch): the devices "
        f"never averaged. Did you leave out the pmean over 'data'? With check_vma=False, out_specs=P() "
        f"keeps device 0's value without a word"
    )


@check(got=call("global_gradients", PARAMS, X, Y))
def test_gradient_is_the_mean_over_devices_not_a_sum_or_one_device(got, run):
    n, x, y = run.device_count, X.on(run), Y.on(run)
    _, grads = pair(got, "(loss, grads)")
    want = loss_and_grads(PARAMS, x, y)[1]
    local = loss_and_grads(PARAMS, *slice_of_device_0(x, y, n))[1]
    for layer, key in NAMES:
        arr = np.asarray(leaf(grads, layer, key).value)
        if arr.shape == want[layer][key].shape and not close(arr, want[layer][key]) and n > 1:
            if close(arr, n * want[layer][key]):
                raise Mismatch(summed_gradient(n, layer, key))
            if close(arr, local[layer][key]):
                raise Mismatch(local_gradient(n, layer, key))
        expect_close(
            leaf(grads, layer, key),
            want[layer][key],
            rtol=1e-4,
            atol=1e-6,
            hint=f"(gradient of [{layer!r}][{key!r}] for the whole batch)",
        )


@check(got=call("global_gradients", PARAMS, X, Y))
def test_loss_is_the_mean_over_devices_not_device_0s(got, run):
    n, x, y = run.device_count, X.on(run), Y.on(run)
    loss, _ = pair(got, "(loss, grads)")
    want = loss_and_grads(PARAMS, x, y)[0]
    if (
        n > 1
        and close(loss.value, loss_and_grads(PARAMS, *slice_of_device_0(x, y, n))[0])
        and not close(loss.value, want)
    ):
        raise Mismatch(
            f"the loss is device 0's local loss, {float(loss.value):.6g}, not the whole batch's "
            f"{want:.6g}: pmean the loss over 'data' as well as the gradient"
        )
    expect_close(loss, want, rtol=1e-4, atol=1e-6)


@check(got=call("global_gradients", PARAMS, X, Y))
def test_gradient_is_replicated_on_every_device(got, run):
    _, grads = pair(got, "(loss, grads)")
    for layer, key in NAMES:
        expect_replicated(
            leaf(grads, layer, key),
            run.device_count,
            hint="every device should end with the same, whole gradient",
        )


@check(got=call("train_data_parallel", PARAMS, X, Y, STEPS, LR))
def test_training_follows_the_single_device_loss_curve_on_every_device_count(got, run):
    n, x, y = run.device_count, X.on(run), Y.on(run)
    losses, _ = pair(got, "(losses, final_params)")
    want = train(PARAMS, x, y, STEPS, LR)[0]
    arr = np.asarray(losses.value)
    if (
        n > 1
        and arr.shape == want.shape
        and not close(arr, want)
        and close(arr, train(PARAMS, x, y, STEPS, LR, grad_scale=n)[0])
    ):
        raise Mismatch(
            f"the first loss is right but the curve then follows steps {n} times too large "
            f"(got {np.round(arr, 4).tolist()}, expected {np.round(want, 4).tolist()}): the gradient "
            f"was summed over the {n} devices instead of averaged. Without "
            f"jax.lax.pcast(state, 'data', to='varying'), jax.grad of replicated parameters is "
            f"already a sum and pmean cannot undo it"
        )
    expect_close(
        losses,
        want,
        rtol=1e-4,
        atol=1e-6,
        hint="the curve should not depend on the number of devices: average local gradients with pmean",
    )


@check(got=call("train_data_parallel", PARAMS, X, Y, STEPS, LR))
def test_final_parameters_are_the_same_on_every_device(got, run):
    _, final = pair(got, "(losses, final_params)")
    want = train(PARAMS, X.on(run), Y.on(run), STEPS, LR)[1]
    for layer, key in NAMES:
        expect_close(leaf(final, layer, key), want[layer][key], rtol=1e-4, atol=1e-5)
        expect_replicated(
            leaf(final, layer, key),
            run.device_count,
            hint="every device's copy should take the same step and stay identical",
        )


@check(got=compiled_call("global_gradients", PARAMS, X, Y))
def test_gradients_each_device_works_on_its_own_slice_of_the_batch(got, run):
    public.expect_own_rows_and_a_mean(got, run.device_count, PARAMS, X.on(run))


# The public tests' one-step call: it runs once for both, and one step compiles faster than many.
@check(got=compiled_call("train_data_parallel", public.PARAMS, public.X, public.Y, 1, public.LR))
def test_training_steps_each_device_works_on_its_own_slice_of_the_batch(got, run):
    public.expect_a_step_on_own_rows(got, run.device_count, public.PARAMS, public.X.on(run))


# -- exercise 3: accumulated_gradients, held to its budget ------------------------------------

# four micro-batches of a row or more on 32 devices; on a larger pod, copies until every device has four rows
X128, Y128 = (
    by_devices(rows, shift=0.25, per_device=4) for rows in public.make_batch(83, batch=128, d_in=6, d_out=3)
)
ACCUMULATED = compiled_call("accumulated_gradients", PARAMS, X128, Y128, 4)


# One compiled call serves every test: it runs once, and its value is what the function returned.
@check(got=ACCUMULATED)
def test_four_micro_batches_give_the_whole_batch_gradient(got, run):
    public.expect_whole_batch_step(got, PARAMS, X128.on(run), Y128.on(run), 4)


@check(got=ACCUMULATED)
def test_accumulation_keeps_each_device_on_its_own_slice(got, run):
    public.expect_accumulation_on_own_rows(got, run.device_count, PARAMS, X128.on(run))


@check(got=ACCUMULATED)
def test_accumulation_averages_once_per_step(got, run):
    public.expect_one_average_per_step(got, run.device_count, PARAMS)


# -- stretch (not graded: points=0): train_data_parallel_adam --------------------------------------


def train_adam_averaging_parameters(params, x, y, steps, learning_rate, n, b1=0.9, b2=0.999, eps=1e-8):
    """What n devices give that each take an Adam step on their own slice's gradient, then average the parameters
    and the optimizer's moments."""
    p = {layer: {k: np.asarray(v, np.float64) for k, v in d.items()} for layer, d in params.items()}
    m = {layer: {k: np.zeros_like(v) for k, v in d.items()} for layer, d in p.items()}
    v = {layer: {k: np.zeros_like(w) for k, w in d.items()} for layer, d in p.items()}
    xs, ys, losses = np.split(x, n), np.split(y, n), []
    for t in range(1, steps + 1):
        losses.append(loss_and_grads(p, x, y)[0])
        grads = [loss_and_grads(p, xs[i], ys[i])[1] for i in range(n)]
        for layer, key in NAMES:
            ms = [b1 * m[layer][key] + (1 - b1) * g[layer][key] for g in grads]
            vs = [b2 * v[layer][key] + (1 - b2) * g[layer][key] ** 2 for g in grads]
            moves = [mi / (1 - b1**t) / (np.sqrt(vi / (1 - b2**t)) + eps) for mi, vi in zip(ms, vs)]
            p[layer][key] = p[layer][key] - learning_rate * np.mean(moves, axis=0)
            m[layer][key], v[layer][key] = np.mean(ms, axis=0), np.mean(vs, axis=0)
    return np.array(losses), p


@check(points=0, got=call("train_data_parallel_adam", PARAMS, X, Y, STEPS, LR))
def test_adam_averages_gradients_before_the_step_not_parameters_after(got, run):
    n, x, y = run.device_count, X.on(run), Y.on(run)
    losses, _ = pair(got, "(losses, final_params)")
    want = public.train_adam(PARAMS, x, y, STEPS, LR)[0]
    if (
        n > 1
        and not close(losses.value, want)
        and close(losses.value, train_adam_averaging_parameters(PARAMS, x, y, STEPS, LR, n)[0])
    ):
        raise Mismatch(
            f"the curve is what {n} devices give that each take their own Adam step and then average "
            f"the parameters. Adam divides by a running norm of each device's own gradient, so the "
            f"average of the steps is not the step of the average: average the gradients (and the "
            f"loss) before tx.update"
        )
    expect_close(
        losses, want, rtol=1e-4, atol=1e-6, hint="the curve should not depend on the number of devices"
    )
