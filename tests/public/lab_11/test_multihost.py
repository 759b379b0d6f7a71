"""Lab 11, public tests: one program run by several JAX processes (two of them on cpu-2x4).

The values a test reads are process 0's; `run.each_process(...)` and `run.printed(...)` give
what every process returned and printed, which is where multi-process mistakes show. The step's budget read
from the compiled program (each device on its own rows, the gradients averaged by an all-reduce) is held here
on these inputs, and by the hidden tests on others with the same helper and words.
"""

import numpy as np

from labkit.checks import (
    AsNumpy,
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_collective,
    expect_equal,
    expect_replicated,
    expect_shape,
    expect_split_across,
    expect_work_split,
    placed,
)

# 32 rows: one or more per device on up to 32 devices. A larger pod gets copies, each shifted so that the
# numbering runs on (256 devices: the rows of np.arange(256 * 3).reshape(256, 3)).
ROWS = by_devices(np.arange(32 * 3, dtype=np.float32).reshape(32, 3), shift=96.0)
X = by_devices(ROWS.value / 10, shift=9.6)  # the step's features: ROWS / 10, grown alike
W = np.array([0.5, -1.0, 0.25], dtype=np.float32)  # on every device: the same on every pod
Y = by_devices(np.linspace(-1.0, 1.0, 32, dtype=np.float32), shift=0.25)
LEARNING_RATE = 0.1

WHOLE_BATCH = (
    "each process handed the whole dataset to make_array_from_process_local_data, so the global batch "
    "is process_count times too long: pass only data[start:stop] from process_rows"
)
SAME_ROWS = "use jax.process_index() to pick this process's block: every process is loading the same rows"
PERMUTED = (
    "every row of the dataset is there, but in another order: the mesh's devices are not grouped by process "
    "(jax.devices() need not list each process's devices together), so this process's consecutive rows "
    "went to devices spread over the mesh. Build the mesh from devices_by_process()"
)


def field(got, key):
    """One entry of the dict a function returned, or a Mismatch that says what came back instead."""
    if got.kind != "dict":
        raise Mismatch(f"expected a dict with the key {key!r}, got a {got.kind}")
    if key not in got.value:
        raise Mismatch(f"expected a dict with the key {key!r}, got the keys {sorted(got.value)}")
    return got.value[key]


def blocks(values):
    """[(start, stop), ...] from what process_rows returned in each process."""
    out = []
    for v in values:
        if v.kind not in ("tuple", "list") or len(v.value) != 2 or any(i.kind != "int" for i in v.value):
            raise Mismatch(f"expected a tuple (start, stop) of two ints, got a {v.kind}")
        out.append(tuple(i.value for i in v.value))
    return out


def sgd_step(w, x, y):
    grad = 2.0 / len(y) * x.T @ (x @ w - y)
    return w - LEARNING_RATE * grad


@check(got=call("device_summary"))
def test_device_summary_counts_processes_and_global_devices(got, run):
    expect_equal(field(got, "process_count"), run.process_count)
    expect_equal(
        field(got, "global_devices"),
        run.device_count,
        hint="jax.device_count() counts the devices of every process",
    )


@check(got=call("device_summary"))
def test_local_devices_count_only_this_process(got, run):
    expect_equal(
        field(got, "local_devices"),
        run.device_count // run.process_count,
        hint="len(jax.devices()) counts every process's devices: jax.local_device_count() counts this one's",
    )


@check(summary=call("device_summary"))
def test_each_process_reports_its_own_index(summary, run):
    indices = [field(v, "process_index").value for v in run.each_process(call("device_summary"))]
    if indices != list(range(run.process_count)):
        raise Mismatch(
            f"expected the processes to report indices {list(range(run.process_count))}, "
            f"got {indices}: use jax.process_index(), not a number"
        )


@check(got=call("process_rows", 16))
def test_process_rows_gives_process_0_the_first_block(got, run):
    ((start, stop),) = blocks([got])
    per = 16 // run.process_count
    if (start, stop) != (0, per):
        raise Mismatch(
            f"expected process 0 of {run.process_count} to load rows (0, {per}) of 16, got ({start}, {stop})"
        )


@check(got=call("process_rows", 16))
def test_the_processes_load_disjoint_blocks_that_cover_the_batch(got, run):
    got_blocks = blocks(run.each_process(call("process_rows", 16)))
    per = 16 // run.process_count
    want = [(i * per, (i + 1) * per) for i in range(run.process_count)]
    if got_blocks != want:
        shown = ", ".join(f"process {i} loads rows {a}:{b}" for i, (a, b) in enumerate(got_blocks))
        why = (
            SAME_ROWS
            if len(set(got_blocks)) < len(got_blocks)
            else "split the rows into equal blocks in process order"
        )
        raise Mismatch(f"expected {want}, but {shown}. {why}")


@check(got=call("load_global_batch", AsNumpy(ROWS)))
def test_the_global_batch_has_the_shape_and_values_of_the_dataset(got, run):
    dataset = ROWS.on(run)
    expect_shape(got, dataset.shape, hint=WHOLE_BATCH)
    rows = np.asarray(got.value)
    if not np.array_equal(rows, dataset) and np.array_equal(rows[np.argsort(rows[:, 0])], dataset):
        raise Mismatch(PERMUTED)
    expect_close(got, dataset, hint=SAME_ROWS)


@check(got=call("load_global_batch", AsNumpy(ROWS)))
def test_the_global_batch_is_split_across_every_device(got, run):
    expect_split_across(
        got, run.device_count, axis=0, hint="build the mesh from jax.devices(), every device of the job"
    )


@check(got=call("gather_to_every_host", placed(ROWS, ("data", None))))
def test_gather_returns_the_whole_array_as_numpy(got, run):
    if got.is_jax:
        raise Mismatch(
            "expected a numpy array, got a jax.Array: process_allgather returns numpy; return that"
        )
    expect_close(got, ROWS.on(run))


@check(got=call("gather_to_every_host", placed(ROWS, ("data", None))))
def test_every_process_gets_the_whole_array(got, run):
    for number, value in enumerate(
        run.each_process(call("gather_to_every_host", placed(ROWS, ("data", None))))
    ):
        expect_close(
            value,
            ROWS.on(run),
            hint=f"on process {number}: the shards this process holds are only part of the array, "
            "gather them all with multihost_utils.process_allgather(x, tiled=True)",
        )


@check(got=call("log_progress", 3, 0.25))
def test_the_line_is_printed_once_for_the_whole_job(got, run):
    printed = run.printed(call("log_progress", 3, 0.25))
    if printed[0].strip() != "step 3: loss 0.2500":
        raise Mismatch(
            f"expected process 0 to print 'step 3: loss 0.2500', it printed {printed[0].strip()!r}"
        )
    for number, text in enumerate(printed[1:], start=1):
        if text.strip():
            raise Mismatch(
                f"process {number} printed {text.strip()!r} too: with {run.process_count} processes the log "
                "shows every line that many times. Print only when jax.process_index() == 0"
            )


@check(got=call("data_parallel_step", AsNumpy(W), AsNumpy(X), AsNumpy(Y)))
def test_one_step_matches_gradient_descent_on_the_whole_batch(got, run):
    expect_close(
        got,
        sgd_step(W, X.on(run), Y.on(run)),
        rtol=1e-4,
        atol=1e-5,
        hint="the mean must run over every row of the global batch, each row once: " + SAME_ROWS,
    )


@check(got=call("data_parallel_step", AsNumpy(W), AsNumpy(X), AsNumpy(Y)))
def test_the_new_weights_are_on_every_device(got, run):
    expect_replicated(got, run.device_count, hint="put w on every device with NamedSharding(mesh, P())")


STEP_ON_THE_WHOLE_BATCH = (
    "Every device computes the gradient of the whole batch: that is not data parallelism. Load x and y "
    "with load_global_batch, so that each device holds only its own rows (P('data')), and put only w "
    "on every device (P()); the jitted step then averages the devices' gradients with an all-reduce"
)


def expect_own_rows_and_an_all_reduce(got, n: int, x) -> None:
    """One device's FLOPs well below a step on all of x (its two products), and an all-reduce of the gradient."""
    whole = 2 * (2 * x.shape[0] * x.shape[1])  # the prediction x @ w and the gradient x.T @ residual
    expect_work_split(got, whole, n, what="a step on the whole batch", hint=STEP_ON_THE_WHOLE_BATCH)
    expect_collective(got, "all-reduce", n, hint=STEP_ON_THE_WHOLE_BATCH)


@check(got=compiled_call("data_parallel_step", AsNumpy(W), AsNumpy(X), AsNumpy(Y)))
def test_a_step_computes_only_the_rows_of_each_device_and_averages_with_an_all_reduce(got, run):
    expect_own_rows_and_an_all_reduce(got, run.device_count, X.on(run))


# -- stretch (not graded: points=0): global_mse --------------------------------------------------


def mse(w, x, y) -> float:
    x, y, w = (np.asarray(a, np.float64) for a in (x, y, w))
    return float(np.mean((x @ w - y) ** 2))


def expect_the_whole_datasets_loss_in_every_process(run, c, w, x, y) -> None:
    processes = run.each_process(c)
    per = len(y) // len(processes)
    for number, value in enumerate(processes):
        if value.kind != "float":
            raise Mismatch(
                f"expected a Python float from process {number}, got a {value.kind}: read the replicated "
                "loss with float(loss): a fully replicated array is read from this process's own copy"
            )
        own_rows = mse(w, x[number * per : (number + 1) * per], y[number * per : (number + 1) * per])
        if (
            len(processes) > 1
            and np.isclose(value.value, own_rows, rtol=1e-4)
            and not np.isclose(own_rows, mse(w, x, y), rtol=1e-4)
        ):
            raise Mismatch(
                f"process {number} returned the loss of its own rows only ({value.value:.6g}), and each "
                f"process a different one: compute the mean on the global batch (load_global_batch, then "
                f"a jitted mean), which every process shares"
            )
        expect_close(value, mse(w, x, y), rtol=1e-4, atol=1e-6, hint=f"(on process {number})")


@check(points=0, got=call("global_mse", AsNumpy(W), AsNumpy(X), AsNumpy(Y)))
def test_global_mse_is_the_loss_of_the_whole_dataset_in_every_process(got, run):
    expect_the_whole_datasets_loss_in_every_process(
        run, call("global_mse", AsNumpy(W), AsNumpy(X), AsNumpy(Y)), W, X.on(run), Y.on(run)
    )
