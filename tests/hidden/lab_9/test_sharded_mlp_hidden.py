"""Lab 9, hidden tests: new shapes, and the mistakes that one device cannot show.

On one device a bias added before the psum is added once, a psum_scatter's sum is a mean, and
device 0's partial output is the whole output. On eight none of that holds. Nor can a solution
that keeps every weight whole on every device pass for tensor parallelism or FSDP: the compiled
program says what each device stores, computes and sends. The tests hold each design to those
properties, not to one plan: tensor parallelism may add its partial outputs with a psum, or with a
reduce-scatter and an all-gather; what counts is the weights split, the work split, and the bytes
each device sends (counted as rings, as the cost card counts them).
"""

import numpy as np

from labkit.checks import (
    Mismatch,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_split_across,
    public_tests,
)

public = public_tests(__file__)  # the public tests' inputs and helpers
WEIGHTS, items, mlp, mse_gradients = public.WEIGHTS, public.items, public.mlp, public.mse_gradients
got_by = public.got_by  # the inputs as a run got them: grown with the pod where by_devices says so

# Each case is sized for pods of up to 32 devices and grows with a larger pod as the public tests' do: every axis
# for FSDP, the hidden units alone for tensor parallelism.
X, Y, W = public.for_every_pod(*public.make_case(90, batch=64, d_in=32, d_hidden=64, d_out=32))
TX, TW = public.hidden_layer_for_every_pod(*public.make_case(90, batch=64, d_in=32, d_hidden=64, d_out=32))


def close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-5)


@check(got=call("tensor_parallel_mlp", TX, *TW))
def test_tensor_parallel_adds_the_output_bias_once_not_once_per_device(got, run):
    n = run.device_count
    x, *w = got_by(run, TX, *TW)
    want = mlp(x, *w)
    if n > 1 and close(got.value, want + (n - 1) * w[3]):
        raise Mismatch(
            f"the output is the MLP's plus {n - 1} extra copies of b2: b2 was added on each of the {n} "
            f"devices before the psum, which then summed {n} copies of it. Add b2 once, after "
            f"jax.lax.psum(h @ w2, 'model')"
        )
    expect_close(got, want, rtol=1e-4, atol=1e-5)


@check(got=call("tensor_parallel_mlp", TX, *TW))
def test_tensor_parallel_sums_the_partial_outputs_of_every_device(got, run):
    n = run.device_count
    x, w1, b1, w2, b2 = (np.asarray(a, np.float64) for a in got_by(run, TX, *TW))
    k = w1.shape[1] // n
    device_0 = np.tanh(x @ w1[:, :k] + b1[:k]) @ w2[:k] + b2
    if n > 1 and close(got.value, device_0):
        raise Mismatch(
            f"the output is device 0's partial output alone, from 1/{n} of the hidden units: the "
            f"partial outputs were never added up. Did you leave out jax.lax.psum over 'model'? "
            f"check_vma=False lets out_specs=P() keep device 0's value without a word"
        )
    expect_close(got, mlp(x, w1, b1, w2, b2), rtol=1e-4, atol=1e-5)


@check(got=call("fsdp_mlp", X, *W))
def test_fsdp_equals_the_unsplit_mlp_on_a_wider_layer(got, run):
    expect_close(got, mlp(*got_by(run, X, *W)), rtol=1e-4, atol=1e-5)
    expect_split_across(got, run.device_count, axis=0)


@check(got=call("fsdp_gradients", X, Y, *W))
def test_fsdp_gradient_is_the_mean_of_the_devices_gradients_not_their_sum(got, run):
    n = run.device_count
    wants = mse_gradients(*got_by(run, X, Y, *W))
    for name, g, want in zip(WEIGHTS, items(got, 4, "(g_w1, g_b1, g_w2, g_b2)"), wants):
        if n > 1 and close(g.value, n * want):
            raise Mismatch(
                f"the gradient of {name} is {n} times the whole batch's: psum_scatter adds up the {n} "
                f"devices' gradients, and the loss is a mean over the batch. Divide by the number of "
                f"devices, jax.lax.axis_size('data')"
            )
        expect_close(g, want, rtol=1e-4, atol=1e-6, hint=f"(gradient of {name})")


@check(got=call("fsdp_gradients", X, Y, *W))
def test_fsdp_gradient_combines_the_slices_of_the_batch_from_every_device(got, run):
    n = run.device_count
    x, y, *w = got_by(run, X, Y, *W)
    b = len(x) // n
    local = [mse_gradients(x[i * b : (i + 1) * b], y[i * b : (i + 1) * b], *w) for i in range(n)]
    for j, (name, g) in enumerate(zip(WEIGHTS, items(got, 4, "(g_w1, g_b1, g_w2, g_b2)"))):
        rows = len(local[0][j]) // n
        own_piece_only = np.concatenate([local[i][j][i * rows : (i + 1) * rows] for i in range(n)])
        if n > 1 and close(g.value, own_piece_only):
            raise Mismatch(
                f"each device's piece of the gradient of {name} comes from its own slice of the batch "
                f"only: the devices' gradients were cut into pieces but never summed. "
                f"jax.lax.psum_scatter(g, 'data', scatter_dimension=0, tiled=True) sums and cuts in one "
                f"step"
            )
        expect_close(g, mse_gradients(x, y, *w)[j], rtol=1e-4, atol=1e-6, hint=f"(gradient of {name})")


def products(run, x, w) -> float:
    """The FLOPs of x @ w1 and h @ w2 for the whole batch, on the inputs `run` got."""
    x, *w = got_by(run, x, *w)
    return public.products(x, w)


def output_bytes(run, x, w) -> int:
    x, *w = got_by(run, x, *w)
    return len(x) * w[2].shape[1] * 4


# Each budget below is the public tests' own, with their helpers (and words), on other inputs.

FSDP_CALL = compiled_call("fsdp_mlp", X, *W)


@check(got=FSDP_CALL)
def test_fsdp_mlp_stores_each_weight_in_pieces_one_per_device(got, run):
    public.expect_weights_in_pieces(got, run.device_count)


@check(got=FSDP_CALL)
def test_fsdp_mlp_splits_the_batch_and_its_work(got, run):
    public.expect_own_rows_only(got, run.device_count, products(run, X, W), "the whole batch's forward pass")


TENSOR_CALL = compiled_call("tensor_parallel_mlp", TX, *TW)


@check(got=TENSOR_CALL)
def test_tensor_parallel_mlp_splits_the_hidden_layer_and_its_work(got, run):
    public.expect_hidden_layer_split(got, run.device_count, products(run, TX, TW))


@check(got=TENSOR_CALL)
def test_tensor_parallel_mlp_sends_no_more_than_one_sum_of_the_output(got, run):
    public.expect_one_sum_of_the_output(got, run.device_count, output_bytes(run, TX, TW))


GRADIENTS_CALL = compiled_call("fsdp_gradients", X, Y, *W)


@check(got=GRADIENTS_CALL)
def test_fsdp_gradients_split_the_batch_and_its_work(got, run):
    # the backward pass costs two products for each of the forward pass's
    public.expect_own_rows_only(
        got, run.device_count, 3 * products(run, X, W), "the whole batch's forward and backward passes"
    )


@check(got=GRADIENTS_CALL)
def test_fsdp_gradients_keep_weights_and_gradients_in_pieces(got, run):
    public.expect_gradients_in_pieces(got, run.device_count)


# -- exercise 4: tensor_parallel_scattered, held to its budget ---------------------------------

# An output of 128 KiB, as the public tests' (the TPU compiler sums a small one with an all-reduce of its own).
# Its 256 rows divide over every pod's devices; the hidden units grow with a larger pod.
XS, WS = public.hidden_layer_for_every_pod(*public.make_case(92, batch=256, d_in=32, d_hidden=64, d_out=128))
SCATTERED_CALL = compiled_call("tensor_parallel_scattered", XS, *WS)


@check(got=SCATTERED_CALL)
def test_tensor_parallel_scattered_on_a_wider_layer(got, run):
    n = run.device_count
    x, *w = got_by(run, XS, *WS)
    expect_close_naming_mistakes(got, mlp(x, *w), public.scattered_mistakes(x, w, n), rtol=1e-4, atol=1e-5)
    expect_split_across(got, n, axis=0, hint=public.ROWS_SPLIT)


@check(got=SCATTERED_CALL)
def test_tensor_parallel_scattered_splits_the_hidden_layer_and_its_work(got, run):
    x, *w = got_by(run, XS, *WS)
    public.expect_hidden_layer_split(got, run.device_count, public.products(x, w))


@check(got=SCATTERED_CALL)
def test_tensor_parallel_scattered_sends_only_its_share_of_the_output(got, run):
    x, *w = got_by(run, XS, *WS)
    public.expect_a_share_of_the_output_sent(got, run.device_count, len(x) * w[2].shape[1] * 4)


@check(got=SCATTERED_CALL)
def test_tensor_parallel_scattered_moves_partial_outputs_never_weights(got, run):
    public.expect_no_weight_gathered(got, run.device_count)


# -- stretch (not graded: points=0): fsdp_layer_by_layer ------------------------------------------

# weights of 64 KiB each (on up to 32 devices)
XW, _, WW = public.for_every_pod(*public.make_case(91, batch=64, d_in=128, d_hidden=128, d_out=128))


@check(points=0, got=compiled_call("fsdp_layer_by_layer", XW, *WW))
def test_fsdp_layer_by_layer_never_holds_both_layers_whole(got, run):
    n = run.device_count
    x, *w = got_by(run, XW, *WW)
    expect_close(got, mlp(x, *w), rtol=1e-4, atol=1e-5)
    expect_split_across(got, n, axis=0)
    public.expect_one_layer_whole_at_a_time(got, n, w)
