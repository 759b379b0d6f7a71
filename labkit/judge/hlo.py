"""Reading a compiled program (optimised HLO) as a structure: its collectives, the devices each joins, how many
times each runs, and the work its loops hide (pure Python: tested without JAX).

The program is read as instructions, never searched as text (`labkit.judge.hloparse`): a student's words (a
`jax.named_scope`, a `named_call`, a function's name) reach it only inside quoted strings
(`metadata={op_name="..."}`, `frontend_attributes`) or as identifiers, never as an opcode, a shape or an
attribute. A line that looks like an instruction and does not parse, a dtype whose size is not known, or a
communicating op this reader does not count, is an error that names it: never a collective left out or counted
as 0 bytes.

An asynchronous collective (`all-gather-start`, `collective-permute-start`, `all-reduce-start`) is counted
once, at its start, with what the start itself says it makes: its `-done` only waits, and is never read (so
a `-done` can neither add a collective nor change one's size, wherever it stands).

The TPU compiler can also overlap a collective with the work around it by splitting it into a chain of
fusions (an async collective fusion): a start, whose computation ends in a custom-call `AsyncCollectiveStart`
of the collective, then continuation fusions that take the start's results and compute while it runs, then a
done fusion (`AsyncCollectiveDone`). Each of their computations holds a copy of the one collective; it sends
once, and is counted once, at its start (`_chain_copies`). Only a copy is left out: a collective of the same
op, result shape and groups inside a fusion that takes the chain's own results.

A collective inside a loop (`lax.fori_loop`, `lax.scan`, a `while`) is written once in the program, inside
the loop's body, however many times the loop runs. The compiler notes the number of steps of a loop it can
count (`known_trip_count`, as XLA:CPU writes it); the TPU compiler writes none, and there the steps are read
from the loop itself: a counter that starts at a constant, goes up by a constant step and is compared with a
constant bound (`_counted`). Each collective is listed once per run, so what a program sends is the sum over
the list whatever the loops.

XLA's own cost analysis counts a loop's body once too, so every instruction of a loop's body (products,
elementwise arithmetic, reductions, and the fused computations the body calls) is counted here again for
each further step (`loop_flops`), as XLA's cost analysis counts one step of it. A loop whose steps cannot be
read and that sends or computes anything is refused ("cannot count this loop"): what it costs cannot be known
from the program, and an undercount would pass a design it should not.
"""

from __future__ import annotations

import json
import math
import re

from labkit.judge.hloparse import (  # noqa: F401 - the parsed program, as this module's readers name it
    ELEMENT_BITS,
    Computation,
    Instruction,
    Module,
    Unreadable,
    parse,
    shape_bytes,
    shape_elements,
    split_outside,
    without_layouts,
)

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
# The asynchronous forms whose start carries what they make; their `-done` only waits.
_STARTS = {f"{op}-start": op for op in ("all-reduce", "all-gather", "collective-permute")}
# Ops that move data between devices that this reader does not count: refused, never left out.
_UNCOUNTED = frozenset(
    {
        "ragged-all-to-all",
        "collective-broadcast",
        "send",
        "recv",
        "send-done",
        "recv-done",
    }
)
MOST = 20_000  # collectives listed for one program, loops unrolled: more is refused, not truncated

# ----------------------------------------------------------------------------------------
# How many times each computation runs.
# ----------------------------------------------------------------------------------------


def _names(value: str) -> list[str]:
    """The computations an attribute names: `%body` or `{%a, %b}`."""
    return [p.strip().lstrip("%") for p in value.strip().strip("{}").split(",") if p.strip()]


def _through(name: str, defs: dict[str, Instruction]) -> Instruction | None:
    """The instruction `name` is, looking through copies."""
    for _ in range(16):
        found = defs.get(name)
        if found is None:
            return None
        if found.opcode != "copy" or len(found.operands) != 1:
            return found
        name = found.operands[0]
    return None


def _constant(name: str, defs: dict[str, Instruction]) -> int | None:
    found = _through(name, defs)
    if (
        found is None
        or found.opcode != "constant"
        or not re.fullmatch(r"[su](?:8|16|32|64)\[\]", _bare(found))
    ):
        return None
    return int(found.literal) if re.fullmatch(r"-?\d+", found.literal) else None


def _bare(i: Instruction) -> str:
    return without_layouts(i.shape).strip()


def _element(name: str, defs: dict[str, Instruction]) -> int | None:
    """k where `name` is element k of the computation's parameter (through copies), else None."""
    found = _through(name, defs)
    if found is None or found.opcode != "get-tuple-element":
        return None
    index = found.attributes.get("index", "")
    return int(index) if index.isdigit() else None


def _trip_count(loop: Instruction, module: Module, caller: Computation) -> int | None:
    """The steps of a `while`: the compiler's `known_trip_count` where it wrote one, else read from the loop."""
    config = loop.attributes.get("backend_config", "")
    if config.startswith('"'):  # an older printer quotes the JSON
        try:
            config = json.loads(config)
        except ValueError:
            config = ""
    try:
        known = json.loads(config).get("known_trip_count", {}).get("n") if config else None
    except (ValueError, AttributeError):
        known = None
    if isinstance(known, str) and known.isdigit():
        return int(known)
    return _counted(loop, module, caller)


def _counted(loop: Instruction, module: Module, caller: Computation) -> int | None:
    """The steps of a `while` the compiler did not count for us (the TPU compiler's loops), read from the
    loop: its condition is `counter < bound` with a constant bound, the counter starts at a constant
    (the while's tuple) and the body adds a constant step to it, a constant itself or one the body
    passes on unchanged. None where any of that is not so: the loop is then not counted."""
    cond = module.computations.get(loop.attributes.get("condition", "").lstrip("%"))
    body = module.computations.get(loop.attributes.get("body", "").lstrip("%"))
    if cond is None or body is None or len(loop.operands) != 1:
        return None
    cdefs, bdefs, odefs = cond.by_name(), body.by_name(), caller.by_name()
    compare = cond.root
    if compare is None or compare.opcode != "compare" or len(compare.operands) != 2:
        return None
    a, b = compare.operands
    direction = compare.attributes.get("direction")
    if direction == "LT":
        k, bound = _element(a, cdefs), _constant(b, cdefs)
    elif direction == "GT":
        k, bound = _element(b, cdefs), _constant(a, cdefs)
    else:
        return None
    start_tuple = _through(loop.operands[0], odefs)
    if k is None or bound is None or start_tuple is None or start_tuple.opcode != "tuple":
        return None
    if k >= len(start_tuple.operands):
        return None
    start = _constant(start_tuple.operands[k], odefs)
    root = body.root
    if start is None or root is None or root.opcode != "tuple" or k >= len(root.operands):
        return None
    step_op = _through(root.operands[k], bdefs)
    if step_op is None or step_op.opcode != "add" or len(step_op.operands) != 2:
        return None
    x, y = step_op.operands
    other = y if _element(x, bdefs) == k else x if _element(y, bdefs) == k else None
    if other is None:
        return None
    step = _constant(other, bdefs)
    j = _element(other, bdefs)
    if step is None and j is not None and j < len(root.operands) and _element(root.operands[j], bdefs) == j:
        step = _constant(start_tuple.operands[j], odefs) if j < len(start_tuple.operands) else None
    if step is None or step <= 0:
        return None
    return max(0, -(-(bound - start) // step))


def _taken(conditional: Instruction, caller: Computation, branches: int) -> int | None:
    """The branch a conditional runs when its index is a constant of the computation it is in, else None.
    An index out of range runs the last branch, as XLA's conditional does."""
    if not conditional.operands:
        return None
    index = _constant(conditional.operands[0], caller.by_name())
    if index is None:
        return None
    return index if 0 <= index < branches else branches - 1


def _calls(i: Instruction, module: Module, caller: Computation) -> list[tuple[str, int | None, bool]]:
    """The computations one instruction runs: (name, how many times (None: a loop whose steps cannot be
    counted), whether it is a scalar function applied elementwise, whose work the caller's count holds)."""
    a = i.attributes
    if i.opcode == "while":
        times = _trip_count(i, module, caller)
        return [(n, times, False) for key in ("condition", "body") if key in a for n in _names(a[key])]
    if i.opcode == "conditional":
        names = _names(a["branch_computations"]) if "branch_computations" in a else []
        names += [_names(a[k])[0] for k in ("true_computation", "false_computation") if k in a]
        taken = _taken(i, caller, len(names))
        # the one its constant index picks, the others never; else each is counted, an upper bound
        return [(n, 1 if taken is None or k == taken else 0, False) for k, n in enumerate(names)]
    if i.opcode in ("async-update", "async-done"):
        return []  # the computation an async pair wraps runs once, counted at its start
    own = ("calls", "called_computations", *(("to_apply",) if i.opcode == "call" else ()))
    called = [(n, 1, False) for key in own if key in a for n in _names(a[key])]
    applied = () if i.opcode == "call" else ("to_apply", "select", "scatter", "comparator")
    return called + [(n, 1, True) for key in applied if key in a for n in _names(a[key])]


def runs(module: Module) -> tuple[dict[str, int | None], set[str]]:
    """How many times each computation runs for one call of the program (None: not countable), and the scalar
    functions an instruction applies elementwise (a reduction's `add`), whose work their callers count.
    A computation nothing calls is counted once, never left out."""
    times: dict[str, int | None] = {}
    scalar: set[str] = set()

    def visit(name: str, count: int | None, depth: int) -> None:
        if depth > 64 or name not in module.computations:
            return
        before = times.get(name, 0)
        times[name] = None if before is None or count is None else before + count
        computation = module.computations[name]
        for i in computation.instructions:
            for child, each, applied in _calls(i, module, computation):
                if applied:
                    scalar.add(child)
                visit(child, None if count is None or each is None else count * each, depth + 1)

    visit("", 1, 0)
    if module.entry is not None:
        visit(module.entry, 1, 0)
    for name in module.computations:
        times.setdefault(name, 1)
    return times, scalar


# ----------------------------------------------------------------------------------------
# Collectives.
# ----------------------------------------------------------------------------------------


def parse_groups(text: str, devices: int) -> list[list[int]]:
    """`{{0,1},{2,3}}`, `{}` (every device in one group), the iota form `[2,4]<=[4,2]T(1,0)`, or the mesh
    form `mesh['data'=2,'model'=4] {'model'}` (the devices that differ only along the named axes)."""
    text = text.strip()
    if text == "{}":
        return [list(range(devices))]
    if text.startswith("mesh"):
        return _mesh_groups(text)
    if text.startswith("["):
        import numpy as np

        m = re.fullmatch(r"\[([\d,\s]+)\]<=\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?", text)
        if m is None:
            raise Unreadable(f"replica groups in a form this reader does not know: {text[:120]}")
        shape = [int(v) for v in m.group(1).split(",")]
        dims = [int(v) for v in m.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(v) for v in m.group(3).split(",")])
        return ids.reshape(shape).tolist()
    if not re.fullmatch(r"\{\s*(\{[\d,\s]*\}\s*,?\s*)*\}", text):
        raise Unreadable(f"replica groups in a form this reader does not know: {text[:120]}")
    return [[int(v) for v in g.split(",") if v.strip()] for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]


_MESH_GROUPS = re.compile(r"mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<over>[^}]*)\}")


def _mesh_groups(text: str) -> list[list[int]]:
    """The groups of the mesh form: positions in the mesh (row-major, as the iota form numbers them)."""
    import numpy as np

    m = _MESH_GROUPS.fullmatch(text)
    if m is None:
        raise Unreadable(f"replica groups in a mesh form this reader does not know: {text[:120]}")
    axes = re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group("axes"))
    names, sizes = [a for a, _ in axes], [int(k) for _, k in axes]
    over = re.findall(r"'([^']+)'", m.group("over"))
    if not names or any(a not in names for a in over) or re.search(r"[():]", m.group("over")):
        raise Unreadable(f"replica groups in a mesh form this reader does not know: {text[:120]}")
    ids = np.arange(int(np.prod(sizes))).reshape(sizes)
    kept = [i for i, a in enumerate(names) if a not in over]
    moved = [names.index(a) for a in over]
    size = int(np.prod([sizes[i] for i in moved], dtype=np.int64))
    return ids.transpose(kept + moved).reshape(-1, size).tolist()


def _tuple_elements(shape: str) -> list[str]:
    """The elements of a tuple shape `(a, b, ...)`, or [shape] where it is no tuple."""
    shape = shape.strip()
    if not shape.startswith("("):
        return [shape]
    return [p.strip() for p in split_outside(shape[1:-1])]


def _made(i: Instruction) -> str:
    """What a collective makes: its result, or, for an async start, the result its start carries (an all-gather's
    start is (its operands, its results); a permute's start (the buffer sent, the one received, two counters))."""
    if i.opcode in ("all-gather-start", "collective-permute-start"):
        parts = _tuple_elements(i.shape)
        if len(parts) < 2:
            raise Unreadable(f"a {i.opcode} whose result is not the tuple XLA writes")
        return parts[1]
    return i.shape


def _collective(i: Instruction, devices: int) -> dict | None:
    if i.opcode in _UNCOUNTED:
        raise Unreadable(f"the program sends data with {i.opcode}, which this reader does not count")
    op = _STARTS.get(i.opcode, i.opcode if i.opcode in COLLECTIVES else None)
    if op is None:
        return None
    shape = _made(i)
    shape_elements(shape)  # a dtype of unknown size is refused here, by name
    item: dict = {"op": op, "shape": shape}
    if "source_target_pairs" in i.attributes:
        pairs = i.attributes["source_target_pairs"]
        if not re.fullmatch(r"\{\s*(\{\s*\d+\s*,\s*\d+\s*\}\s*,?\s*)*\}", pairs):
            raise Unreadable(f"source-target pairs in a form this reader does not know: {pairs[:120]}")
        item["pairs"] = [[int(a), int(b)] for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", pairs)]
    elif "replica_groups" in i.attributes:
        item["groups"] = parse_groups(i.attributes["replica_groups"], devices)
    else:
        item["groups"] = [list(range(devices))]
    return item


def _signature(i: Instruction) -> tuple[str, ...]:
    """What makes two collectives the same one: op, result shape (layouts aside), groups or pairs as written."""
    a = i.attributes
    return (i.opcode, without_layouts(i.shape), a.get("replica_groups", ""), a.get("source_target_pairs", ""))


def _chain_copies(module: Module) -> dict[str, list[tuple[str, ...]]]:
    """Per computation, the copies of an async collective fusion's collective it holds (see the module's
    docstring): in each computation, a fusion whose computation ends in a custom-call `AsyncCollectiveStart`
    starts a chain with the collectives it holds; a fusion that takes a result of the chain (directly or
    through a get-tuple-element) joins it, and its collectives with a signature of the chain are copies."""
    copies: dict[str, list[tuple[str, ...]]] = {}
    for caller in module.computations.values():
        chain: dict[str, set[tuple[str, ...]]] = {}  # instruction -> the signatures of the chain it carries
        for i in caller.instructions:
            feeding = set().union(*(chain[o] for o in i.operands if o in chain))
            if i.opcode == "get-tuple-element" and feeding:
                chain[i.name] = feeding
            if i.opcode != "fusion":
                continue
            called = module.computations.get(next(iter(_names(i.attributes.get("calls", ""))), ""))
            if called is None or not called.name:
                continue
            held = [_signature(c) for c in called.instructions if c.opcode in COLLECTIVES]
            root = called.root
            if (
                held
                and root is not None
                and root.opcode == "custom-call"
                and root.attributes.get("custom_call_target") == '"AsyncCollectiveStart"'
                and not feeding
            ):
                chain[i.name] = set(held)
            elif feeding:
                copies.setdefault(called.name, []).extend(s for s in held if s in feeding)
                chain[i.name] = feeding
    return copies


def collectives_in(hlo: str, devices: int) -> list[dict]:
    """Every collective the program runs for one call, once per run (a loop's collective as many times
    as the loop's steps; an async collective fusion's once, at its start): op, result shape, and the devices
    that take part together."""
    module = parse(hlo)
    times, _ = runs(module)
    copies = _chain_copies(module)
    listed: list[dict] = []
    for name, computation in module.computations.items():
        for i in computation.instructions:
            item = _collective(i, devices)
            if item is None:
                continue
            if _signature(i) in copies.get(name, []):
                copies[name].remove(_signature(i))  # a copy of its chain's collective, counted at the start
                continue
            count = times[name]
            if count is None:
                raise Unreadable(
                    f"cannot count this loop: a collective ({item['op']}) inside a loop whose number of steps "
                    "the compiler cannot count. Give the loop a fixed number of steps, or write it as a "
                    "Python for loop, so that what it sends can be counted"
                )
            if len(listed) + count > MOST:
                raise Unreadable(f"the program runs more than {MOST} collectives for one call")
            listed.extend(dict(item) for _ in range(count))
    return listed


# ----------------------------------------------------------------------------------------
# Work.
# ----------------------------------------------------------------------------------------

# What XLA's cost analysis counts as one FLOP per element of the result (`HloCostAnalysis`'s elementwise
# handler; the transcendental ones it counts apart, not as FLOPs).
_ELEMENTWISE = frozenset(
    {
        "add",
        "subtract",
        "multiply",
        "divide",
        "remainder",
        "maximum",
        "minimum",
        "negate",
        "abs",
        "sign",
        "compare",
        "select",
        "clamp",
        "and",
        "or",
        "xor",
        "not",
        "floor",
        "ceil",
        "round-nearest-afz",
        "round-nearest-even",
        "shift-left",
        "shift-right-arithmetic",
        "shift-right-logical",
        "atan2",
        "power",
        "real",
        "imag",
        "complex",
        "popcnt",
        "count-leading-zeros",
        "is-finite",
        "convert",
    }
)
_REDUCING = frozenset({"reduce", "reduce-window", "all-reduce", "reduce-scatter", "select-and-scatter"})


def _elements(shape: str) -> int:
    return sum(count for _, count in shape_elements(shape))


def _dims(shape: str) -> list[int]:
    bare = without_layouts(shape)
    inside = bare[bare.index("[") + 1 : bare.index("]")]
    return [int(v) for v in inside.split(",") if v.strip()]


def _summed(i: Instruction, lhs: str) -> int | None:
    """How many products each output element of a product sums: a `dot`'s contracting dimensions, or the
    input feature dimension (`f`) of a `convolution` that is a matrix product (the TPU compiler writes
    `x @ w` so: `dim_labels=bf_io->bf`), times its window's size where it has one (the TPU compiler's
    windowed products inside a collective matmul's loop). None with groups or dilation, which this reader
    does not count."""
    dims = _dims(lhs)
    if i.opcode == "dot":
        contracting = i.attributes.get("lhs_contracting_dims")
        if contracting is None:
            return None
        return math.prod(dims[int(d)] for d in contracting.strip("{}").split(",") if d.strip())
    labels = re.fullmatch(r"(?P<lhs>[a-z0-9]+)_[a-z0-9]+->[a-z0-9]+", i.attributes.get("dim_labels", ""))
    if not labels or "feature_group_count" in i.attributes or "batch_group_count" in i.attributes:
        return None
    if "f" not in labels.group("lhs") or len(labels.group("lhs")) != len(dims):
        return None
    window = re.match(r"\{size=(?P<size>\d+(?:x\d+)*)", i.attributes.get("window", ""))
    if "dilate=" in i.attributes.get("window", "") or any("dilate" in k for k in i.attributes):
        return None
    sizes = [int(v) for v in window.group("size").split("x")] if window else []
    if len(sizes) != sum(c.isdigit() for c in labels.group("lhs")):  # one size per spatial dimension
        return None
    return dims[labels.group("lhs").index("f")] * math.prod(sizes)


def _work(i: Instruction, shapes: dict[str, str]) -> float:
    """The FLOPs of one instruction as XLA's cost analysis counts one run of it (0 where it moves data only)."""
    if i.opcode in ("dot", "convolution"):
        lhs = shapes.get(i.operands[0]) if i.operands else None
        summed = _summed(i, lhs) if lhs is not None else None
        if summed is None:
            raise Unreadable(f"a {i.opcode} inside a loop whose work this reader cannot count")
        return 2.0 * _elements(i.shape) * summed
    if i.opcode in _ELEMENTWISE:
        return float(_elements(i.shape))
    if i.opcode in _REDUCING and i.opcode not in ("all-reduce", "reduce-scatter"):
        first = shapes.get(i.operands[0]) if i.operands else None
        return float(_elements(first)) if first is not None else float(_elements(i.shape))
    return 0.0


def loop_flops(hlo: str) -> float:
    """The FLOPs XLA's cost analysis leaves out: every instruction of a loop's body (and of what the body calls)
    counted again for each step after the first. Work in a loop whose steps cannot be counted is refused."""
    module = parse(hlo)
    times, scalar = runs(module)
    extra = 0.0
    for name, computation in module.computations.items():
        if name in scalar:
            continue  # a reduction's scalar function: its caller's work counts it
        count = times[name]
        if count is not None and count <= 1:
            continue
        shapes = {i.name: i.shape for i in computation.instructions}
        work = sum(_work(i, shapes) for i in computation.instructions)
        if count is None:
            if work:
                raise Unreadable(
                    "cannot count this loop: it computes inside a loop whose number of steps the compiler "
                    "cannot count, so the work it does cannot be known from the program"
                )
            continue
        extra += (count - 1) * work
    return extra


def printed(compiled) -> str:
    """The optimised program of a `jax.stages.Compiled` as text. Its metadata (op names, source lines: the
    student's words) is printed too, and `parse` reads it as the quoted attribute it is, never as instructions."""
    return compiled.as_text()
