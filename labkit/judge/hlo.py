"""Reading the optimised HLO text of a compiled program: its collectives, the devices each joins, and
how many times each runs (pure Python: tested without JAX).

A collective inside a loop (`lax.fori_loop`, `lax.scan`, a `while`) is written once in the program's
text, inside the loop's body, however many times the loop runs. The compiler notes the number of steps
of a loop it can count (`known_trip_count`, as XLA:CPU writes it); the TPU compiler writes none, and
there the steps are read from the loop itself: a counter that starts at a constant, goes up by a
constant step and is compared with a constant bound (`_counted`). Each collective is listed once per
run, so what a program sends is the sum over the list whatever the loops. A collective inside a loop whose steps the compiler
cannot count is refused: what it costs cannot be known from the program.

XLA's own cost analysis counts a loop's body once too, so the matrix products of a loop's body are
counted here again for each further step (`loop_flops`): one device's work then includes what a loop
hides.
"""

from __future__ import annotations

import math
import re

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")

_OP = re.compile(r"=\s*(?P<shape>.+?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_DONE = re.compile(
    r"=\s*(?P<shape>.+?)\s+(?:" + "|".join(COLLECTIVES) + r")-done\((?:[^%)]*\s)?%(?P<start>[\w.\-]+)\)"
)
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=")
_GROUPS = re.compile(
    r"replica_groups=(?P<g>\{\}|\{\{[\d,{}\s]*\}\}|\[[\d,\s]+\]<=\[[\d,\s]+\](?:T\([\d,\s]+\))?"
    r"|mesh\[[^\]]*\]\s*\{[^}]*\})"
)
_MESH_GROUPS = re.compile(r"mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<over>[^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{(?P<p>[\d,{}\s]*)\}")


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

        m = re.match(r"\[([\d,\s]+)\]<=\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?", text)
        shape = [int(v) for v in m.group(1).split(",")]
        dims = [int(v) for v in m.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(v) for v in m.group(3).split(",")])
        return ids.reshape(shape).tolist()
    return [[int(v) for v in g.split(",") if v.strip()] for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]


def _mesh_groups(text: str) -> list[list[int]]:
    """The groups of the mesh form: positions in the mesh (row-major, as the iota form numbers them)."""
    import numpy as np

    m = _MESH_GROUPS.match(text)
    axes = re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group("axes"))
    names, sizes = [a for a, _ in axes], [int(k) for _, k in axes]
    over = re.findall(r"'([^']+)'", m.group("over"))
    if not names or any(a not in names for a in over) or re.search(r"[():]", m.group("over")):
        raise ValueError(f"replica groups in a mesh form this reader does not know: {text[:120]}")
    ids = np.arange(int(np.prod(sizes))).reshape(sizes)
    kept = [i for i, a in enumerate(names) if a not in over]
    moved = [names.index(a) for a in over]
    size = int(np.prod([sizes[i] for i in moved], dtype=np.int64))
    return ids.transpose(kept + moved).reshape(-1, size).tolist()


_HEADER = re.compile(r"^\s*(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
_CALLED = re.compile(
    r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%(?P<name>[\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{(?P<names>[^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(?P<n>\d+)"')
MOST = 20_000  # collectives listed for one program, loops unrolled: more is refused, not truncated


def _compact(shape: str) -> str:
    """A result shape without its index comments: `(f32[4]{0}, /*index=1*/f32[4]{0})` is
    `(f32[4]{0}, f32[4]{0})`. Whole, never cut: what a collective sends is read from it (a tuple of one
    entry per device, as an all-to-all on CPU gives, runs long)."""
    return re.sub(r"\s+", " ", re.sub(r"/\*[^*]*\*/", "", shape)).strip()


def computations(hlo: str) -> tuple[dict[str, list[str]], str | None]:
    """The program's computations (name -> lines) and the name of its entry; lines outside any
    computation (a fragment, as the tests write them) belong to the entry `""`."""
    found: dict[str, list[str]] = {"": []}
    entry, current = None, ""
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and "=" not in line.split("(", 1)[0]:
            current = header.group("name")
            found[current] = [line]  # its header: the names and shapes of its parameters
            if header.group("entry"):
                entry = current
        elif line.strip() == "}":
            current = ""
        else:
            found[current].append(line)
    return found, entry


_DEF = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*.*?\s(?P<op>[a-z][\w\-]*)\((?P<args>[^)]*)\)")
_INDEX = re.compile(r"\bindex=(?P<i>\d+)")
_VALUE = re.compile(r"\b[su](?:32|64)\[\][^=]*?constant\((?P<v>-?\d+)\)")


def _defs(lines: list[str]) -> tuple[dict[str, tuple[str, list[str], str]], str | None]:
    """One computation's instructions: name -> (op, operand names, line); and the name of its ROOT."""
    found, root = {}, None
    for line in lines:
        d = _DEF.match(line)
        if d:
            args = [a.split()[-1].lstrip("%") for a in d.group("args").split(",") if a.strip()]
            found[d.group("name")] = (d.group("op"), args, line)
            if line.lstrip().startswith("ROOT"):
                root = d.group("name")
    return found, root


def _through(name: str, defs: dict) -> tuple[str, list[str], str] | None:
    """The instruction `name` is, looking through copies."""
    for _ in range(16):
        if name not in defs:
            return None
        op, args, line = defs[name]
        if op != "copy" or len(args) != 1:
            return op, args, line
        name = args[0]
    return None


def _constant(name: str, defs: dict) -> int | None:
    found = _through(name, defs)
    if found is None or found[0] != "constant":
        return None
    value = _VALUE.search(found[2])
    return int(value.group("v")) if value else None


def _element(name: str, defs: dict) -> int | None:
    """k where `name` is element k of the computation's parameter (through copies), else None."""
    found = _through(name, defs)
    if found is None or found[0] != "get-tuple-element":
        return None
    index = _INDEX.search(found[2])
    return int(index.group("i")) if index else None


def _counted(line: str, found: dict[str, list[str]], caller: list[str]) -> int | None:
    """The steps of a `while` the compiler did not count for us (the TPU compiler's loops), read from the
    loop: its condition is `counter < bound` with a constant bound, the counter starts at a constant
    (the while's tuple) and the body adds a constant step to it, a constant itself or one the body
    passes on unchanged. None where any of that is not so: the loop is then not counted."""
    cond = re.search(r"condition=%(?P<c>[\w.\-]+)", line)
    body = re.search(r"body=%(?P<b>[\w.\-]+)", line)
    operand = re.search(r"\swhile\(%(?P<t>[\w.\-]+)\)", line)
    if not (cond and body and operand):
        return None
    cdefs, croot = _defs(found.get(cond.group("c"), []))
    bdefs, broot = _defs(found.get(body.group("b"), []))
    odefs, _ = _defs(caller)
    compare = cdefs.get(croot) if croot else None
    if compare is None or compare[0] != "compare" or len(compare[1]) != 2:
        return None
    direction = re.search(r"direction=(?P<d>[A-Z]+)", compare[2])
    a, b = compare[1]
    if direction and direction.group("d") == "LT":
        k, bound = _element(a, cdefs), _constant(b, cdefs)
    elif direction and direction.group("d") == "GT":
        k, bound = _element(b, cdefs), _constant(a, cdefs)
    else:
        return None
    start_tuple = _through(operand.group("t"), odefs)
    if (
        k is None
        or bound is None
        or start_tuple is None
        or start_tuple[0] != "tuple"
        or k >= len(start_tuple[1])
    ):
        return None
    start = _constant(start_tuple[1][k], odefs)
    root = bdefs.get(broot) if broot else None
    if start is None or root is None or root[0] != "tuple" or k >= len(root[1]):
        return None
    step_op = _through(root[1][k], bdefs)
    if step_op is None or step_op[0] != "add" or len(step_op[1]) != 2:
        return None
    x, y = step_op[1]
    other = y if _element(x, bdefs) == k else x if _element(y, bdefs) == k else None
    if other is None:
        return None
    step = _constant(other, bdefs)
    j = _element(other, bdefs)
    if step is None and j is not None and j < len(root[1]) and _element(root[1][j], bdefs) == j:
        step = _constant(start_tuple[1][j], odefs) if j < len(start_tuple[1]) else None  # an invariant step
    if step is None or step <= 0:
        return None
    return max(0, -(-(bound - start) // step))


def _calls(
    line: str, found: dict[str, list[str]] | None = None, caller: list[str] | None = None
) -> list[tuple[str, int | None]]:
    """The computations one instruction runs, each with how many times (None: a loop whose steps cannot be
    counted)."""
    if " while(" in line:
        trips = _TRIPS.search(line)
        times = int(trips.group("n")) if trips else _counted(line, found or {}, caller or [])
        return [(m.group("name"), times) for m in _CALLED.finditer(line)]
    called = [(m.group("name"), 1) for m in _CALLED.finditer(line)]
    branches = _BRANCHES.search(line)
    if branches:  # a conditional runs one of its branches
        names = [n.strip().lstrip("%") for n in branches.group("names").split(",") if n.strip()]
        taken = _taken(line, caller or [], len(names))
        # the one its constant index picks, the others never (a program exported for several platforms
        # keeps one branch per platform, the index fixed when compiled for one); else each is counted,
        # an upper bound
        called += [(n, 1 if taken is None or i == taken else 0) for i, n in enumerate(names)]
    return called


def _taken(line: str, caller: list[str], branches: int) -> int | None:
    """The branch a conditional runs when its index is a constant of the computation it is in, else None.
    An index out of range runs the last branch, as XLA's conditional does."""
    d = _DEF.match(line)
    if d is None or d.group("op") != "conditional" or not d.group("args").strip():
        return None
    index = _constant(d.group("args").split(",")[0].split()[-1].lstrip("%"), _defs(caller)[0])
    if index is None:
        return None
    return index if 0 <= index < branches else branches - 1


def runs(found: dict[str, list[str]], entry: str | None) -> dict[str, int | None]:
    """How many times each computation (as `computations` reads them) runs for one call of the program
    (None: not countable)."""
    times: dict[str, int | None] = {}

    def visit(name: str, count: int | None, depth: int) -> None:
        if depth > 64 or name not in found:
            return
        before = times.get(name, 0)
        times[name] = None if before is None or count is None else before + count
        for line in found[name]:
            for child, each in _calls(line, found, found[name]):
                visit(child, None if count is None or each is None else count * each, depth + 1)

    visit("", 1, 0)
    if entry is not None:
        visit(entry, 1, 0)
    return times


def collectives_in(hlo: str, devices: int) -> list[dict]:
    """Every collective the program runs for one call, once per run (a loop's collective as many times
    as the loop's steps): op, result shape, and the devices that take part together."""
    found, entry = computations(hlo)
    times = runs(found, entry)
    listed: list[dict] = []
    for name, lines in found.items():
        # An async pair (`-start`, `-done`) sends what its `-done` gives: the TPU compiler's
        # collective-permute-start is a tuple of the buffer sent, the buffer received and two counters.
        done = {d.group("start"): d.group("shape") for d in map(_DONE.search, lines) if d}
        for line in lines:
            m = _OP.search(line)
            if not m or "-done(" in line or _HEADER.match(line):
                continue
            named = _NAME.match(line)
            shape = done.get(named.group("name"), m.group("shape")) if named else m.group("shape")
            count = times.get(name, 1)  # a computation nothing calls is counted once, never left out
            if count is None:
                raise ValueError(
                    "a collective inside a loop whose number of steps the compiler cannot count "
                    f"({m.group('op')}): give the loop a fixed number of steps, or write it as a "
                    "Python for loop, so that what it sends can be counted"
                )
            item = {"op": m.group("op"), "shape": _compact(shape)}
            pairs = _PAIRS.search(line)
            groups = _GROUPS.search(line)
            if pairs:
                item["pairs"] = [
                    [int(a), int(b)] for a, b in re.findall(r"\{(\d+),\s*(\d+)\}", pairs.group("p"))
                ]
            elif groups:
                item["groups"] = parse_groups(groups.group("g"), devices)
            elif "replica_groups=" in line:  # a form not read here: never taken for every device
                raise ValueError(f"replica groups in a form this reader does not know: {line.strip()[:160]}")
            else:
                item["groups"] = [list(range(devices))]
            if len(listed) + count > MOST:
                raise ValueError(f"the program runs more than {MOST} collectives for one call")
            listed.extend(dict(item) for _ in range(count))
    return listed


_SHAPED = re.compile(r"%?(?P<name>[\w.\-]+)\s*[:=]\s*(?P<shape>[a-z][a-z0-9]*\[[\d,]*\])")
_DOT = re.compile(
    r"%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>[a-z][a-z0-9]*\[[\d,]*\])\S*\s+"
    r"(?P<op>dot|convolution)\(%(?P<lhs>[\w.\-]+)"
)
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{(?P<d>[\d,]*)\}")


def _dims(shape: str) -> list[int]:
    inside = shape[shape.index("[") + 1 : shape.index("]")]
    return [int(v) for v in inside.split(",") if v]


_LABELS = re.compile(r"dim_labels=(?P<lhs>[a-z0-9]+)_[a-z0-9]+->[a-z0-9]+")
_WINDOW = re.compile(r"window=\{size=(?P<size>\d+(?:x\d+)*)")


def _summed(line: str, op: str, lhs: str) -> int | None:
    """How many products each output element of a product sums: a `dot`'s contracting dimensions, or the
    input feature dimension (`f`) of a `convolution` that is a matrix product (the TPU compiler writes
    `x @ w` so: `dim_labels=bf_io->bf`), times its window's size where it has one (the TPU compiler's
    windowed products inside a collective matmul's loop). None with groups or dilation, which this reader
    does not count."""
    dims = _dims(lhs)
    if op == "dot":
        contracting = _CONTRACTING.search(line)
        if not contracting:
            return None
        return math.prod(dims[int(i)] for i in contracting.group("d").split(",") if i)
    labels = _LABELS.search(line)
    if not labels or "_group_count=" in line or "_dilate=" in line or len(labels.group("lhs")) != len(dims):
        return None
    if "f" not in labels.group("lhs"):
        return None
    window = _WINDOW.search(
        line
    )  # a matrix product the TPU compiler split into windows: each sums f x window
    sizes = [int(v) for v in window.group("size").split("x")] if window else []
    if len(sizes) != sum(c.isdigit() for c in labels.group("lhs")):  # one size per spatial dimension
        return None
    return dims[labels.group("lhs").index("f")] * math.prod(sizes)


def loop_flops(hlo: str) -> float:
    """The FLOPs of matrix products that XLA's cost analysis leaves out: those of a loop's body for each
    step after the first. A product in a loop whose steps cannot be counted is refused (ValueError)."""
    found, entry = computations(hlo)
    times = runs(found, entry)
    extra = 0.0
    for name, lines in found.items():
        count = times.get(name, 1)
        shapes = {m.group("name"): m.group("shape") for line in lines for m in _SHAPED.finditer(line)}
        for line in lines:
            dot = _DOT.search(line)
            if not dot or _HEADER.match(line):
                continue
            if count is None:
                raise ValueError(
                    "a matrix product inside a loop whose number of steps the compiler cannot count: "
                    "the work it does cannot be known from the program"
                )
            if count <= 1:
                continue
            lhs = shapes.get(dot.group("lhs"))
            summed = _summed(line, dot.group("op"), lhs) if lhs is not None else None
            if summed is None:
                raise ValueError(f"a {dot.group('op')} inside a loop whose work this reader cannot count")
            extra += (count - 1) * 2.0 * math.prod(_dims(dot.group("shape"))) * summed
    return extra
