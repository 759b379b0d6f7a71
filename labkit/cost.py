"""The cost card: what one examined call's compiled program costs each device, and a step time on real chips.

From the facts the kit reads off a compiled program (`labkit.facts`: per-device FLOPs, the bytes
each device holds, every collective with the devices that take part) the card gives, per device:

* work: FLOPs;
* memory: bytes held (arguments, outputs, temporaries);
* communication: bytes sent, per collective kind, under the standard ring algorithms;

and a modelled time on named chips (`chips.toml`, each figure with its source), split into
compute, memory (HBM) and communication, with the bound that dominates named in words.

The ring costs, for a collective over a group of n devices (B: the bytes named below):

| collective | B is | bytes each device sends |
| --- | --- | --- |
| all-reduce | the array reduced | 2 (n-1)/n B (a reduce-scatter, then an all-gather) |
| all-gather | the gathered result | (n-1)/n B |
| reduce-scatter | the array before scattering (n times the result) | (n-1)/n B |
| all-to-all | the array exchanged | (n-1)/n B |
| collective-permute | the array sent | B (once, to its one target) |

What a device sends is its own data. On a TPU's torus an all-to-all's blocks also pass through the chips
between source and target, so its links carry more than that: `Chip.forwarded` (about width / 4 times, the
book's quarter of the whole array a link); its time counts them.

Time on a chip: compute = FLOPs / peak (bfloat16, or float32 by the outputs' dtype: at JAX's default
precision, one bfloat16 pass on a TPU and TensorFloat-32 on an H100, unless "highest" is asked for);
memory = bytes held / HBM bandwidth (each byte read or written once: a lower bound); communication =
bytes sent / the chip's send bandwidth along one mesh axis (a ring's two ports), half that for a ring
of fewer chips than the torus wraps around (`wraparound_from`: a line, whose end chips receive through
one link), a collective-permute's over the one link (port) it sends on. The parts are not added: the slowest bounds the step
(with perfect overlap), and the card names it. A model, not a measurement: the course's "Reading
the cost card" says what it leaves out.

Latency: each hop between neighbouring chips takes a fixed time whatever it carries (`hop_latency`, the
book "How to Scale Your Model", part 3: about a microsecond over an ICI link), so a collective takes at
least its hops' time (`Chip.hops`: width - 1 on a line, width // 2 round a ring, twice for an all-reduce,
one for a collective-permute). `timing(chip, latency=True)` times each kind and group width of collective
at the larger of that and its bytes over the bandwidth; the default leaves latency out of the step (the
labs' exercises and the leaderboard read the bandwidth model) and gives it beside, in `Timing.latency`,
which the card names where it would bound the step. BENCHMARKS.md ("Calibrating the cost card") sets the
model beside the TPU compiler's own estimate and the book's figures.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from labkit.judge import budgets, callplan, hlo
from labkit.statuses import JudgedBy

CHIPS_FILE = Path(__file__).with_name("chips.toml")


@dataclass(frozen=True)
class Chip:
    key: str
    name: str
    bf16_flops: float
    f32_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    send_bandwidth: float
    link_bandwidth: float  # one port, one way: what a collective-permute to one device sends over
    topology: str
    source: str
    f32_default_flops: float = 0.0  # a float32 product at JAX's default precision (0: as `f32_flops`)
    wraparound_from: int = 0  # the smallest ring with a wraparound link (0: every chip reaches every other)
    hop_latency: float = 0.0  # seconds a hop between neighbouring chips takes, whatever it carries (0: none)

    def f32_peak(self, precision: str = "default") -> float:
        """FLOP/s of float32 products at JAX's `precision`: "highest" (float32 throughout) or its default."""
        return (
            self.f32_flops if precision == "highest" or not self.f32_default_flops else self.f32_default_flops
        )

    def ring_bandwidth(self, width: int) -> float:
        """Bytes per second one chip sends into a ring collective over `width` chips: a smaller ring than the
        torus wraps around is a line, whose end chips receive through one link only."""
        return self.send_bandwidth / 2 if 1 < width < self.wraparound_from else self.send_bandwidth

    def forwarded(self, op: str, width: int) -> float:
        """How many times over the links of a ring of `width` chips carry what each chip sends itself for `op`.

        On a torus (a ring, or a line under `wraparound_from`) an all-to-all's blocks pass through the chips
        between their source and their target: a chip's links carry others' blocks on their way as well as its
        own, floor(width^2 / 4) / (width - 1) times its own in all (the book "How to Scale Your Model", part 3:
        on a ring each link carries a quarter of the whole array; on a line the middle link carries as much one
        way). Every other ring collective passes each byte over one link; a switch (`wraparound_from` 0, an
        H100's NVLink) takes every block straight to its target."""
        if op != "all-to-all" or width <= 2 or not self.wraparound_from:
            return 1.0
        return (width * width // 4) / (width - 1)

    def hops(self, op: str, width: int) -> int:
        """The hops one collective `op` over `width` chips makes one after another, each at `hop_latency` at the
        least: a ring's shards travel halfway round it (width // 2), a line's from one end to the other
        (width - 1); an all-reduce is a reduce-scatter then an all-gather (twice that); a collective-permute
        crosses the one link it sends on."""
        if width <= 1:
            return 0
        if op == "collective-permute":
            return 1
        one_way = width - 1 if width < self.wraparound_from else width // 2
        return 2 * one_way if op == "all-reduce" else one_way


def chips(path: Path = CHIPS_FILE) -> dict[str, Chip]:
    """The chips of `chips.toml`, by key (v5e, v6e, h100)."""
    data = tomllib.loads(Path(path).read_text())
    return {key: Chip(key=key, **entry) for key, entry in data.items()}


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO result shape: `f32[8,4]{1,0}`, or a tuple `(f32[8], bf16[2,2])` (summed); an element
    type whose size is not known is refused by name (`hlo.Unreadable`), never counted as 0 bytes."""
    return hlo.shape_bytes(shape)


def bytes_sent(op: str, result_bytes: int, n: int) -> float:
    """Bytes one device sends for collective `op` over `n` devices, whose HLO result is `result_bytes`."""
    if n <= 1:
        return 0.0
    if op == "all-reduce":
        return 2 * (n - 1) / n * result_bytes
    if op == "all-gather":
        return (n - 1) / n * result_bytes
    if op == "reduce-scatter":
        return (n - 1) / n * (n * result_bytes)
    if op == "all-to-all":
        return (n - 1) / n * result_bytes
    if op == "collective-permute":
        return float(result_bytes)
    raise ValueError(f"no cost model for the collective {op!r}")


def permute_width(pairs) -> int:
    """The `n` a collective-permute counts as: 2 (one device sends to another), or 1 when every pair sends a
    device's data to itself (a ring of one device): that moves nothing across the network."""
    return 2 if any(a != b for a, b in pairs) else 1


def group_width(pairs, groups, devices: int) -> int:
    """The `n` one collective counts as: a permute's width, else its largest group, else (a program that names
    no groups) every device of the program. The card and the lab tests' `sent_per_device` both count so."""
    if pairs:
        return permute_width(pairs)
    return max((len(g) for g in groups or ()), default=0) or devices


@dataclass
class Timing:
    chip: str
    compute: float  # seconds
    memory: float
    communication: float
    fits: bool  # the bytes held fit the chip's HBM
    # The least time the program's collectives take on the chip's hops whatever their size (`Chip.hops`), each
    # hop at `hop_latency`: 0 where the chip gives no latency or the card does not record its collectives by
    # group width (an older kit's). In `communication` only where `timing(..., latency=True)` was asked.
    latency: float = 0.0

    @property
    def bound(self) -> str:
        parts = {"compute": self.compute, "memory": self.memory, "communication": self.communication}
        return max(parts, key=parts.get)

    @property
    def step(self) -> float:
        return max(self.compute, self.memory, self.communication)


@dataclass
class Card:
    devices: int
    flops: float
    held: dict[str, int]  # argument, output, temp (bytes per device)
    sent: dict[str, float] = field(default_factory=dict)  # collective kind -> bytes each device sends
    counts: dict[str, int] = field(default_factory=dict)  # collective kind -> how many in the program
    dtype: str = "f32"
    # The TPU compiler's own estimate on a compile-only TPU configuration: {"on", "seconds", "flops", "bytes"}.
    compiler: dict | None = None
    # collective kind -> {group width (as text): bytes each device sends over groups of that width}; the
    # sum over widths is `sent`. Empty in a card an older kit wrote: each ring is then timed as one of
    # `devices` chips, which no group is wider than (exact under 16 devices, where every ring is a line).
    widths: dict[str, dict[str, float]] = field(default_factory=dict)
    # collective kind -> {group width (as text): how many collectives of that kind run over groups of that
    # width}: what a collective's latency is counted from. Empty in a card an older kit wrote: no latency then.
    collectives: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def held_total(self) -> int:
        return sum(self.held.values())

    @property
    def sent_total(self) -> float:
        return sum(self.sent.values())

    def timing(self, chip: Chip, precision: str = "default", latency: bool = False) -> Timing:
        """The card on `chip`; `precision`: JAX's matmul precision for float32 products ("default" or "highest").

        `latency`: the communication part is, for the collectives of each kind and group width, the larger of
        their bytes over the bandwidth and their hops at the chip's `hop_latency` (the book "How to Scale Your
        Model", part 3: a small collective is latency-bound); without it (the default, which the labs' exercises
        and the leaderboard read), the bytes over the bandwidth alone, and `Timing.latency` says the rest."""
        peak = chip.bf16_flops if self.dtype == "bf16" else chip.f32_peak(precision)
        wire = floor = network = 0.0
        for op, b in sorted(self.sent.items()):  # one order, so one sum: a card read back times the same
            groups = self.widths.get(op) or {str(self.devices): b}  # an older kit's card: no group is wider
            for w, part in sorted(groups.items()):
                rate = chip.link_bandwidth if op == "collective-permute" else chip.ring_bandwidth(int(w))
                seconds = part * chip.forwarded(op, int(w)) / rate
                hops = self.collectives.get(op, {}).get(w, 0) * chip.hops(op, int(w)) * chip.hop_latency
                wire, floor, network = wire + seconds, floor + hops, network + max(seconds, hops)
        return Timing(
            chip.key,
            self.flops / peak,
            self.held_total / chip.hbm_bandwidth,
            network if latency else wire,
            self.held_total <= chip.hbm_bytes,
            floor,
        )

    def to_json(self) -> dict:
        return {
            "devices": self.devices,
            "flops": self.flops,
            "held": self.held,
            "sent": self.sent,
            "counts": self.counts,
            "dtype": self.dtype,
            **({"compiler": self.compiler} if self.compiler else {}),
            **({"widths": self.widths} if self.widths else {}),
            **({"collectives": self.collectives} if self.collectives else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> Card:
        return cls(**data)


class NoCard(ValueError):
    """The facts lack what a card needs (the program could not be examined); the message says what."""


def card(facts: dict) -> Card:
    """The card of one examined call, from its facts (`labkit.facts.gather`'s plain data)."""
    if not isinstance(facts, dict) or "unavailable" in facts:
        raise NoCard((facts or {}).get("unavailable", "no facts") if isinstance(facts, dict) else "no facts")
    flops, memory, collectives = facts.get("flops"), facts.get("memory"), facts.get("collectives")
    for name, value in (("FLOPs", flops), ("memory", memory), ("collectives", collectives)):
        if value is None or (isinstance(value, dict) and "unavailable" in value):
            raise NoCard(f"the compiled program gave no {name}")
    held = {k: int(memory.get(k, 0)) for k in ("argument", "output", "temp")}
    sent: dict[str, float] = {}
    counts: dict[str, int] = {}
    widths: dict[str, dict[str, float]] = {}
    per_width: dict[str, dict[str, int]] = {}
    for c in collectives:
        n = group_width(c.get("pairs"), c.get("groups"), int(facts["devices"]))
        moved = bytes_sent(c["op"], shape_bytes(c["shape"]), n)
        if moved:
            sent[c["op"]] = sent.get(c["op"], 0.0) + moved
            counts[c["op"]] = counts.get(c["op"], 0) + 1
            by_width = widths.setdefault(c["op"], {})
            by_width[str(n)] = by_width.get(str(n), 0.0) + moved
            how_many = per_width.setdefault(c["op"], {})
            how_many[str(n)] = how_many.get(str(n), 0) + 1
    outputs = facts.get("outputs") if isinstance(facts.get("outputs"), list) else []
    dtype = "bf16" if outputs and all(o.get("dtype") == "bfloat16" for o in outputs) else "f32"
    estimate = facts.get("compiler")
    compiler = (
        {
            "on": str(facts.get("compiled_for") or "the compiler"),
            **{k: float(estimate[k]) for k in ("seconds", "flops", "bytes")},
        }
        if isinstance(estimate, dict) and "seconds" in estimate
        else None
    )
    return Card(int(facts["devices"]), float(flops), held, sent, counts, dtype, compiler, widths, per_width)


# ----------------------------------------------------------------------------------------
# Words: what a student reads.
# ----------------------------------------------------------------------------------------


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float) -> str:
    """A modelled time; under a nanosecond it is "under 1 ns" (no chip does anything useful in a picosecond:
    such a figure says only that the step does next to nothing)."""
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return "0 s" if s <= 0 else "under 1 ns"


def format_flops(f: float) -> str:
    for unit, size in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if f >= size:
            return f"{f / size:.3g} {unit}"
    return f"{f:.0f} FLOP"


BOUND_WORDS = {"compute": "compute-bound", "memory": "memory-bound", "communication": "communication-bound"}
LEGEND = (
    "compute-bound: the chip's arithmetic is the limit; memory-bound: reading and writing its HBM; "
    "communication-bound: the interconnect between chips"
)


def compare(mine: Card, reference: Card) -> list[str]:
    """Where `mine` costs more than the reference's card for the same call (factors of 1.5 or more)."""
    notes = []
    for what, a, b in (
        ("the bytes each device sends", mine.sent_total, reference.sent_total),
        ("the bytes each device holds", mine.held_total, reference.held_total),
        ("the FLOPs each device computes", mine.flops, reference.flops),
    ):
        if b > 0 and a >= 1.5 * b:
            notes.append(f"your program has {a / b:.1f}x {what} that the reference needs")
        elif b == 0 and a > 0 and what.startswith("the bytes each device sends"):
            notes.append(f"your program sends {format_bytes(a)} per device where the reference sends nothing")
    return notes


def _at_precision(config: str) -> str:
    """', float32 products at precision highest' on a TPU configuration's card (the program it judged was compiled
    at its precision: `configs.ACCELERATOR_MATMUL_PRECISION`), else nothing."""
    from labkit.course import configs

    found = configs.by_name(config)
    asked = found.env.get("JAX_DEFAULT_MATMUL_PRECISION") if found is not None else None
    tpu = found is not None and (found.compile_for or found.platform == "tpu")
    return f", float32 products at precision {asked}" if tpu and asked else ""


HEADLINE_CHIP = "v5e"  # the chip a card's headline times the step on, as the class leaderboards do


def headline(
    name: str,
    config: str,
    c: Card,
    reference: Card | None = None,
    ranked: bool = False,
    measured: list[dict] | None = None,
) -> str:
    """One line: the modelled step time on a TPU v5e (the figure a leaderboard ranks), the reference's beside it
    and the ratio, what bounds the step, and of the budgets the tests `measured` of this call and run
    (`labkit.judge.budgets`), the one nearest its limit (nothing where the call has none)."""
    chip = chips()[HEADLINE_CHIP]
    t = c.timing(chip)
    what = "the step the leaderboard ranks" if ranked else "a step"
    out = (
        f"{name} on {config}: {format_seconds(t.step)} {what} on a {chip.name} x{c.devices} ({t.bound}-bound)"
    )
    if reference is None:
        beside = "; no reference card for this call"
    else:
        r = reference.timing(chip).step
        ratio = f"{t.step / r:.2g}x the reference's" if r > 0 else "the reference's takes no time"
        beside = f"; the reference: {format_seconds(r)}, yours {ratio}"
    return out + beside + budgets.said(measured or [])


def lines(
    name: str,
    config: str,
    c: Card,
    chip_list: list[Chip],
    reference: Card | None = None,
    ranked: bool = False,
    measured: list[dict] | None = None,
) -> list[str]:
    """The card as text: a headline (`headline`, with the budget nearest its limit of those `measured`), the
    facts, one line per chip, how it compares with the reference."""
    sent = ", ".join(
        f"{op} {format_bytes(b)} ({c.counts[op]} in the program)" for op, b in sorted(c.sent.items())
    )
    held = (
        f"arguments {format_bytes(c.held['argument'])}, outputs {format_bytes(c.held['output'])}, "
        f"temporaries {format_bytes(c.held['temp'])}"
    )
    out = [
        headline(name, config, c, reference, ranked, measured),
        f"  {name} on {config} ({c.devices} devices{_at_precision(config)}), per device:",
        f"  {format_flops(c.flops)}; holds {format_bytes(c.held_total)} ({held})",
        f"  sends {sent or 'nothing'}",
    ]
    for chip in chip_list:
        t = c.timing(chip)
        fits = "" if t.fits else f"; does not fit its {format_bytes(chip.hbm_bytes)} of HBM"
        hops = (
            f", and at this size latency-bound: its collectives' hops take at least {format_seconds(t.latency)} "
            f"({format_seconds(chip.hop_latency)} a hop)"
            if c.timing(chip, latency=True).step > t.step
            else ""
        )
        out.append(
            f"  {chip.name} x{c.devices}: compute {format_seconds(t.compute)}, HBM {format_seconds(t.memory)}, "
            f"network {format_seconds(t.communication)}: {BOUND_WORDS[t.bound]}{hops}{fits}"
        )
    if c.compiler:  # the compiler's own figures, beside the hand model's above
        out.append(
            f"  {c.compiler['on']}, the compiler's own estimate: step {format_seconds(c.compiler['seconds'])}; "
            f"{format_flops(c.compiler['flops'])} and {format_bytes(c.compiler['bytes'])} of HBM traffic per "
            f"device"
        )
    if reference is not None:
        notes = compare(c, reference)
        out += [f"  {n}" for n in notes] or ["  about what the reference solution costs"]
    return out


# ----------------------------------------------------------------------------------------
# The cards of a lab's runs, and the reference's, kept beside the lab's public tests.
# ----------------------------------------------------------------------------------------

REFERENCE_FILE = "reference_costs.json"  # in tests/public/lab_<N>/: what the reference solution's calls cost
SHOWN = ("v5e", "v6e", "h100")


@dataclass
class Examined:
    """One examined call: its function, and its card in each run (of several devices) that examined it.
    `at_size`: the call at a production size (`checks.shaped`), compiled for a TPU topology, never run."""

    function: str
    runs: dict[str, Card] = field(default_factory=dict)
    at_size: bool = False
    # the runs whose card is the run's own report, not read from a program the kit verified (a multi-process
    # run's): shown, never ranked (labkit/grading/classwide/leaderboard.py)
    reported: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"{self.function} at a production size" if self.at_size else self.function


def cards(calls: list[callplan.CallSpec], results: dict[str, dict]) -> dict[str, Examined]:
    """call id -> its cards, for the first examined call of each function (runs on one device left out), and the
    first at a production size apart (`Examined.at_size`).

    `results`: run label -> that run's results by call id (`RunRecord.results`)."""
    found: dict[str, Examined] = {}
    shown: set[tuple[str, bool]] = set()
    for call in calls:
        kind = (call.get("function"), callplan.compile_only(call))
        if not call.get("facts") or kind in shown:
            continue
        entry = Examined(call["function"], at_size=kind[1])
        for label, by_id in results.items():
            result = (by_id or {}).get(call["id"], {})
            try:
                c = card(result["facts"]) if "facts" in result else None
            except NoCard:
                c = None
            if c is not None and c.devices > 1:
                entry.runs[label] = c
                if result.get("judged_by") != JudgedBy.VERIFIED:
                    entry.reported.add(label)
        if entry.runs:
            found[call["id"]] = entry
            shown.add(kind)
    return found


def why_none(calls: list[callplan.CallSpec], results: dict[str, dict]) -> str:
    """One line saying why `cards` found no card although a test examines a compiled program ("" otherwise):
    every run was on one device (nothing is split or sent there), or no run's program could be examined."""
    examined = [c for c in calls if c.get("facts")]
    if not examined:
        return ""
    seen = []
    for by_id in results.values():
        for call in examined:
            facts = ((by_id or {}).get(call["id"]) or {}).get("facts")
            usable = isinstance(facts, dict) and "unavailable" not in facts
            seen.append(int(facts.get("devices") or 0) if usable else 0)
    if 1 in seen and all(d <= 1 for d in seen):
        return (
            "No cost card: every run examined was on one device, where nothing is split and nothing is sent. "
            "Run on several devices (cpu-8) to see what each device computes, holds and sends."
        )
    return (
        "No cost card: the compiled program could not be examined in any run (a run failed, or the exercise "
        "did not return a result); fix the first failure above and check again."
    )


def to_json(found: dict[str, Examined]) -> dict:
    return {
        cid: {"function": e.function, "runs": {label: c.to_json() for label, c in sorted(e.runs.items())}}
        | ({"at_size": True} if e.at_size else {})
        | ({"reported": sorted(e.reported)} if e.reported else {})
        for cid, e in sorted(found.items())
    }


def from_json(data: dict) -> dict[str, Examined]:
    return {
        cid: Examined(
            e["function"],
            {label: Card.from_json(c) for label, c in e["runs"].items()},
            e.get("at_size") is True,
            {str(label) for label in e.get("reported", [])},
        )
        for cid, e in data.items()
    }


def read_reference(folder: Path) -> dict[str, Examined]:
    """The reference solution's cards for a lab (empty when none were recorded)."""
    try:
        return from_json(json.loads((Path(folder) / REFERENCE_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_reference(folder: Path, found: dict[str, Examined]) -> Path:
    path = Path(folder) / REFERENCE_FILE
    path.write_text(json.dumps(to_json(found), indent=1, sort_keys=True) + "\n")
    return path


def text(
    found: dict[str, Examined],
    reference: dict[str, Examined] | None = None,
    ranked: tuple[str, str] | None = None,
    measured: list[dict] | None = None,
) -> list[str]:
    """Every card of a lab's runs, as lines, each compared with the reference's card for the same call and run.
    `ranked`: the (function, configuration) the lab's leaderboard ranks, named in that card's headline;
    `measured`: what the tests' budget checks measured (`Outcome.budgets`), the nearest named there too."""
    if not found:
        return []
    chip_list = shown_chips()
    out = [
        "Cost cards: what your compiled programs cost each device, modelled on real chips",
        "(a model, not a measurement: see docs/student.md, 'The cost card'). " + LEGEND + ".",
    ]
    for cid, entry in found.items():
        for label, c in entry.runs.items():
            ref = (reference or {}).get(cid, Examined(entry.function)).runs.get(label)
            mine = budgets.of(measured or [], entry.function, entry.at_size, label)
            out += lines(entry.name, label, c, chip_list, ref, ranked == (entry.function, label), mine)
    return out


def html(
    found: dict[str, Examined],
    reference: dict[str, Examined] | None = None,
    ranked: tuple[str, str] | None = None,
    measured: list[dict] | None = None,
) -> str:
    """The cards as a small HTML table for Jupyter: per call and run, the headline (`measured`: as `text`), then
    per chip the modelled step of yours and the reference's as bars on one scale. Every name is escaped."""
    from html import escape

    rows = []
    for cid, entry in found.items():
        for label, c in entry.runs.items():
            ref = (reference or {}).get(cid, Examined(entry.function)).runs.get(label)
            mine = budgets.of(measured or [], entry.function, entry.at_size, label)
            head = headline(entry.name, label, c, ref, ranked == (entry.function, label), mine)
            rows.append(f'<tr><th colspan="3" style="text-align:left">{escape(head)}</th></tr>')
            steps = [
                (chip, c.timing(chip).step, ref.timing(chip).step if ref else None) for chip in shown_chips()
            ]
            scale = max([s for _, a, b in steps for s in (a, b) if s] or [1.0])
            for chip, mine, theirs in steps:
                bars = _bar("yours", mine, scale, "#d62728") + (
                    _bar("reference", theirs, scale, "#1f77b4") if theirs is not None else ""
                )
                rows.append(f"<tr><td>{escape(chip.name)} x{c.devices}</td><td>{bars}</td></tr>")
    return '<table class="labkit-cards">' + "".join(rows) + "</table>" if rows else ""


def shown_chips() -> list[Chip]:
    """The chips a card times the step on (SHOWN)."""
    return [chips()[k] for k in SHOWN]


def _bar(who: str, seconds: float, scale: float, colour: str) -> str:
    width = max(1, round(200 * seconds / scale)) if scale > 0 else 1
    return (
        f'<div><span style="display:inline-block;width:{width}px;height:0.8em;background:{colour}"></span> '
        f"{who}: {format_seconds(seconds)}</div>"
    )
