"""Lab 9, public tests: the MLP with tensor-parallel and fully sharded weights equals the unsplit MLP.

The expected values are the unsplit MLP and its gradient, computed here in float64 numpy.
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    call,
    check,
    collectives_of,
    compiled_call,
    describe,
    expect_close,
    expect_close_naming_mistakes,
    expect_fits_each_chip,
    expect_input_split,
    expect_replicated,
    expect_split_across,
    expect_work_share,
    placed,
    shaped,
)
from labkit.cost import bytes_sent, format_bytes, group_width, shape_bytes

WEIGHTS = ("w1", "b1", "w2", "b2")


# ---- the unsplit computation the tests compare with ----------------------------------------


def make_case(
    seed, batch=32, d_in=32, d_hidden=32, d_out=32
):  # fsdp splits every one: each divides by 1 to 32
    rng = np.random.default_rng(seed)
    f32 = lambda a: np.asarray(a, np.float32)
    x = f32(rng.normal(size=(batch, d_in)))
    w1 = f32(rng.normal(size=(d_in, d_hidden)) / np.sqrt(d_in))
    b1 = f32(0.5 * rng.normal(size=d_hidden))
    w2 = f32(rng.normal(size=(d_hidden, d_out)) / np.sqrt(d_hidden))
    b2 = f32(1.0 + rng.normal(size=d_out))  # well away from zero: a bias counted twice shows
    y = f32(rng.normal(size=(batch, d_out)))
    return x, y, (w1, b1, w2, b2)


def mlp(x, w1, b1, w2, b2):
    f64 = lambda a: np.asarray(a, np.float64)
    return np.tanh(f64(x) @ f64(w1) + f64(b1)) @ f64(w2) + f64(b2)


def mse_gradients(x, y, w1, b1, w2, b2):
    """The gradient of mean((mlp(x) - y) ** 2) with respect to (w1, b1, w2, b2), by hand."""
    x, y, w1, b1, w2, b2 = (np.asarray(a, np.float64) for a in (x, y, w1, b1, w2, b2))
    h = np.tanh(x @ w1 + b1)
    d_out = 2.0 * (h @ w2 + b2 - y) / y.size
    d_pre = (d_out @ w2.T) * (1.0 - h**2)
    return x.T @ d_pre, d_pre.sum(axis=0), h.T @ d_out, d_out.sum(axis=0)


def items(got, count, what):
    if got.kind not in ("tuple", "list") or len(got.value) != count:
        raise Mismatch(f"expected a tuple {what}, got {describe(got)}")
    return got.value


X, Y, W = make_case(9)
ON_EVERY_DEVICE = "Build the mesh from all of jax.devices() and return with out_specs=P() after the psum"
SPLIT = "Build the mesh from all of jax.devices() and keep out_specs=P('data')"


@check(got=call("tensor_parallel_mlp", X, *W))
def test_tensor_parallel_equals_the_unsplit_mlp(got):
    expect_close(got, mlp(X, *W), rtol=1e-4, atol=1e-5)


@check(got=call("tensor_parallel_mlp", X, *W))
def test_tensor_parallel_output_is_whole_on_every_device(got, run):
    expect_replicated(got, run.device_count, hint=ON_EVERY_DEVICE)


@check(
    got=call(
        "tensor_parallel_mlp",
        X,
        placed(W[0], (None, "model"), axes=("model",)),
        placed(W[1], ("model",), axes=("model",)),
        placed(W[2], ("model", None), axes=("model",)),
        W[3],
    )
)
def test_tensor_parallel_accepts_weights_already_split(got):
    expect_close(got, mlp(X, *W), rtol=1e-4, atol=1e-5)


@check(got=compiled_call("fsdp_mlp", X, *W))
def test_fsdp_equals_the_unsplit_mlp(got):
    expect_close(got, mlp(X, *W), rtol=1e-4, atol=1e-5)


@check(got=compiled_call("fsdp_mlp", X, *W))
def test_fsdp_splits_the_batch_as_well_as_the_weights(got, run):
    n = run.device_count
    expect_input_split(
        got,
        0,
        n,
        name="x",
        hint="FSDP is data parallelism whose weights are stored in pieces: each device works on its own rows "
        "of x (in_specs=P('data')) with the weights gathered whole for the moment they are used. With x "
        "whole on every device and the weights split by hidden units, the design is tensor parallelism",
    )


@check(got=call("fsdp_mlp", X, *W))
def test_fsdp_output_is_split_by_rows_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=SPLIT)


@check(got=call("fsdp_mlp", placed(X, ("data",)), *(placed(w, ("data",)) for w in W)))
def test_fsdp_accepts_weights_already_in_pieces(got):
    expect_close(got, mlp(X, *W), rtol=1e-4, atol=1e-5)


@check(got=call("fsdp_gradients", X, Y, *W))
def test_fsdp_gradients_equal_the_whole_batch_gradient(got):
    for name, g, want in zip(WEIGHTS, items(got, 4, "(g_w1, g_b1, g_w2, g_b2)"), mse_gradients(X, Y, *W)):
        expect_close(g, want, rtol=1e-4, atol=1e-6, hint=f"(gradient of {name})")


@check(got=call("fsdp_gradients", X, Y, *W))
def test_each_fsdp_gradient_is_split_like_its_weight(got, run):
    for name, g in zip(WEIGHTS, items(got, 4, "(g_w1, g_b1, g_w2, g_b2)")):
        expect_split_across(
            g,
            run.device_count,
            axis=0,
            hint=f"the gradient of {name} should stay in pieces: psum_scatter, out_specs=P('data')",
        )


# ---- fsdp_gradients' traffic: each gradient summed into pieces once, a reduce-scatter's worth -----------------

# Weights of 128 KiB: the TPU compiler sums a small gradient (a few KiB) with an all-reduce of its own choice,
# which would say nothing about the design; at this size both compilers show what it sends. The weights' gathers
# are left out: a compiler may gather a weight again for the backward pass rather than keep it (libtpu does).
XG, YG, WG = make_case(93, batch=64, d_in=128, d_hidden=256, d_out=128)


@check(got=compiled_call("fsdp_gradients", XG, YG, *WG))
def test_fsdp_gradients_are_summed_into_pieces_with_a_reduce_scatters_traffic(got, run):
    n = run.device_count
    if n <= 1:
        return
    budget = sum(bytes_sent("reduce-scatter", w.nbytes // n, n) for w in WG)
    width = lambda c: group_width(c.pairs, c.groups, n)
    summing = [c for c in collectives_of(got) if c.op != "all-gather"]
    sent = sum(bytes_sent(c.op, shape_bytes(c.shape), width(c)) for c in summing)
    if sent > 1.25 * budget:
        listed = "; ".join(f"{c.op} of {c.shape.split('{')[0]}" for c in summing)
        raise Mismatch(
            f"summing the gradients sends {format_bytes(sent)} from each device, where one reduce-scatter of "
            f"each gradient sends {format_bytes(budget)} (up to 1.25 times that passes); it runs {listed}. "
            "Each device needs only its own piece of each gradient: jax.lax.psum_scatter(g, 'data', "
            "scatter_dimension=0, tiled=True) sums and cuts in one step, half the bytes of a psum or pmean "
            "whose whole result is then sliced (the compiled program keeps the all-reduce)"
        )


# ---- fsdp_mlp at a production size: the TPU compiler's program, on the compile-only TPU configurations alone

PRODUCTION = {"batch": 8192, "d_in": 8192, "d_hidden": 32768, "d_out": 8192}  # a large model's MLP, float32


def production_problem(batch, d_in, d_hidden, d_out):
    """fsdp_mlp's inputs by their shapes alone, never made: 2 GiB of weights, 256 MiB of x."""
    return (
        shaped((batch, d_in)),
        shaped((d_in, d_hidden)),
        shaped((d_hidden,)),
        shaped((d_hidden, d_out)),
        shaped((d_out,)),
    )


AT_PRODUCTION_SIZE = production_problem(**PRODUCTION)
PRODUCTION_PRODUCTS = (
    2.0 * PRODUCTION["batch"] * PRODUCTION["d_hidden"] * (PRODUCTION["d_in"] + PRODUCTION["d_out"])
)


@check(got=compiled_call("fsdp_mlp", *AT_PRODUCTION_SIZE))
def test_at_a_production_size_fsdp_fits_each_chip_and_splits_the_work(got, run):
    n = run.device_count
    expect_fits_each_chip(
        got,
        where=f"at a production size (d_model {PRODUCTION['d_in']}, {PRODUCTION['d_hidden']} hidden units, a "
        f"batch of {PRODUCTION['batch']} rows, on {n} chips)",
        what="forward pass",
        hint="Keep every weight in pieces, in_specs=P('data'), and gather each inside, where it is used",
    )
    expect_work_share(
        got,
        PRODUCTION_PRODUCTS,
        n,
        slack=1.5,
        what="the whole batch's forward pass",
        hint="Each device computes only its own slice of the batch: gather the weights, not the batch",
    )


# -- exercise 4: tensor_parallel_scattered -------------------------------------------------------

ROWS_SPLIT = (
    "Each device keeps only its own rows of the summed output, on a mesh over all of jax.devices(): the "
    "output's rows split, not a copy of the whole"
)


def scattered_mistakes(x, w, n):
    return {
        f"b2 was added on each of the {n} devices before the sum, which then counted it {n} times: add b2 "
        f"after the partial outputs are summed": mlp(x, *w) + (n - 1) * np.asarray(w[3], np.float64)
    }


@check(got=call("tensor_parallel_scattered", X, *W))
def test_tensor_parallel_scattered_equals_the_unsplit_mlp(got, run):
    expect_close_naming_mistakes(
        got, mlp(X, *W), scattered_mistakes(X, W, run.device_count), rtol=1e-4, atol=1e-5
    )


@check(got=call("tensor_parallel_scattered", X, *W))
def test_tensor_parallel_scattered_splits_the_rows_of_the_output_across_every_device(got, run):
    expect_split_across(got, run.device_count, axis=0, hint=ROWS_SPLIT)


# -- stretch (not graded: points=0): fsdp_layer_by_layer -------------------------------------------


@check(points=0, got=call("fsdp_layer_by_layer", X, *W))
def test_fsdp_layer_by_layer_equals_the_unsplit_mlp_split_by_rows(got, run):
    expect_close(got, mlp(X, *W), rtol=1e-4, atol=1e-5)
    expect_split_across(got, run.device_count, axis=0, hint=SPLIT)
