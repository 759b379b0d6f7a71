"""Expectations on the compiled program of an examined call: judge the parallelism, not only the answer.

Each reads the facts the kit took from the program (collectives, inputs' placements, FLOPs, memory per
device) and fails with a message for students; a fact that did not come back fails, saying why
(`FactUnavailable`). Lab tests import them from `labkit.checks`.
"""

from __future__ import annotations

import collections

from labkit import cost
from labkit.judge import budgets, hloparse, plaindata
from labkit.judge.outcomes import Mismatch, with_hint


class FactUnavailable(Mismatch):
    """A check needs a fact of the compiled program that did not come back: it fails, saying why."""


TRACEABLE = (
    "The checks of parallelism read the compiled program of your function: it must run under jax.jit "
    "(no float(), np.asarray() or Python `if` on array values computed inside it)"
)


def collectives_of(got: plaindata.Value) -> tuple:
    """The collectives of the call's compiled program, each once per run, or FactUnavailable with the reason."""
    return _compiled(got, "collectives")[1]


def sent_per_device(got: plaindata.Value) -> float:
    """Bytes one device sends for every collective of the call's compiled program, counted as the cost card
    counts them (labkit.cost: ring costs over each collective's group; a permute's pair is 2 devices, and a
    device sending to itself sends nothing)."""
    return sum(sent for sent, _ in _sent_by(got))


def card_of(got: plaindata.Value) -> cost.Card:
    """The cost card of the call's compiled program, as the kit prints it (labkit.cost.card: FLOPs, bytes held
    and bytes sent per device, timed on a chip with `.timing(chip)`), or FactUnavailable with the reason."""
    facts, flops = _compiled(got, "flops")
    memory, found = _compiled(got, "memory")[1], collectives_of(got)
    outputs = facts.outputs if not isinstance(facts.outputs, plaindata.Unavailable) else ()
    return cost.card(
        {
            "devices": facts.devices,
            "flops": flops,
            "memory": memory,
            "collectives": [
                {"op": c.op, "shape": c.shape, **({"pairs": c.pairs} if c.pairs else {"groups": c.groups})}
                for c in found
            ],
            "outputs": [{"dtype": o.dtype} for o in outputs],
        }
    )


def _compiled(got: plaindata.Value, fact: str):
    """The named fact of the call's compiled program, or FactUnavailable with the reason."""
    facts = got.compiled
    if facts is None:
        raise FactUnavailable(
            "this check needs the facts of the compiled program: declare the call with "
            "compiled_call(...), not call(...)"
        )
    if isinstance(facts, plaindata.Unavailable):
        raise FactUnavailable(f"the compiled program could not be examined ({facts.why}). {TRACEABLE}")
    value = getattr(facts, fact)
    if isinstance(value, plaindata.Unavailable):
        raise FactUnavailable(f"this check cannot be made here: {value.why}")
    return facts, value


def _inputs(got: plaindata.Value, which) -> list:
    _, inputs = _compiled(got, "inputs")
    prefix = f"args[{which}]" if isinstance(which, int) else str(which)
    chosen = [p for p in inputs if p.path == prefix or p.path.startswith(prefix + "[")]
    if not chosen:
        raise FactUnavailable(
            f"the compiled program has no array input {prefix} (its inputs: "
            f"{', '.join(p.path for p in inputs) or 'none'})"
        )
    return chosen


def _size(n: int) -> str:
    return f"{n} bytes" if n < 10_000 else f"{n / 1024:.0f} KiB"


def expect_input_split(
    got: plaindata.Value, which, devices: int, *, name: str | None = None, hint: str | None = None
) -> None:
    """Each device holds 1/`devices` of input `which` (a position, or a path such as "args[0]['w']").

    Read from the sharding the compiled program gives the input: the placement the function asked for
    (device_put, shard_map's in_specs, a sharding constraint) decides it. An input whose pieces are
    all held by every device is named as such.
    """
    for p in _inputs(got, which):
        if devices <= 1 or p.bytes == 0:
            continue
        if isinstance(p.device_bytes, plaindata.Unavailable):
            raise FactUnavailable(f"this check cannot be made here: {p.device_bytes.why}")
        if p.device_bytes * devices <= p.bytes:
            continue
        label = name or p.path
        if p.replicated or p.device_bytes >= p.bytes:
            message = (
                f"every device holds all of {label} ({_size(p.bytes)} on each of {devices} devices), "
                f"where each should hold 1/{devices} of it"
            )
        else:
            message = (
                f"each device holds {_size(p.device_bytes)} of {label}'s {_size(p.bytes)}, "
                f"more than 1/{devices} of it ({p.pieces} distinct pieces)"
            )
        raise Mismatch(with_hint(message, hint))


def expect_collective(got: plaindata.Value, op: str, devices: int, *, hint: str | None = None) -> None:
    """The compiled program has an `op` (e.g. "all-reduce") that joins all `devices` devices.

    On one device nothing is communicated, and nothing is asked; the facts must still have come back.
    """
    _, found = _compiled(got, "collectives")
    if devices <= 1:
        return
    if any(c.op == op and c.widest >= devices for c in found):
        return
    have = ", ".join(sorted({f"{c.op} over {c.widest}" for c in found})) or "none at all"
    raise Mismatch(
        with_hint(
            f"the compiled program has no {op} over all {devices} devices (its collectives: {have})", hint
        )
    )


def expect_work_split(
    got: plaindata.Value,
    whole_flops: float,
    devices: int,
    *,
    what: str = "the whole batch",
    hint: str | None = None,
) -> None:
    """No device does the work of all of it: one device's FLOPs stay well below `whole_flops`.

    `whole_flops` is what the computation's main work costs on all its data at once (counted by the
    test, e.g. its matrix products). A device that computes all of it does at least that, and more for
    the rest of the step; a device of a split computation does about 1/`devices` of it plus that rest,
    which on two devices already comes to three quarters of it. The line is drawn just below the whole.
    """
    _, flops = _compiled(got, "flops")
    if devices <= 1:
        return
    line = 0.95 * whole_flops
    budgets.note(got, budgets.WORK, flops, line, flops <= line)
    if flops > line:
        raise Mismatch(
            with_hint(
                f"one device does {flops:.3g} FLOPs, about the {whole_flops:.3g} that {what} needs: every device "
                f"computes all of it, where each should do about 1/{devices} ({whole_flops / devices:.3g})",
                hint,
            )
        )


def expect_jitted(
    got: plaindata.Value,
    *,
    allowed=("jit", "pjit", "device_put", "sharding_constraint"),
    hint: str | None = None,
) -> None:
    """The function's work happens inside jax.jit: outside it, only placement is allowed."""
    facts, _ = _compiled(got, "top_level")
    loose = sorted(set(facts.top_level) - set(allowed))
    if loose:
        raise Mismatch(with_hint(f"the work ran op by op, outside any jax.jit ({', '.join(loose)})", hint))


def expect_work_share(
    got: plaindata.Value,
    whole_flops: float,
    devices: int,
    *,
    slack: float = 1.5,
    what: str = "the whole computation",
    hint: str | None = None,
) -> None:
    """One device's FLOPs stay within `slack` times its 1/`devices` share of `whole_flops`.

    Tighter than `expect_work_split`: that one catches a device computing everything, this one also
    catches devices that repeat part of each other's work (a grid row whose devices all compute the
    same rows). `slack` leaves room for the small work around the main products.
    """
    _, flops = _compiled(got, "flops")
    if devices <= 1:
        return
    line = slack * whole_flops / devices
    budgets.note(got, budgets.WORK, flops, line, flops <= line)
    if flops <= line:
        return
    raise Mismatch(
        with_hint(
            f"one device does {flops:.3g} FLOPs, {flops / whole_flops:.2f} of the {whole_flops:.3g} that {what} needs, "
            f"where its 1/{devices} share is {whole_flops / devices:.3g}: devices repeat each other's work",
            hint,
        )
    )


def expect_collectives_within(got: plaindata.Value, blocks, *, allowed: str, hint: str | None = None) -> None:
    """Every collective joins only devices of one of `blocks` (sets of the program's device positions).

    Positions are the program's own numbering of its devices, the order of its mesh: on a 2 x 4 grid,
    the blocks {0..3} and {4..7} are its rows, so collectives within them run over the second axis
    only. A collective-permute joins each source with its destination: its pairs are judged one by one.
    """
    _, found = _compiled(got, "collectives")
    blocks = [set(b) for b in blocks]
    for c in found:
        # A permute's pairs are judged one by one: a ppermute within each row of a grid is one collective-permute
        # whose pairs span every row, and each pair still joins two devices of one row.
        for group in c.groups or [pair for pair in c.pairs if pair[0] != pair[1]]:
            if not any(set(group) <= b for b in blocks):
                raise Mismatch(
                    with_hint(
                        f"the compiled program has {'an' if c.op[0] in 'aeiou' else 'a'} {c.op} that joins devices "
                        f"{sorted(group)}, where only "
                        f"collectives {allowed} are allowed",
                        hint,
                    )
                )


def expect_fits_each_chip(got: plaindata.Value, *, where: str, what: str, hint: str) -> None:
    """The TPU compiler took the program; where it ran out of a chip's memory, fail with its own words and figures
    ('CompileTimeHbmOom: Ran out of memory on HBM, ... (15.75G)'): "{where} the TPU compiler refuses your {what}"."""
    why = str(getattr(got.compiled, "why", ""))
    if "RESOURCE_EXHAUSTED" not in why and "HbmOom" not in why:
        _note_chip_memory(got)
        return
    words = why.split("RESOURCE_EXHAUSTED: ", 1)[-1].split(" HLO module", 1)[0].rstrip(". ")
    words = words.split(": ", 1)[-1] if words.startswith("E1") else words
    raise Mismatch(f"{where} the TPU compiler refuses your {what}: {words}. {hint}")


def _note_chip_memory(got: plaindata.Value) -> None:
    """Note the bytes a chip holds against its HBM, where the TPU compiler took the program for a chip the kit
    knows (`labkit/chips.toml`) and gave its memory analysis."""
    facts = got.compiled
    memory = getattr(facts, "memory", None)
    words = str(getattr(facts, "compiled_for", "") or "").lower().split()
    chip = next((c for key, c in cost.chips().items() if key in words), None)
    if chip is None or not isinstance(memory, dict):
        return
    held = sum(int(memory.get(k, 0)) for k in ("argument", "output", "temp"))
    budgets.note(got, budgets.CHIP_MEMORY, held, chip.hbm_bytes, held <= chip.hbm_bytes)


def expect_held_below(got: plaindata.Value, limit: int, *, what: str, hint: str | None = None) -> None:
    """One device's arguments and temporaries (the compiled program's memory analysis) stay below `limit` bytes."""
    _, memory = _compiled(got, "memory")
    held = memory["argument"] + memory["temp"]
    budgets.note(got, budgets.HELD, held, limit, held < limit)
    if held >= limit:
        raise Mismatch(
            with_hint(
                f"one device holds {_size(held)} of arguments and temporaries, at least the "
                f"{_size(limit)} of {what}",
                hint,
            )
        )


def _sent_by(got: plaindata.Value) -> list[tuple[float, str]]:
    """(bytes one device sends, a description) for each collective of the call's compiled program, largest first."""
    return sorted(((b, label) for b, label, _ in sent_parts(got)), key=lambda p: -p[0])


def sent_parts(got: plaindata.Value) -> list[tuple[float, str, str]]:
    """(bytes one device sends, a description, the kind it is charged as) for each collective of the call's
    compiled program, in the program's order. An all-reduce the TPU compiler wrote for a reduce-scatter or an
    all-gather the program asks for (`_stands_for`) is charged as that one, array by array."""
    facts, found = _compiled(got, "collectives")
    parts = []
    for c, stands in zip(found, _stands_for(facts, found), strict=True):
        width = cost.group_width(c.pairs, c.groups, facts.devices)
        label = f"{c.op} of {c.shape.split('{')[0]} over {width} devices"
        if c.op != "all-reduce" or not any(stands):
            parts.append((cost.bytes_sent(c.op, cost.shape_bytes(c.shape), width), label, c.op))
            continue
        arrays = hloparse.shape_arrays(c.shape)
        for (dtype, dims), kind in zip(arrays, stands, strict=True):
            # a reduce-scatter of this array, or an all-gather into it, sends (n-1)/n of it: half the all-reduce
            as_sent = "all-gather" if kind else "all-reduce"
            words = (
                f", the TPU compiler's form of the {kind} your program asks for: counted as that"
                if kind
                else ""
            )
            one = f"{label}: {dtype}[{','.join(map(str, dims))}]{words}" if len(arrays) > 1 else label + words
            parts.append(
                (cost.bytes_sent(as_sent, hloparse.array_bytes(dtype, dims), width), one, kind or c.op)
            )
    return parts


def _stands_for(facts, found) -> list[list[str | None]]:
    """For each collective of the compiled program, for each of its arrays, the collective the program writes
    that it stands for where the TPU compiler wrote an all-reduce in its place ("reduce-scatter" or
    "all-gather"), else None. libtpu sums a reduce-scatter of a vector or a small array with an all-reduce (and a
    slice), and gathers a small all-gather with an all-reduce of the zero-padded result: its own choice of form,
    which a budget of the design does not charge. Matched by dimensions, one for one: each reduce-scatter and
    all-gather the compiled program keeps takes the written one it is, each all-reduce array first takes an
    all-reduce the program writes of its dimensions (charged as what it is), and only then a written
    reduce-scatter's operand or all-gather's result left unmatched. An all-reduce jit's partitioner adds beside
    them is charged as what it is unless its dimensions are those of a written collective the compiler did
    not keep."""
    plain: list[list[str | None]] = [[None] * max(1, len(_arrays(c))) for c in found]
    if not facts.compiled_for or facts.written_sizes is None:
        return plain
    left = collections.Counter(facts.written_sizes)
    for c in found:  # the written collectives the compiled program keeps as they are
        width = cost.group_width(c.pairs, c.groups, facts.devices)
        for _, dims in _arrays(c):
            if c.op == "all-gather":
                _take(left, [("all-gather", dims)])
            elif c.op == "reduce-scatter":
                _take(left, [("reduce-scatter", d) for d in _scattered(dims, width)])
    for i, c in enumerate(found):
        if c.op != "all-reduce":
            continue
        for j, (_, dims) in enumerate(_arrays(c)):
            if _take(left, [("all-reduce", dims)]) is None:
                taken = _take(left, [("reduce-scatter", dims), ("all-gather", dims)])
                plain[i][j] = taken[0] if taken else None
    return plain


def _arrays(c) -> list[tuple[str, tuple[int, ...]]]:
    return hloparse.shape_arrays(c.shape)


def _scattered(dims: tuple[int, ...], width: int) -> list[tuple[int, ...]]:
    """The operands a reduce-scatter over `width` devices whose result is `dims` may have scattered."""
    return [dims[:k] + (dims[k] * width,) + dims[k + 1 :] for k in range(len(dims))]


def _take(
    left: collections.Counter, wanted: list[tuple[str, tuple[int, ...]]]
) -> tuple[str, tuple[int, ...]] | None:
    """The first of `wanted` still left, taken out of `left`; None where none is."""
    for w in wanted:
        if left[w] > 0:
            left[w] -= 1
            return w
    return None


def expect_sent_within(
    got: plaindata.Value,
    budget: float,
    devices: int,
    *,
    what: str,
    margin: float = 1.1,
    hint: str | None = None,
) -> None:
    """One device sends at most `margin` times `budget` bytes over all the collectives of the compiled program.

    Counted as the cost card counts (`sent_per_device`). A failure names the figure, the limit and each
    collective with the bytes it sends, largest first, so that the student sees which one is over.
    """
    parts = _sent_by(got)
    sent = sum(b for b, _ in parts)
    if devices <= 1:
        return
    budgets.note(got, budgets.SENT, sent, margin * budget, sent <= margin * budget)
    if sent <= margin * budget:
        return
    listed = "; ".join(f"{d}: {_size(round(b))}" for b, d in parts if b > 0)
    whose, replaced = _whose(got)
    raise Mismatch(
        with_hint(
            f"each device sends {_size(round(sent))}, where the budget is {_size(round(budget))} ({what}; up to "
            f"{margin:g} times that passes). What it sends: {listed}" + whose,
            None
            if replaced
            else hint,  # a hint on what to write, where the compiler replaced what was written
        )
    )


def _whose(got: plaindata.Value) -> tuple[str, bool]:
    """(words, replaced): which of the compiled program's collectives the program did not ask for itself, the
    compiler's choice said as such (jit's partitioner adds them for the shardings given; a TPU compiler may
    turn a small reduce-scatter into an all-reduce and a slice); `replaced`: none of those it asked for is
    left. Nothing where the kit did not read what the program asks for (a student's own `check`)."""
    facts, found = _compiled(got, "collectives")
    if facts.written is None:
        return "", False
    compiled = {c.op for c in found}
    added = sorted(compiled - set(facts.written))
    if not added:
        return "", False
    compiler = f"the TPU compiler (for {facts.compiled_for})" if facts.compiled_for else "the compiler"
    asked = ", ".join(facts.written) or "no collective"
    words = (
        f". Your program asks for {asked} itself; the {', '.join(added)} {'is' if len(added) == 1 else 'are'} "
        f"a choice of {compiler} for what it was given (the shardings jit was given, or an array this small), "
        "and this row reports what the program does on this configuration, not what you wrote"
    )
    return words, bool(facts.written) and not compiled & set(facts.written)


def expect_steps_within(
    got: plaindata.Value,
    limit: int,
    devices: int,
    *,
    op: str = "collective-permute",
    what: str,
    hint: str | None = None,
) -> None:
    """The compiled program runs `op` at most `limit` times in one call: a schedule read as a count of steps.

    Each run of a collective is a step that every device waits on (a loop's collective counts once per trip);
    a collective-permute in which every device sends to itself moves nothing and is not counted. A pipeline
    whose stages work at once hands its activations on about once per step, M + S - 1 times for M
    micro-batches on S stages; one that runs a micro-batch at a time through the stages does it M x (S - 1)
    times.
    """
    _, found = _compiled(got, "collectives")
    if devices <= 1:
        return
    steps = sum(1 for c in found if c.op == op and (not c.pairs or any(a != b for a, b in c.pairs)))
    budgets.note(got, budgets.STEPS, steps, limit, steps <= limit)
    if steps > limit:
        raise Mismatch(
            with_hint(
                f"the compiled program runs {steps} {op}s one after another, where {what} needs "
                f"at most {limit}",
                hint,
            )
        )
