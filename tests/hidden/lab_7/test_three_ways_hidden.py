"""Lab 7, hidden tests: a wider layer, and the mistakes that only show on several devices."""

import numpy as np

from labkit.checks import call, check, expect_close, expect_close_naming_mistakes, expect_replicated

RNG = np.random.default_rng(7)
X = RNG.normal(size=64).astype(np.float32) / 4
W = RNG.normal(size=(64, 6)).astype(np.float32) / 4
B = RNG.normal(size=6).astype(np.float32)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


WANT = sigmoid(X.astype(np.float64) @ W.astype(np.float64) + B)


@check(got=call("layer_shard_map", X, W, B))
def test_shard_map_adds_the_partial_products_of_every_device(got, run):
    n = run.device_count
    partial = [xi @ wi for xi, wi in zip(np.split(X.astype(np.float64), n), np.split(W.astype(np.float64), n))]
    expect_close_naming_mistakes(got, WANT, {
        f"On {n} devices that is device 0's partial product alone: the psum is missing (with check_vma=False, "
        "shard_map does not catch it). Add the partial products with jax.lax.psum(x_block @ w_block, 'data') "
        "before the bias and the sigmoid": sigmoid(partial[0] + B),
        f"On {n} devices the psum came after the sigmoid, adding {n} sigmoids: psum the partial products first":
            sum(sigmoid(p + B) for p in partial),
        f"On {n} devices b was added on every device before the psum and counts {n} times: add it after the psum":
            sigmoid(sum(partial) + n * B),
    }, atol=1e-6)


@check(got=call("layer_jit", X, W, B))
def test_jit_runs_on_every_device_when_the_inputs_are_placed(got, run):
    expect_close(got, WANT, atol=1e-6)
    expect_replicated(got, run.device_count,
                      hint="jax.jit on unplaced inputs is right on one device and runs everything on device 0 when "
                           "there are eight: jax.device_put x with P('data') and w with P('data', None) on a mesh "
                           "of jax.devices() first")


@check(got=call("layer_constrained", X, W, B))
def test_constraints_spread_the_layer_over_every_device(got, run):
    expect_close(got, WANT, atol=1e-6)
    expect_replicated(got, run.device_count,
                      hint="Constraints to a mesh over jax.devices()[:1] are right on one device and keep the work "
                           "on device 0 when there are eight: build the mesh from jax.devices()")


# Three exercises in one test: it lives here so that the check cell of the first never waits for the others.
@check(jit=call("layer_jit", X, W, B), constrained=call("layer_constrained", X, W, B),
       mapped=call("layer_shard_map", X, W, B))
def test_the_three_approaches_agree(jit, constrained, mapped):
    expect_close(constrained, jit.value, atol=1e-6, hint="layer_constrained and layer_jit should give the same layer")
    expect_close(mapped, jit.value, atol=1e-6, hint="layer_shard_map and layer_jit should give the same layer")
