"""Lab 14, hidden tests: the step on a new batch, the two budgets (which the public tests hold on their own batch,
written in the public module) and the work each device does, read from the compiled program.

Any design may pass: the tests hold it to what the notebook states, never to a plan. The memory
budget: between steps each device keeps at most 2/n of the training state (parameters and
momentum, as they arrive and as they leave), read from the shardings the compiled program gives its
inputs and outputs. The communication budget: each device sends at most 4 (n-1)/n of the
bytes of the parameters and the loss, twice the one all-reduce of the gradient and the loss that plain data
parallelism sends,
counted as rings as the cost card counts them. Both are computed from the problem's sizes; on one
device every design keeps the whole state and sends nothing, and both hold.
"""

from labkit.checks import check, compiled_call, public_tests

public = public_tests(__file__)  # the public tests' inputs and helpers

# its model dimension grows with the pod, as the public tests' problems do
PROBLEM = public.by_the_pod(public.make_problem(41, batch=32, seq=4))
STEP = compiled_call("train_step", *PROBLEM)


@check(got=STEP)
def test_train_step_equals_the_one_device_step_on_a_longer_batch(got, run):
    public.expect_the_one_device_step(got, public.on(PROBLEM, run))


@check(got=STEP)
def test_each_device_keeps_within_the_memory_budget(got, run):
    public.expect_within_the_memory_budget(got, run.device_count, public.on(PROBLEM, run))


@check(got=STEP)
def test_each_device_sends_within_the_communication_budget(got, run):
    public.expect_within_the_communication_budget(got, run.device_count, public.on(PROBLEM, run))


@check(got=STEP)
def test_each_device_does_its_share_of_the_work(got, run):
    # the public work budget's words; up to three times a share here, where this small batch's work around the
    # products is a larger part of the step (the public test holds 1.3 times on its wider batch)
    problem = public.on(PROBLEM, run)
    public.expect_a_share_of_the_work(
        got, run.device_count, problem, public.one_device_step(*problem, flops=True), slack=3.0
    )
