"""Lab 14, public tests: the training step of the transformer block, on a grid, equals the one-device step.

The expected values are the notebook's `sgd_step` on one device, computed here with JAX on the
judge's CPU: the block's forward pass, its gradient by `jax.grad`, and the momentum update.
"""

import numpy as np

from labkit.checks import Mismatch, call, check, describe, expect_close

WEIGHTS = ("wq", "wk", "wv", "wo", "w1", "w2")
HEADS, LEARNING_RATE, MOMENTUM = 16, 0.1, 0.9


# ---- the one-device step the tests compare with ------------------------------------------------

def make_problem(seed, batch=16, seq=8, dim=64, hidden=256):
    """Parameters, momentum, inputs and targets of one step (the notebook's make_problem)."""
    rng = np.random.default_rng(seed)
    shapes = {"wq": (dim, dim), "wk": (dim, dim), "wv": (dim, dim), "wo": (dim, dim), "w1": (dim, hidden),
              "w2": (hidden, dim)}
    params = {k: (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32) for k, s in shapes.items()}
    momentum = {k: (0.1 * rng.normal(size=s)).astype(np.float32) for k, s in shapes.items()}
    x, y = (rng.normal(size=(batch, seq, dim)).astype(np.float32) for _ in range(2))
    return params, momentum, x, y


def one_device_step(params, momentum, x, y):
    """(new params, new momentum, loss) of one step of SGD with momentum, as numpy arrays."""
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
        new_p, new_m, loss = jax.jit(step)(params, momentum, x, y)
    return ({k: np.asarray(v) for k, v in new_p.items()}, {k: np.asarray(v) for k, v in new_m.items()},
            np.asarray(loss))


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
        expect_close(momentum[name], want_m[name], rtol=1e-3, atol=1e-5,
                     hint=f"(the new momentum of {name}: MOMENTUM * m + the whole batch's gradient)")
        expect_close(params[name], want_p[name], rtol=1e-4, atol=1e-5, hint=f"(the new {name})")


PROBLEM = make_problem(14)


@check(got=call("train_step", *PROBLEM))
def test_train_step_equals_the_one_device_step(got):
    expect_the_one_device_step(got, PROBLEM)


@check(got=call("train_step", *PROBLEM))
def test_train_step_keeps_every_array_its_shape(got):
    params, momentum, loss = parts(got)
    for name in WEIGHTS:
        for what, tree in (("parameter", params), ("momentum", momentum)):
            if tree[name].kind != "array" or tree[name].shape != PROBLEM[0][name].shape:
                raise Mismatch(f"the new {what} {name} should have the shape {PROBLEM[0][name].shape}, got "
                               f"{describe(tree[name])}")
    if loss.kind != "array" or loss.shape != ():
        raise Mismatch(f"the loss should be one number (a 0-d array), got {describe(loss)}")
