"""Lab 11, hidden tests: other shapes, and the mistakes that only show across processes."""

import numpy as np

from labkit.checks import (
    AsNumpy,
    Mismatch,
    by_devices,
    call,
    check,
    compiled_call,
    expect_close,
    expect_shape,
    placed,
    public_tests,
)

public = public_tests(__file__)  # the public tests' inputs and helpers

# The rows a run splits over every device grow with the pod: 32 of them on 1 to 32 devices, copies on more
RNG = np.random.default_rng(11)
_data = RNG.normal(size=(32, 5)).astype(np.float32)
DATA = by_devices(_data, shift=0.5)
TARGETS = by_devices((_data @ RNG.normal(size=5) + 0.1 * RNG.normal(size=32)).astype(np.float32), shift=0.5)
W0 = RNG.normal(size=5).astype(np.float32)  # on every device: the same on every pod
VECTOR = by_devices(RNG.normal(size=32).astype(np.float32), shift=0.5)


def sgd_step(w, x, y, lr=0.1):
    return w - lr * 2.0 / len(y) * x.T @ (x @ w - y)


@check(got=call("process_rows", 32))
def test_rows_of_a_larger_batch_are_split_between_the_processes(got, run):
    got_blocks = []
    for v in run.each_process(call("process_rows", 32)):
        got_blocks.append(tuple(i.value for i in v.value) if v.kind in ("tuple", "list") else v.value)
    per = 32 // run.process_count
    want = [(i * per, (i + 1) * per) for i in range(run.process_count)]
    if got_blocks != want:
        raise Mismatch(
            f"expected the processes to load {want}, got {got_blocks}: each process loads only its own "
            "block, picked with jax.process_index()"
        )


@check(got=call("load_global_batch", AsNumpy(DATA)))
def test_each_process_contributes_only_its_rows(got, run):
    for number, value in enumerate(run.each_process(call("load_global_batch", AsNumpy(DATA)))):
        expect_shape(
            value,
            DATA.on(run).shape,
            hint=f"on process {number}: a batch of {run.process_count} times the rows means "
            "every process passed the whole dataset, not its own rows",
        )
        expect_close(value, DATA.on(run))


@check(got=call("load_global_batch", AsNumpy(TARGETS)))
def test_a_one_dimensional_batch_loads_too(got, run):
    expect_close(got, TARGETS.on(run))


@check(got=call("gather_to_every_host", placed(VECTOR, ("data",))))
def test_gather_reads_shards_that_live_on_other_processes(got, run):
    for number, value in enumerate(run.each_process(call("gather_to_every_host", placed(VECTOR, ("data",))))):
        expect_close(
            value,
            VECTOR.on(run),
            hint=f"on process {number}: np.asarray(x) or x.addressable_shards only see this "
            "process's shards; multihost_utils.process_allgather(x, tiled=True) sees all",
        )


@check(got=call("log_progress", 12, 1 / 3))
def test_only_process_0_prints(got, run):
    printed = [t.strip() for t in run.printed(call("log_progress", 12, 1 / 3))]
    want = ["step 12: loss 0.3333"] + [""] * (run.process_count - 1)
    if printed != want:
        raise Mismatch(
            f"expected the processes to print {want}, they printed {printed}: guard the print with "
            "`if jax.process_index() == 0:`"
        )


@check(got=call("data_parallel_step", AsNumpy(W0), AsNumpy(DATA), AsNumpy(TARGETS)))
def test_a_step_on_unseen_data_uses_every_row_once(got, run):
    expect_close(
        got,
        sgd_step(W0, DATA.on(run), TARGETS.on(run)),
        rtol=1e-4,
        atol=1e-5,
        hint="the gradient must average over all rows of every process: when every process loads the same "
        "block the step sees only part of the batch",
    )


@check(got=call("data_parallel_step", AsNumpy(W0), AsNumpy(DATA), AsNumpy(TARGETS)))
def test_every_process_ends_the_step_with_the_same_weights(got, run):
    for number, value in enumerate(
        run.each_process(call("data_parallel_step", AsNumpy(W0), AsNumpy(DATA), AsNumpy(TARGETS)))
    ):
        expect_close(
            value,
            sgd_step(W0, DATA.on(run), TARGETS.on(run)),
            rtol=1e-4,
            atol=1e-5,
            hint=f"on process {number}",
        )


@check(got=compiled_call("data_parallel_step", AsNumpy(W0), AsNumpy(DATA), AsNumpy(TARGETS)))
def test_a_step_gives_each_device_only_its_own_rows_of_the_batch(got, run):
    public.expect_own_rows_and_an_all_reduce(got, run.device_count, DATA.on(run))  # the public test's budget


# Stretch (not graded: points=0): the loss of a larger dataset, which each process must see whole.
_many_rows = RNG.normal(size=(64, 5)).astype(np.float32)
MANY_ROWS = by_devices(_many_rows, shift=0.5)
MANY_TARGETS = by_devices((_many_rows @ W0 + RNG.normal(size=64)).astype(np.float32), shift=0.5)


@check(points=0, got=call("global_mse", AsNumpy(W0), AsNumpy(MANY_ROWS), AsNumpy(MANY_TARGETS)))
def test_global_mse_of_a_larger_dataset(got, run):
    public.expect_the_whole_datasets_loss_in_every_process(
        run,
        call("global_mse", AsNumpy(W0), AsNumpy(MANY_ROWS), AsNumpy(MANY_TARGETS)),
        W0,
        MANY_ROWS.on(run),
        MANY_TARGETS.on(run),
    )
