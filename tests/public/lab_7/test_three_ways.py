"""Lab 7, public tests: the sigmoid layer as jit on sharded inputs, with sharding constraints, and with
shard_map plus psum; each right, each a full copy on every device, and all three equal; and the layer of a batch
on a grid, in the design the student chose, with its rows split over every device. The budgets read from the
compiled program (x and w split and an all-reduce for the three ways; the grid's collectives, share of the
products and x never whole) are held here on these inputs, and by the hidden tests on others with the same
helpers and words."""

import numpy as np

from labkit.checks import (
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_close_naming_mistakes,
    expect_collective,
    expect_collectives_within,
    expect_dtype,
    expect_held_below,
    expect_input_split,
    expect_replicated,
    expect_sent_within,
    expect_shape,
    expect_work_share,
    placed,
)

# d = 32 divides by 1 to 32 devices; a larger pod gets copies of x and of w's rows, each shifted a little (on
# 256 devices: d = 256, the shifts small enough that the sigmoid does not saturate)
X = by_devices(np.linspace(-1.0, 1.0, 32, dtype=np.float32), shift=1 / 32)
W = by_devices((np.arange(32 * 4, dtype=np.float32).reshape(32, 4) % 7 - 3.0) / 4, shift=-1 / 64)
B = np.array([0.5, -0.25, 0.0, 1.0], dtype=np.float32)  # on every device: the same on every pod


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def layer(x, w, b):
    return sigmoid(x.astype(np.float64) @ w.astype(np.float64) + b)


def shard_map_mistakes(x, w, b, n):
    """What the per-device program gives on n devices when the psum is missing or in the wrong place."""
    xs, ws = np.split(x.astype(np.float64), n), np.split(w.astype(np.float64), n)
    partial = [xi @ wi for xi, wi in zip(xs, ws)]
    return {
        f"That is device 0's partial product alone, as if there were no other devices: add the {n} partial "
        "products with jax.lax.psum(x_block @ w_block, 'data') before the bias and the sigmoid "
        "(check_vma=False lets a missing psum through)": sigmoid(partial[0] + b),
        "The sigmoid was applied before the psum, so the result adds up one sigmoid per device: psum the partial "
        "products first, then add b and apply the sigmoid": sum(sigmoid(p + b) for p in partial),
        f"b was added on every device before the psum, so it counts {n} times: add b after the psum": sigmoid(
            sum(partial) + n * b
        ),
    }


PLACE = (
    "jit on arrays that live on one device runs on that device: put x and w on a mesh of every device "
    "with jax.device_put(..., NamedSharding(mesh, P('data'))) and P('data', None) before calling it"
)
CONSTRAIN = (
    "Constrain x and w inside the jitted function with jax.lax.with_sharding_constraint, using "
    "NamedShardings over a mesh built from jax.devices()"
)
REPLICATE = "After the psum every device holds the result: out_specs=P(), on a mesh built from jax.devices()"


@check(got=call("layer_jit", X, W, B))
def test_jit_computes_the_layer(got, run):
    expect_close(got, layer(X.on(run), W.on(run), B), atol=1e-6)


@check(got=call("layer_jit", X, W, B))
def test_jit_result_is_a_full_copy_on_every_device(got, run):
    expect_shape(got, (4,))
    expect_dtype(got, "float32")
    expect_replicated(got, run.device_count, hint=PLACE)


@check(got=call("layer_constrained", X, W, B))
def test_constrained_computes_the_layer(got, run):
    expect_close(got, layer(X.on(run), W.on(run), B), atol=1e-6)


@check(got=call("layer_constrained", X, W, B))
def test_constrained_result_is_a_full_copy_on_every_device(got, run):
    expect_shape(got, (4,))
    expect_replicated(got, run.device_count, hint=CONSTRAIN)


@check(got=compiled_call("layer_shard_map", X, W, B))
def test_shard_map_computes_the_layer(got, run):
    x, w = X.on(run), W.on(run)
    expect_close_naming_mistakes(
        got, layer(x, w, B), shard_map_mistakes(x, w, B, run.device_count), atol=1e-6
    )


@check(got=call("layer_shard_map", X, W, B))
def test_shard_map_result_is_a_full_copy_on_every_device(got, run):
    expect_shape(got, (4,), hint="psum the (f,) partial products; do not stack them")
    expect_replicated(got, run.device_count, hint=REPLICATE)


# -- the three ways held to the split: x and w in slices, the partial products added by an all-reduce --------

SPLIT_THE_LAYER = {
    "layer_jit": "Every device computes the whole layer. Place x with NamedSharding(mesh, P('data')) and w with "
    "P('data', None), so that each device multiplies its own slice and the compiler adds the pieces",
    "layer_constrained": "Every device computes the whole layer. Constrain x to P('data') and w to P('data', None) "
    "inside the jitted function, so that each device multiplies its own slice",
    "layer_shard_map": "Every device computes the whole layer. Give x in_specs=P('data') and w P('data', None), "
    "and add the devices' partial products with jax.lax.psum(..., 'data')",
}


def expect_layer_split(got, n, exercise):
    """Each device holds 1/n of x and of w, and the compiled program all-reduces the partial products."""
    hint = SPLIT_THE_LAYER[exercise]
    expect_input_split(got, 0, n, name="x", hint=hint)
    expect_input_split(got, 1, n, name="w", hint=hint)
    expect_collective(
        got, "all-reduce", n, hint="The partial products x_i @ w_i of the devices must be added up"
    )


@check(got=compiled_call("layer_jit", X, W, B))
def test_layer_jit_gives_each_device_a_slice_of_x_and_w_and_all_reduces(got, run):
    expect_layer_split(got, run.device_count, "layer_jit")


@check(got=compiled_call("layer_constrained", X, W, B))
def test_layer_constrained_gives_each_device_a_slice_of_x_and_w_and_all_reduces(got, run):
    expect_layer_split(got, run.device_count, "layer_constrained")


@check(got=compiled_call("layer_shard_map", X, W, B))
def test_layer_shard_map_gives_each_device_a_slice_of_x_and_w_and_all_reduces(got, run):
    expect_layer_split(got, run.device_count, "layer_shard_map")


# -- exercise 4: layer_grid, a batch on a ('data', 'model') grid, designed by the student ----------

# B = 64, d = 32: multiples of n up to 32. A larger pod gets copies of x's rows (its result's rows are split over
# every device) and of its columns with w's rows (a 2 x 128 grid splits d by 128): B = d = 256 on 256 devices.
XG = by_devices(np.linspace(-1.0, 1.0, 64 * 32, dtype=np.float32).reshape(64, 32), shift=1 / 64, axis=(0, 1))
WG = by_devices((np.arange(32 * 8, dtype=np.float32).reshape(32, 8) % 5 - 2.0) / 8, shift=1 / 128)
BG = np.linspace(-0.5, 0.5, 8, dtype=np.float32)
GRID = (2, -1)  # 2 x 4 on eight devices, 1 x 1 on one: the grid of the exercise


def grid_shape(n: int) -> tuple[int, int]:
    """The exercise's grid: (2, n // 2) when n is even, else (1, n)."""
    return (2, n // 2) if n % 2 == 0 else (1, n)


def tiled(x):
    """x as the tests hand it over: cut into tiles P('data', 'model') on the grid."""
    return placed(x, ("data", "model"), axes=("data", "model"), mesh_shape=GRID)


def grid_mistakes(x, w, b, n):
    """What layer_grid gives on n devices when its partial products are added over the wrong axis, or not at all."""
    a, m = grid_shape(n)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    rows, feats, mine = x.shape[0] // a, x.shape[1] // m, x.shape[0] // n
    partial = [
        [
            x64[i * rows : (i + 1) * rows, j * feats : (j + 1) * feats] @ w64[j * feats : (j + 1) * feats]
            for j in range(m)
        ]
        for i in range(a)
    ]
    over_data = np.concatenate(
        [sum(partial[i][j] for i in range(a))[j * mine : (j + 1) * mine] for i in range(a) for j in range(m)]
    )
    no_sum = np.concatenate([partial[i][j][j * mine : (j + 1) * mine] for i in range(a) for j in range(m)])
    return {
        "The partial products were added over 'data', whose devices hold different examples, so each row mixes "
        "two examples: add them over 'model', the axis along which one example's features are spread": sigmoid(
            over_data + b
        ),
        f"Each row used only 1/{m} of its features, those of the tile its device holds: the partial products of "
        "one example must be added up over 'model' (or its features brought together first)": sigmoid(
            no_sum + b
        ),
    }


def expect_rows_split_over_every_device(got, n: int) -> None:
    """A (B, f) result in P(('data', 'model'), None): n blocks of whole rows, one per device, in order."""
    sh = got.sharding
    if sh is None:
        raise Mismatch("expected a JAX array placed on devices, got a plain (numpy or Python) value")
    blocks = sorted(tuple(map(tuple, s["index"])) for s in sh.shards)
    want = [((k * got.shape[0] // n, (k + 1) * got.shape[0] // n), (0, got.shape[1])) for k in range(n)]
    if sh.num_devices != n or blocks != want:
        raise Mismatch(
            f"expected the rows split over all {n} devices, {got.shape[0] // n} whole rows on each and no two devices "
            f"holding the same rows; got {sh.describe()}. Return with out_specs=P(('data', 'model'), None) on the "
            "('data', 'model') grid of all of jax.devices()"
        )


@check(got=compiled_call("layer_grid", tiled(XG), WG, BG))
def test_layer_grid_computes_the_layer_of_every_row(got, run):
    x, w = XG.on(run), WG.on(run)
    want = sigmoid(x.astype(np.float64) @ w.astype(np.float64) + BG)
    expect_shape(got, want.shape, hint="one row of the result per row of x, f columns")
    expect_close_naming_mistakes(got, want, grid_mistakes(x, w, BG, run.device_count), rtol=1e-5, atol=1e-6)


@check(got=call("layer_grid", tiled(XG), WG, BG))
def test_layer_grid_leaves_its_rows_split_over_every_device(got, run):
    expect_rows_split_over_every_device(got, run.device_count)


# -- stretch (not graded: points=0): layer_grid_w_in_pieces, the same contract with w in pieces -----


@check(points=0, got=call("layer_grid_w_in_pieces", tiled(XG), WG, BG))
def test_layer_grid_w_in_pieces_computes_the_layer_of_every_row(got, run):
    x, w = XG.on(run), WG.on(run)
    want = sigmoid(x.astype(np.float64) @ w.astype(np.float64) + BG)
    expect_close_naming_mistakes(got, want, grid_mistakes(x, w, BG, run.device_count), rtol=1e-5, atol=1e-6)
    expect_rows_split_over_every_device(got, run.device_count)


# layer_grid's budget, on a layer that narrows (d = 64 features to f = 16): x is 32 KiB, w 4 KiB, a tile of x
# 4 KiB on eight devices, so that x whole on a device stands out. On 256 devices, copies: x 256 x 256, w 256 x 16.
XH = by_devices(
    np.linspace(-1.0, 1.0, 128 * 64, dtype=np.float32).reshape(128, 64), shift=1 / 64, axis=(0, 1)
)
WH = by_devices((np.arange(64 * 16, dtype=np.float32).reshape(64, 16) % 9 - 4.0) / 16, shift=1 / 128)
BH = np.linspace(-0.25, 0.25, 16, dtype=np.float32)
WIDE_GRID_CALL = compiled_call("layer_grid", tiled(XH), WH, BH)


def grid_rows(n: int) -> list[set[int]]:
    """The devices of each grid row (the program numbers them in the grid's order, row after row)."""
    a, m = grid_shape(n)
    return [set(range(i * m, (i + 1) * m)) for i in range(a)]


def expect_over_model_only(got, n: int) -> None:
    """Every collective joins devices of one grid row: it runs over 'model'."""
    grid = " x ".join(map(str, grid_shape(n)))
    expect_collectives_within(
        got,
        grid_rows(n),
        allowed=f"inside one row of the {grid} grid, over 'model',",
        hint="That collective runs over 'data', between devices that hold different examples. One example's "
        "features are spread over the devices of one grid row, so everything its row of the result needs can "
        "be brought together, or added up, over 'model'. (A jax.reshard or in_specs that copies x whole to "
        "every device makes such a collective too)",
    )


def expect_a_share_of_the_products(got, n: int, x, w) -> None:
    """One device's FLOPs within 1.5 times its 1/n share of x @ w."""
    expect_work_share(
        got,
        2.0 * x.shape[0] * w.size,
        n,
        what="x @ w for the whole batch",
        hint="Each device should multiply only numbers no other device multiplies: its own rows with "
        "all their features, or its own tile with the matching rows of w",
    )


def expect_x_never_whole(got, n: int, x) -> None:
    """x stays in its tiles, and no device holds all of it (on a TPU: receives the others' tiles of it)."""
    expect_input_split(got, 0, n, name="x", hint="Leave x in its tiles, P('data', 'model'), as it arrives")
    if n > 1 and getattr(got.compiled, "compiled_for", None):
        # A TPU lays every array out in tiles of 8 x 128: x's 64 features, and each small block of rows, are
        # padded several times over, so its memory cannot tell x whole from padded pieces. A device that held all
        # of x would have received the other devices' tiles of it, (n - 1)/n of x: that is judged there instead.
        expect_sent_within(
            got,
            (n - 1) / n * x.nbytes,
            n,
            margin=0.99,
            what="every other device's tiles of x, which a device holding all of x must receive",
            hint="Leave x in its tiles and move only what each device needs: its share of the rows, "
            "or partial products",
        )
    elif n > 1:
        expect_held_below(
            got,
            x.nbytes,
            what="all of x: no device may hold the whole matrix",
            hint="Leave x in its tiles and move only what each device needs: its share of the rows, "
            "or partial products",
        )


@check(got=WIDE_GRID_CALL)
def test_layer_grid_sends_only_within_a_row_of_the_grid(got, run):
    expect_over_model_only(got, run.device_count)


@check(got=WIDE_GRID_CALL)
def test_layer_grid_multiplies_only_its_share_of_the_products(got, run):
    expect_a_share_of_the_products(got, run.device_count, XH.on(run), WH.on(run))


@check(got=WIDE_GRID_CALL)
def test_layer_grid_keeps_x_in_its_tiles(got, run):
    expect_x_never_whole(got, run.device_count, XH.on(run))


def expect_w_in_pieces_within_the_grid_budget(got, n: int, x, w) -> None:
    """The stretch: 1/m of w on each device, collectives over 'model' only, and a share of the products."""
    _, m = grid_shape(n)
    expect_input_split(
        got,
        1,
        m,
        name="w",
        hint=f"Each device may hold 1/{m} of w, its share along 'model': a "
        "design that needs all of w on every device does not fit here",
    )
    expect_collectives_within(got, grid_rows(n), allowed="over 'model'")
    expect_work_share(got, 2.0 * x.shape[0] * w.size, n, what="x @ w for the whole batch")


@check(points=0, got=compiled_call("layer_grid_w_in_pieces", tiled(XH), WH, BH))
def test_layer_grid_w_in_pieces_holds_its_share_of_w_within_the_grid_budget(got, run):
    expect_w_in_pieces_within_the_grid_budget(got, run.device_count, XH.on(run), WH.on(run))
