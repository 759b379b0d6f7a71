"""Lab 14, hidden tests: the step on a new batch, and the two budgets, read from the compiled program.

Any design may pass: the tests hold it to what the notebook states, never to a plan. The memory
budget: between steps each device keeps at most 2/n of the training state (parameters and
momentum, as they arrive and as they leave), read from the shardings the compiled program gives its
inputs and outputs. The communication budget: each device sends at most 4 (n-1)/n of the
parameters' bytes, twice the one all-reduce of the gradient that plain data parallelism sends,
counted as rings as the cost card counts them. Both are computed from the problem's sizes; on one
device every design keeps the whole state and sends nothing, and both hold.
"""

import importlib.util
from pathlib import Path

from labkit.checks import FactUnavailable, Mismatch, check, compiled_call, sent_per_device
from labkit.cost import bytes_sent, format_bytes

_spec = importlib.util.spec_from_file_location(
    "lab14_public_for_hidden", Path(__file__).resolve().parents[2] / "public" / "lab_14" / "test_training_step.py")
public = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(public)

PROBLEM = public.make_problem(41, batch=32, seq=4)
PARAMETER_BYTES = sum(w.nbytes for w in PROBLEM[0].values())
STATE_BYTES = 2 * PARAMETER_BYTES  # the parameters and their momentum
STEP = compiled_call("train_step", *PROBLEM)


def state_kept(got, side: str) -> tuple[int, list[str]]:
    """Bytes of the training state one device keeps on one side of the step ("arguments": as it arrives,
    "outputs": as it leaves), and the arrays every device holds whole."""
    facts = got.compiled
    if facts is None or not hasattr(facts, "inputs"):
        raise FactUnavailable(f"the compiled program could not be examined ({getattr(facts, 'why', facts)})")
    placements = facts.inputs if side == "arguments" else facts.outputs
    if not isinstance(placements, tuple):
        raise FactUnavailable(f"this check cannot be made here: {placements.why}")
    prefixes = ("args[0]", "args[1]") if side == "arguments" else ("out[0]", "out[1]")
    state = [p for p in placements if p.path.startswith(prefixes)]
    if len(state) != 2 * len(public.WEIGHTS):
        raise FactUnavailable(f"the compiled program's {side} do not hold the twelve arrays of the state "
                              f"({', '.join(p.path for p in placements)})")
    for p in state:
        if not isinstance(p.device_bytes, int):
            raise FactUnavailable(f"this check cannot be made here: {p.device_bytes.why}")
    whole = [p.path.replace("args[0]", "params").replace("args[1]", "momentum").replace("out[0]", "params")
             .replace("out[1]", "momentum") for p in state if p.device_bytes >= p.bytes]
    return sum(p.device_bytes for p in state), whole


@check(got=STEP)
def test_train_step_equals_the_one_device_step_on_a_longer_batch(got):
    public.expect_the_one_device_step(got, PROBLEM)


@check(got=STEP)
def test_each_device_keeps_within_the_memory_budget(got, run):
    n = run.device_count
    budget = 2 * STATE_BYTES / n
    for side, when in (("arguments", "as it arrives"), ("outputs", "as it leaves the step")):
        kept, whole = state_kept(got, side)
        if kept > budget:
            copied = f"; every device holds all of {', '.join(whole)}" if whole else ""
            raise Mismatch(f"over the memory budget: each device keeps {format_bytes(kept)} of the training state "
                           f"{when}, where the budget is {format_bytes(budget)}, 2/{n} of the "
                           f"{format_bytes(STATE_BYTES)} of the parameters and their momentum (the state may "
                           f"exist at most twice over the grid){copied}. Split what is copied: the parameters, the "
                           f"momentum, or both")


@check(got=STEP)
def test_each_device_sends_within_the_communication_budget(got, run):
    n = run.device_count
    budget = 2 * bytes_sent("all-reduce", PARAMETER_BYTES, n)
    sent = sent_per_device(got)
    if sent > budget:
        raise Mismatch(f"over the communication budget: each device sends {format_bytes(sent)} in one step, where "
                       f"the budget is {format_bytes(budget)}, 4 ({n}-1)/{n} of the {format_bytes(PARAMETER_BYTES)} "
                       f"of the parameters (twice the all-reduce of the gradient that plain data parallelism "
                       f"sends). Run cost_of on your program: which collective runs more often, or moves more, "
                       f"than the step needs?")
