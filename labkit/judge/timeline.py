"""A picture of the schedule: one device's timeline of a compiled program (pure Python: tested without JAX).

XLA prints a scheduled program (`is_scheduled=true`) with each computation's instructions in the order
they run. Read in that order, the entry computation (its loops by their trip counts) is a list of steps
(`steps`): compute (FLOPs and the HBM bytes it reads and writes), and each collective with the bytes one
device sends for it (`cost.bytes_sent`, over the widest group, as the card counts it). An asynchronous
collective is a start and a done: it runs on the network beside the compute scheduled between the two,
and the device waits at the done only for what is left of it; a synchronous one blocks the device for
its whole time. The steps are numbers and the kit's own op names only (never a string of the program),
a loop written once with its trip count (`loop`), so that they travel in a call's facts, bounded.

`schedule` times the steps on a named chip with the card's model (`labkit.cost`): a step of compute takes
its FLOPs at the chip's peak, or its HBM bytes over the chip's bandwidth where that is longer; a collective
its bytes over the bandwidth of the link or ring it uses. Collectives take the network one after another.
The time the device waits on communication that no compute overlaps is its idle time. `svg` draws it.

What it is: a model of one device, from one program. Where libtpu compiled the program (a compile-only
TPU configuration) the order is the TPU compiler's own schedule, its async collectives included; on
XLA:CPU the order is that compiler's, whose collectives are all synchronous. Neither is a measurement:
the real chip's overlap, its latencies and the other devices' skew are not in it.
"""

from __future__ import annotations

import html
import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from labkit import cost
from labkit.judge import hlo

OPS = ("compute", *hlo.COLLECTIVES, "done", "loop")
MOST_STEPS = 400  # steps carried in the facts (a loop's body once): more is refused, not cut
MOST_EVENTS = 200_000  # steps timed once loops are unrolled
DRAWN = 200  # segments drawn for one timeline; the rest are summarised in words

# Instructions that neither compute nor communicate: naming, packing and the compiler's own copies into fast
# memory (`copy-start`/`copy-done`: a DMA beside the compute).
_FREE = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "copy-start",
        "copy-done",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
        "domain",
        "async-update",
        "iota",
    }
)
_DONES = frozenset(f"{op}-done" for op in ("all-reduce", "all-gather", "collective-permute")) | {"async-done"}


# ----------------------------------------------------------------------------------------
# Steps, read from the program.
# ----------------------------------------------------------------------------------------


class _Steps:
    """The steps of one computation, in schedule order, consecutive compute merged into one."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.sealed = 0  # items before this index are not merged into (a loop's body)

    def compute(self, flops: float, moved: float) -> None:
        if not flops and not moved:
            return
        last = self.items[-1] if len(self.items) > self.sealed else None
        if last is not None and last["op"] == "compute":
            last["flops"] = last.get("flops", 0.0) + flops
            last["bytes"] = last.get("bytes", 0.0) + moved
            return
        self.items.append({"op": "compute", "flops": float(flops), "bytes": float(moved)})

    def add(self, item: dict) -> None:
        self.items.append(item)

    def loop(self, times: int, body: list[dict]) -> None:
        if not body or times <= 0:
            return
        if all(s["op"] == "compute" for s in body):  # a loop that only computes: one step, its whole work
            self.compute(
                times * sum(s.get("flops", 0.0) for s in body), times * sum(s.get("bytes", 0.0) for s in body)
            )
            return
        if times > 1:
            self.items.append({"op": "loop", "times": times, "length": len(body)})
        self.items.extend(body)
        self.sealed = len(self.items)


class _Reader:
    def __init__(self, module: hlo.Module, devices: int):
        self.module, self.devices = module, devices
        self.tags = 0

    def flops(self, name: str, depth: int = 0) -> float:
        """The FLOPs of one run of a called computation (a fusion's), what it calls included."""
        computation = self.module.computations.get(name)
        if computation is None or depth > 32:
            return 0.0
        shapes = {i.name: i.shape for i in computation.instructions}
        total = 0.0
        for i in computation.instructions:
            total += hlo._work(i, shapes)
            for key in ("calls", "called_computations"):
                for child in hlo._names(i.attributes.get(key, "")):
                    total += self.flops(child, depth + 1)
        return total

    def collective(self, i: hlo.Instruction) -> dict | None:
        """The step of a collective instruction (or of the collective an `async-start` wraps), or None."""
        item = hlo._collective(i, self.devices)
        if item is None and i.opcode == "async-start":
            for child in hlo._names(i.attributes.get("calls", "")):
                for inner in self.module.computations.get(child, hlo.Computation(child)).instructions:
                    item = item or hlo._collective(inner, self.devices)
        if item is None:
            return None
        width = cost.group_width(item.get("pairs"), item.get("groups"), self.devices)
        sent = cost.bytes_sent(item["op"], hlo.shape_bytes(item["shape"]), width)
        return {"op": item["op"], "sent": float(sent), "width": int(width)}

    def walk(self, name: str, depth: int = 0) -> list[dict]:
        computation = self.module.computations.get(name)
        if computation is None or depth > 32:
            return []
        out = _Steps()
        shapes = {i.name: i.shape for i in computation.instructions}
        started: dict[str, int] = {}  # an async start's (or update's) name -> its tag
        for i in computation.instructions:
            op = i.opcode
            if op == "async-update" and i.operands and i.operands[0] in started:
                started[i.name] = started[i.operands[0]]
            if op in _FREE:
                continue
            if op == "while":
                times = hlo._trip_count(i, self.module, computation)
                body = self.walk(i.attributes.get("body", "").lstrip("%"), depth + 1)
                if body and times is None:
                    raise hlo.Unreadable("a loop whose number of steps cannot be counted")
                out.loop(times or 0, body)
                continue
            if op in ("call", "conditional"):
                names = [n for key in ("to_apply", "calls") for n in hlo._names(i.attributes.get(key, ""))]
                if op == "conditional":
                    branches = hlo._calls(i, self.module, computation)
                    names = [n for n, times, _ in branches if times]
                for n in names:  # its steps as they are (a loop's body is never merged into)
                    out.items.extend(self.walk(n, depth + 1))
                    out.sealed = len(out.items)
                continue
            # a done of a collective waits for it; one of async compute was counted at its start
            if op in _DONES:
                tag = started.pop(i.operands[0], None) if i.operands else None
                if tag is not None:
                    out.add({"op": "done", "tag": tag})
                continue
            found = self.collective(i)
            if found is not None:
                if op.endswith("-start"):
                    self.tags += 1
                    started[i.name] = found["tag"] = self.tags
                out.add(found)
                continue
            moved = hlo.shape_bytes(i.shape) + sum(
                hlo.shape_bytes(shapes[o]) for o in i.operands if o in shapes
            )
            work = hlo._work(i, shapes)
            inside: list[dict] = []
            for key in ("calls", "called_computations"):
                for child in hlo._names(i.attributes.get(key, "")):
                    work += self.flops(child)
                    inside += self.within(child)
            out.compute(work, 0.0 if op == "async-start" else moved)
            # a collective fused into a computation (the TPU's collective fusions) blocks after its compute
            for found in inside:
                out.add(found)
        return out.items

    def within(self, name: str, depth: int = 0) -> list[dict]:
        """The collectives a called computation runs (a fusion's), as steps, what it calls included."""
        computation = self.module.computations.get(name)
        if computation is None or depth > 32:
            return []
        found = []
        for i in computation.instructions:
            step = self.collective(i) if i.opcode in hlo.COLLECTIVES or i.opcode in hlo._STARTS else None
            if step is not None:
                found.append(step)
            for key in ("calls", "called_computations"):
                for child in hlo._names(i.attributes.get(key, "")):
                    found += self.within(child, depth + 1)
        return found


def steps(text: str, devices: int) -> list[dict]:
    """One device's steps of a compiled program (its optimised HLO text), in schedule order: see the module's
    text. `hlo.Unreadable` where a part cannot be read, or the program has more than MOST_STEPS steps."""
    module = hlo.parse(text)
    if module.entry is None:
        raise hlo.Unreadable("the program has no entry computation")
    found = _Reader(module, devices).walk(module.entry)
    if len(found) > MOST_STEPS:
        raise hlo.Unreadable(f"the program's schedule has more than {MOST_STEPS} steps to draw")
    return found


# ----------------------------------------------------------------------------------------
# Timing the steps on a chip.
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    op: str  # compute, a collective's op, or "wait": the device waits on the network
    lane: str  # "compute" or "network"
    start: float
    end: float
    beside: bool = False  # a collective that compute ran beside (an async one)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Schedule:
    segments: list[Segment] = field(default_factory=list)  # the first DRAWN, in time order
    total: float = 0.0  # seconds from the first step to the last
    idle: float = 0.0  # seconds the device waits on communication that no compute overlaps
    compute: float = 0.0
    network: float = 0.0
    hidden: float = 0.0  # network seconds that ran beside compute
    more: int = 0  # segments not drawn
    drawn_to: float = 0.0  # where the drawn segments end


def _unrolled(items: list[dict], lo: int = 0, hi: int | None = None, budget: list | None = None):
    """The steps with each loop's body repeated its trip count (at most MOST_EVENTS in all)."""
    budget = budget if budget is not None else [MOST_EVENTS]
    hi = len(items) if hi is None else hi
    k = lo
    while k < hi:
        s = items[k]
        if s.get("op") == "loop":
            length = int(s.get("length", 0))
            for _ in range(int(s.get("times", 1))):
                budget[0] -= 1  # an empty body repeated counts too: never a loop of nothing for ever
                if budget[0] < 0:
                    raise ValueError(f"more than {MOST_EVENTS} steps once the loops are unrolled")
                yield from _unrolled(items, k + 1, min(hi, k + 1 + length), budget)
            k += 1 + length
            continue
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError(f"more than {MOST_EVENTS} steps once the loops are unrolled")
        yield s
        k += 1


def seconds(s: dict, chip: cost.Chip, dtype: str = "f32") -> float:
    """How long one step takes on `chip` by the card's model (0 for a done or a loop)."""
    op = s.get("op")
    if op == "compute":
        peak = chip.bf16_flops if dtype == "bf16" else chip.f32_peak()
        return max(float(s.get("flops", 0.0)) / peak, float(s.get("bytes", 0.0)) / chip.hbm_bandwidth)
    if op in hlo.COLLECTIVES:
        width = int(s.get("width", 2))
        rate = chip.link_bandwidth if op == "collective-permute" else chip.ring_bandwidth(width)
        return float(s.get("sent", 0.0)) * chip.forwarded(op, width) / rate
    return 0.0


def schedule(items: list[dict], chip: cost.Chip, dtype: str = "f32") -> Schedule:
    """The steps timed on `chip`: the device's compute in order, the network taking one collective at a time,
    an async collective beside the compute until its done, a synchronous one (and a done still waiting)
    making the device wait."""
    out = Schedule()
    now = free = 0.0  # the device's clock; when the network is next free
    pending: dict[int, int] = {}  # tag -> index of its network segment
    every: list[Segment] = []

    def note(segment: Segment) -> None:
        every.append(segment)

    for s in _unrolled(items):
        op = s.get("op")
        if op == "compute":
            d = seconds(s, chip, dtype)
            if d > 0:
                note(Segment("compute", "compute", now, now + d))
                now += d
                out.compute += d
        elif op in hlo.COLLECTIVES:
            d = seconds(s, chip, dtype)
            start = max(now, free)
            free = start + d
            out.network += d
            if s.get("tag"):
                pending[int(s["tag"])] = len(every)
                note(Segment(op, "network", start, free, True))
            else:
                note(Segment(op, "network", start, free))
                if free > now:
                    note(Segment("wait", "compute", now, free))
                    out.idle += free - now
                now = max(now, free)
        elif op == "done":
            k = pending.pop(int(s.get("tag", 0)), None)
            if k is None:
                continue
            end = every[k].end
            if end > now:
                note(Segment("wait", "compute", now, end))
                out.idle += end - now
                now = end
    for k in pending.values():  # a start never waited for: the step ends when it does
        now = max(now, every[k].end)
    out.total = max(now, free)
    hidden = out.network - out.idle  # what of the network's time the device did not wait for
    out.hidden = hidden if hidden > 1e-9 * out.total else 0.0  # not a rounding's remainder
    every.sort(key=lambda g: (g.start, g.lane != "compute"))
    out.segments, out.more = every[:DRAWN], max(0, len(every) - DRAWN)
    out.drawn_to = max((g.end for g in out.segments), default=0.0)
    return out


# ----------------------------------------------------------------------------------------
# The picture.
# ----------------------------------------------------------------------------------------

COLOURS = {
    "compute": "#4e79a7",
    "all-reduce": "#e15759",
    "all-gather": "#f28e2b",
    "reduce-scatter": "#b07aa1",
    "collective-permute": "#59a14f",
    "all-to-all": "#edc948",
}
_WIDTH, _LEFT, _RIGHT, _LANE = 960, 150, 20, 22
_CHARS = 140  # characters of a line of text at 12 px that fit the picture's width


def _x(t: float, span: float) -> float:
    return _LEFT + (_WIDTH - _LEFT - _RIGHT) * (t / span if span > 0 else 0.0)


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def summary(name: str, s: Schedule) -> str:
    """The timeline in words: its time, its idle time and how much of the network time compute hid."""
    said = (
        f"{name}: {cost.format_seconds(s.total)} in all; compute {cost.format_seconds(s.compute)}, network "
        f"{cost.format_seconds(s.network)}, of which {cost.format_seconds(s.hidden)} beside compute; "
        f"idle (waiting on communication nothing overlaps) {cost.format_seconds(s.idle)}"
    )
    if s.more:
        said += (
            f"; the first {len(s.segments)} segments drawn, {s.more} more not drawn (counted in the totals)"
        )
    return said


def _block(rows: list[tuple[str, Schedule]], caption: str, ident: str, top: float) -> tuple[list[str], float]:
    """One picture's elements (its rows on one time axis, from `top`) and where it ends."""
    span = max((s.drawn_to for _, s in rows), default=0.0) or 1e-12
    said = [summary(name, s) for name, s in rows]
    out = [
        f'<g role="img" aria-labelledby="{ident}-title {ident}-desc">',
        f'<title id="{ident}-title">{_e(caption)}</title>',
        f'<desc id="{ident}-desc">{_e(". ".join(said))}</desc>',
    ]
    y = top + 4
    for line in textwrap.wrap(caption, _CHARS):  # no line wider than the picture
        y += 16
        out.append(f'<text x="8" y="{y}" font-weight="bold">{_e(line)}</text>')
    y += 10
    for name, s in rows:
        out.append(f'<text x="8" y="{y + 12}" font-weight="bold">{_e(name)}</text>')
        out.append(f'<text x="8" y="{y + 12 + _LANE}">compute</text>')
        out.append(f'<text x="8" y="{y + 12 + 2 * _LANE}">network</text>')
        for g in s.segments:
            lane_y = y + _LANE if g.lane == "compute" else y + 2 * _LANE
            x0, x1 = _x(g.start, span), _x(g.end, span)
            fill = "url(#tl-idle)" if g.op == "wait" else COLOURS.get(g.op, "#999999")
            what = "waiting on the network" if g.op == "wait" else g.op
            if g.beside:
                what += " (async: beside the compute)"
            out.append(
                f'<rect x="{x0:.2f}" y="{lane_y}" width="{max(x1 - x0, 0.5):.2f}" height="{_LANE - 4}" '
                f'fill="{fill}" stroke="#ffffff" stroke-width="0.5"><title>{_e(what)}: '
                f"{_e(cost.format_seconds(g.start))} to {_e(cost.format_seconds(g.end))}</title></rect>"
            )
        y += 3 * _LANE + 12
    axis = y
    out.append(f'<line x1="{_LEFT}" y1="{axis}" x2="{_WIDTH - _RIGHT}" y2="{axis}" stroke="#333333"/>')
    for k in range(5):
        t = span * k / 4
        out.append(
            f'<text x="{_x(t, span):.1f}" y="{axis + 14}" text-anchor="middle">{_e(cost.format_seconds(t))}</text>'
        )
    y = axis + 34
    x = 8
    legend = [("compute", COLOURS["compute"])] + [(op, COLOURS[op]) for op in hlo.COLLECTIVES]
    for label, colour in [*legend, ("idle: waiting on the network", "url(#tl-idle)")]:
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="{y}">{_e(label)}</text>')
        x += 24 + 7 * len(label)
    for line in (part for words in said for part in textwrap.wrap(words, _CHARS, subsequent_indent="  ")):
        y += 16
        out.append(f'<text x="8" y="{y}">{_e(line)}</text>')
    out.append("</g>")
    return out, y + 14


def page(pictures: list[tuple[list[tuple[str, Schedule]], str]]) -> str:
    """One SVG of several pictures, one under another: each (rows, caption), its rows (name, schedule) on one
    time axis, a compute lane (idle time hatched) and a network lane each. Plain shapes and text: no script,
    no link, no external font; every word in text, the idle totals included."""
    body, y = [], 0.0
    for k, (rows, caption) in enumerate(pictures):
        elements, y = _block(rows, caption, f"tl{k}", y)
        body += elements
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{y:.0f}" '
        f'viewBox="0 0 {_WIDTH} {y:.0f}" font-family="sans-serif" font-size="12">',
        '<defs><pattern id="tl-idle" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#999999" stroke-width="3"/></pattern></defs>',
        '<rect width="100%" height="100%" fill="#ffffff"/>',
    ]
    return "\n".join([*head, *body, "</svg>"]) + "\n"


def svg(rows: list[tuple[str, Schedule]], caption: str) -> str:
    """One picture: the timelines in `rows` (name, schedule), one above the other on the same time axis."""
    return page([(rows, caption)])


# ----------------------------------------------------------------------------------------
# From a call's facts.
# ----------------------------------------------------------------------------------------

CHIP = "v5e"  # the chip a timeline is timed on where the program was not compiled for a TPU


def chip_of(compiled_for: str | None) -> cost.Chip:
    """The chip a program compiled for (`TPU v5e 2x4` -> v5e), else the kit's first: the card's TPU v5e."""
    known = cost.chips()
    for word in str(compiled_for or "").split():
        if word.lower() in known:
            return known[word.lower()]
    return known[CHIP]


def caption(function: str, config: str, compiled_for: str | None, chip: cost.Chip) -> str:
    order = (
        f"the TPU compiler's own schedule ({compiled_for})"
        if compiled_for
        else "XLA:CPU's schedule (its collectives all synchronous)"
    )
    return (
        f"{function} on {config}: one device's timeline, in {order}, timed by the cost card's model on "
        f"{chip.name} (a model, not a measurement)"
    )


def from_facts(facts) -> dict | None:
    """A call's timeline as kept beside its card: {"steps", "compiled_for"?}, or None where there is none."""
    if not isinstance(facts, dict) or "unavailable" in facts:
        return None
    found = facts.get("timeline")
    if not isinstance(found, list) or not found:
        return None
    return {"steps": found} | (
        {"compiled_for": str(facts["compiled_for"])} if facts.get("compiled_for") else {}
    )


def gather(found: dict[str, cost.Examined], results: dict[str, dict]) -> dict:
    """call id -> {"function", "runs": {run label -> its timeline (`from_facts`) and its card's dtype}}, for the
    calls and runs that have a card (`cost.cards`'s `found`); `results`: run label -> results by call id."""
    out: dict = {}
    for cid, entry in found.items():
        runs = {}
        for label, card in entry.runs.items():
            kept = from_facts(((results.get(label) or {}).get(cid) or {}).get("facts"))
            if kept is not None:
                runs[label] = kept | {"dtype": card.dtype}
        if runs:
            out[cid] = {"function": entry.name, "runs": runs}
    return out


REFERENCE_FILE = "reference_timelines.json"  # in tests/public/lab_<N>/, beside cost.REFERENCE_FILE
FILE = "timeline.svg"  # in build/lab-<N>/: the pictures of a `make lab-N` run


def read_reference(folder: Path) -> dict:
    try:
        data = json.loads((Path(folder) / REFERENCE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_reference(folder: Path, data: dict) -> Path:
    """`data`'s runs recorded as the reference's, over those of the same call and run already recorded: a run
    on another configuration (`--configs v5e-8`) keeps the others'."""
    kept = read_reference(folder)
    for cid, entry in data.items():
        before = kept.get(cid)
        runs = before.get("runs") if isinstance(before, dict) else None
        runs = runs if isinstance(runs, dict) else {}
        kept[cid] = {"function": entry["function"], "runs": runs | entry["runs"]}
    path = Path(folder) / REFERENCE_FILE
    path.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    return path


def _timed(kept: dict) -> tuple[Schedule, str] | None:
    """A kept timeline timed on its chip: (schedule, caption's chip and order), or None where it cannot be."""
    try:
        chip = chip_of(kept.get("compiled_for"))
        return schedule(list(kept["steps"]), chip, str(kept.get("dtype", "f32"))), chip.key
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def pictures(mine: dict, reference: dict | None = None) -> list[tuple[list[tuple[str, Schedule]], str]]:
    """Each call and run of `mine` (`gather`'s) as a picture: yours, and beneath it the reference's for the same
    call and run where it is known, on the same chip."""
    out = []
    for cid, entry in sorted(mine.items()):
        for label, kept in sorted((entry.get("runs") or {}).items()):
            timed = _timed(kept)
            if timed is None:
                continue
            rows = [("yours", timed[0])]
            recorded = (reference or {}).get(cid)
            runs = recorded.get("runs") if isinstance(recorded, dict) else None
            theirs = runs.get(label) if isinstance(runs, dict) else None
            if isinstance(theirs, dict):
                # timed on the student's chip, so that the two share one axis
                again = _timed(theirs | {"compiled_for": kept.get("compiled_for")})
                if again is not None:
                    rows.append(("the reference's", again[0]))
            chip = chip_of(kept.get("compiled_for"))
            out.append(
                (rows, caption(str(entry.get("function", cid)), label, kept.get("compiled_for"), chip))
            )
    return out


def write(folder: Path, mine: dict, reference: dict | None = None) -> Path | None:
    """`make lab-N`'s picture (FILE in the lab's build folder), or None where no call has a timeline."""
    drawn = pictures(mine, reference)
    if not drawn:
        return None
    path = Path(folder) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(drawn))
    return path


def report(lab, judgement, out: Path, record: bool = False) -> list[str]:
    """After `make lab-N`: the timelines of its examined calls drawn into `out`/FILE beside the reference's
    (recorded as the reference's with `record`); the lines to print (the picture's path)."""
    results = {label: rec.results for label, rec in judgement.records.items()}
    mine = gather(cost.cards(judgement.calls, results), results)
    said = []
    if record and mine:  # a failed run records nothing
        said.append(f"wrote {write_reference(lab.public_tests, mine)}")
    try:
        path = write(out, mine, read_reference(lab.public_tests))
    except OSError as e:  # a build folder it cannot write: said, and the run's report goes on
        return [*said, f"No timeline drawn: {type(e).__name__}: {e}"]
    if path is not None:
        said.append(f"Timeline of each examined call (one device, the cost card's model): {path}")
    return said
