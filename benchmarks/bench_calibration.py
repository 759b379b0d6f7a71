"""Benchmark: the cost card's modelled step time against the TPU compiler's own estimate and against the book.

What it measures. Small JAX programs, built on 8 CPU devices and compiled for TPU v5e 2x4 and TPU v6e
2x4 with libtpu (no TPU needed) through the kit's own path: `facts.export` exports each program for CPU
and TPU, as the harness does on a compile-only configuration, and `judge.tpucompile.compiled_facts`
compiles it for the topology and reads its facts, as the verifier does. The programs:

* one collective each, in `shard_map` over one axis of the 8 devices: all-reduce (`psum`), all-gather,
  reduce-scatter (`psum_scatter`), all-to-all, and a collective-permute (`ppermute`) between neighbouring
  chips, each at sizes from 1 KiB to 32 MiB per device (latency to bandwidth), in float32 and bfloat16;
* a matrix product (compute-bound) and an elementwise op over a large array (HBM-bound).

For each, on each chip: libtpu's `optimal_seconds` (`cost_analysis()`, the compiler's own time
estimate, read as libtpu gives it, negative or not), the HBM bytes it counts over that time, the card's
step time on that chip (`cost.card(facts).timing(chip)`: the TPU program's collectives, as the card reads
them on a TPU configuration), the same with the hops' latency (`timing(chip, latency=True)`), and card /
compiler where the compiler gave a time above zero (none, said so, where it did not).

Then a few worked figures of the book "How to Scale Your Model" (jax-ml.github.io/scaling-book): its
formulas for a collective's time (part 3, "Sharded Matrices and How to Multiply Them"), evaluated with
its chip figures (part 2, "How to Think About TPUs"), and two times it measured, beside the card of the
same program compiled here (card with latency / book).

Usage: python benchmarks/bench_calibration.py [--only all-reduce,matmul] [--sizes 1024,33554432]
       [--dtypes float32] [--chips v5e,v6e] [--no-book] [--write]

`--write` replaces the block between the two markers of BENCHMARKS.md's calibration section with the
tables it prints. Without libtpu (`make setup EXTRAS=tpu`) it says so and stops.
"""

from __future__ import annotations

import argparse
import base64
import math
import os
import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX is imported: eight CPU devices, whatever the caller had
os.environ["JAX_NUM_CPU_DEVICES"] = "8"

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit import cost, envnames  # after the environment above
from labkit import facts as facts_module
from labkit.judge import tpucompile

BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN = "<!-- bench_calibration: begin (written by benchmarks/bench_calibration.py --write) -->"
END = "<!-- bench_calibration: end -->"
TOPOLOGIES = {"v5e": "v5e:2x4", "v6e": "v6e:2x4"}  # chip key of chips.toml -> the topology compiled for
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
OTHERS = ("matmul", "elementwise")
SIZES = (1 << 10, 16 << 10, 256 << 10, 4 << 20, 32 << 20)  # bytes each device holds of the input
DTYPES = ("float32", "bfloat16")
N = 8  # devices
ROWS = 64  # of each device's block in the collectives' programs


# ----------------------------------------------------------------------------------------
# The programs.
# ----------------------------------------------------------------------------------------


@dataclass
class Program:
    name: str  # what the table calls it
    dtype: str
    per_device: int  # bytes of its input each device holds
    fn: object = None
    args: tuple = ()


def _mesh(shape=(N,), names=("x",)):
    import jax

    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Explicit,) * len(shape))


def _spec(shape, dtype, mesh, partition):
    import jax
    from jax.sharding import NamedSharding

    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, partition))


def collective(op: str, dtype: str, per_device: int) -> Program:
    """One collective over one axis of the 8 devices, each device's `per_device` bytes a block of 64 rows (the
    TPU compiler makes a small psum_scatter, and one whose result has under 8 rows, an all-reduce then a slice)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = _mesh()
    item = jnp.dtype(dtype).itemsize
    m = max(1, per_device // item // ROWS)
    body, out = {
        "all-reduce": (lambda y: jax.lax.psum(y, "x"), P()),
        "all-gather": (lambda y: jax.lax.all_gather(y, "x", tiled=True), P()),
        "reduce-scatter": (lambda y: jax.lax.psum_scatter(y, "x", scatter_dimension=0, tiled=True), P("x")),
        "all-to-all": (lambda y: jax.lax.all_to_all(y, "x", 0, 0, tiled=True), P("x")),
        # to a neighbouring chip: devices 2k and 2k+1 of a 2x4 slice are the two chips of one row
        "collective-permute": (lambda y: jax.lax.ppermute(y, "x", [(i, i ^ 1) for i in range(N)]), P("x")),
    }[op]
    fn = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=out, check_vma=False)
    return Program(op, dtype, ROWS * m * item, fn, (_spec((N * ROWS, m), dtype, mesh, P("x")),))


def matmul(dtype: str) -> Program:
    """Each device's 1024 rows of x times a whole 4096 x 4096 w: no collective, compute-bound."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh = _mesh()
    x = _spec((N * 1024, 4096), dtype, mesh, P("x", None))
    w = _spec((4096, 4096), dtype, mesh, P())
    size = (1024 * 4096 + 4096 * 4096) * jax.numpy.dtype(dtype).itemsize
    return Program("matmul", dtype, size, jax.jit(lambda x, w: x @ w), (x, w))


def elementwise(dtype: str) -> Program:
    """x * 2 + 1 over 32 MiB of float32 a device (16 MiB in bfloat16): no collective, HBM-bound."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh = _mesh()
    elements = 8 << 20
    x = _spec((N * elements,), dtype, mesh, P("x"))
    return Program(
        "elementwise", dtype, elements * jax.numpy.dtype(dtype).itemsize, jax.jit(lambda x: x * 2 + 1), (x,)
    )


# ----------------------------------------------------------------------------------------
# Compiling through the kit's path, and reading libtpu's estimate as it gives it.
# ----------------------------------------------------------------------------------------

_RAW: list[dict] = []  # libtpu's estimate of each compile, before the kit drops a time not above zero


def _recording(original):
    def estimate(compiled):
        try:
            found = compiled.cost_analysis()
            found = found[0] if isinstance(found, (list, tuple)) else found
            _RAW.append(
                {k: float(v) for k, v in (found or {}).items() if k in ("optimal_seconds", "bytes accessed")}
            )
        except Exception:  # noqa: BLE001 - an estimate the backend cannot give is recorded as none
            _RAW.append({})
        return original(compiled)

    estimate.recording = True  # type: ignore[attr-defined]
    return estimate


def tpu_facts(program: Program, topology: str) -> tuple[dict, dict]:
    """The facts of `program` compiled for `topology` as the verifier reads them, and libtpu's raw estimate:
    {"optimal_seconds", "bytes accessed"}, each where it gave one."""
    import jax

    if not getattr(facts_module._compiler_estimate, "recording", False):
        facts_module._compiler_estimate = _recording(facts_module._compiler_estimate)
    os.environ[envnames.TPU_TOPOLOGY] = topology  # so that facts.export exports for CPU and TPU
    exported_call = facts_module.export(program.fn, program.args, {}, raising=True)
    if "program" not in exported_call:
        return {"unavailable": exported_call.get("unavailable", "not exported")}, {}
    blob = base64.b64decode(exported_call["program"])
    exported = jax.export.deserialize(bytearray(blob))
    _RAW.clear()
    facts = tpucompile.compiled_facts(
        exported,
        blob,
        topology,
        None,
        list(program.args),
        {},
        list(range(len(program.args))),
        store=tpucompile.FactsCache(),
    )
    return facts, (_RAW[-1] if _RAW else {})


# ----------------------------------------------------------------------------------------
# Rows: one program, measured on each chip.
# ----------------------------------------------------------------------------------------


@dataclass
class OnChip:
    collectives: str = ""  # the TPU program's, as the card counts them
    compiler: float | None = None  # libtpu's optimal_seconds, as it gave it (None: it gave none)
    compiler_bytes: float | None = None  # the HBM bytes it counts ("bytes accessed")
    card: float | None = None  # the card's step time: bytes over bandwidth (`timing(chip)`, the default)
    card_latency: float | None = None  # with the hops' latency (`timing(chip, latency=True)`)
    why: str = ""  # why there is no card

    @property
    def ratio(self) -> float | None:
        """card / compiler (the card's step as the kit gives it, without latency: the compiler counts none),
        where the compiler gave a time above zero."""
        if self.compiler is None or self.compiler <= 0 or not self.card:
            return None
        return self.card / self.compiler


@dataclass
class Row:
    program: str
    dtype: str
    per_device: int
    chips: dict[str, OnChip] = field(default_factory=dict)


def measure(program: Program, chip_key: str) -> OnChip:
    chip = cost.chips()[chip_key]
    facts, raw = tpu_facts(program, TOPOLOGIES[chip_key])
    found = OnChip(compiler=raw.get("optimal_seconds"), compiler_bytes=raw.get("bytes accessed"))
    try:
        card = cost.card(facts)
    except cost.NoCard as e:
        found.why = f"no card: {str(e)[:120]}"
        return found
    found.collectives = (
        ", ".join(
            f"{c['op']} {cost.format_bytes(cost.shape_bytes(c['shape']))}" for c in facts["collectives"]
        )
        or "no collective"
    )
    found.card, found.card_latency = card.timing(chip).step, card.timing(chip, latency=True).step
    return found


def programs(only: set[str], sizes, dtypes) -> list[Program]:
    out = []
    for dtype in dtypes:
        for op in COLLECTIVES:
            if op in only:
                out += [collective(op, dtype, size) for size in sizes]
        if "matmul" in only:
            out.append(matmul(dtype))
        if "elementwise" in only:
            out.append(elementwise(dtype))
    return out


def compiler_rows(only: set[str], sizes, dtypes, chip_keys) -> list[Row]:
    """Every program, measured on every chip."""
    return [
        Row(p.name, p.dtype, p.per_device, {chip: measure(p, chip) for chip in chip_keys})
        for p in programs(only, sizes, dtypes)
    ]


# ----------------------------------------------------------------------------------------
# The book's worked figures ("How to Scale Your Model", jax-ml.github.io/scaling-book).
# ----------------------------------------------------------------------------------------

# Part 2 ("How to Think About TPUs"), its table of interconnect figures: one ICI link, one way, bytes/s.
BOOK_LINK = {"v5e": 4.5e10, "v6e": 9e10}
BOOK_HOP = 1e-6  # part 3: the fixed cost of one hop over an ICI link, "typically around" a microsecond


@dataclass
class BookRow:
    what: str  # the figure, with its chapter and formula
    chip: str
    book: float  # seconds
    card: float | None = None  # the card's step time with latency
    card_plain: float | None = None  # and without
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return self.card / self.book if self.card and self.book > 0 else None


def _gather_over_four(dtype: str, rows: int, cols: int) -> Program:
    """AllGather_Y of A[E_Y, F] over the axis of 4 of a 2 x 4 mesh (the book's pop quiz uses Y = 4 of 8 x 4)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = _mesh((2, 4), ("x", "y"))
    fn = jax.shard_map(
        lambda a: jax.lax.all_gather(a, "y", tiled=True),
        mesh=mesh,
        in_specs=P("y", None),
        out_specs=P(),
        check_vma=False,
    )
    size = rows * cols * jnp.dtype(dtype).itemsize // 4
    return Program(
        f"all-gather over 4, {dtype}[{rows}, {cols}]",
        dtype,
        size,
        fn,
        (_spec((rows, cols), dtype, mesh, P("y", None)),),
    )


def _card_times(program: Program, chip_key: str) -> tuple[float | None, float | None]:
    facts, _ = tpu_facts(program, TOPOLOGIES[chip_key])
    try:
        card = cost.card(facts)
    except cost.NoCard:
        return None, None
    chip = cost.chips()[chip_key]
    return card.timing(chip, latency=True).step, card.timing(chip).step


def book_rows(chip_keys) -> list[BookRow]:
    """The book's formulas, evaluated with its chip figures, and its measured times, beside the card."""
    out: list[BookRow] = []
    for chip in chip_keys:
        w = BOOK_LINK[chip]
        # Part 3, pop quiz 2 (a): AllGather over an axis of 4 that has no wraparound link (a v5e or v6e slice
        # under 16 chips): the edge shards travel |X| - 1 hops one way, V / |X| bytes at a time over one link.
        big = _gather_over_four("bfloat16", 2048, 8192)
        v = 2048 * 8192 * 2
        formula = 3 * (v / 4) / w
        with_latency, plain = _card_times(big, chip)
        out.append(
            BookRow(
                "part 3, AllGather over 4 chips, no wraparound, bf16[2048, 8192]: (n-1) V / (n W_link), n = 4",
                chip,
                formula,
                with_latency,
                plain,
            )
        )
        if chip == "v5e":
            out.append(
                BookRow(
                    "part 3, the same AllGather, the book's profile on a v5e",
                    chip,
                    680e-6,
                    with_latency,
                    plain,
                )
            )
        # Part 3, pop quiz 2 (b): the same over bf16[256, 256]: latency-bound, |X| - 1 hops of T_min each.
        small = _gather_over_four("bfloat16", 256, 256)
        v = 256 * 256 * 2
        formula = max(3 * BOOK_HOP, 3 * (v / 4) / w)
        with_latency, plain = _card_times(small, chip)
        out.append(
            BookRow(
                "part 3, AllGather over 4 chips, bf16[256, 256]: max((n-1) T_min, (n-1) V / (n W_link)), n = 4",
                chip,
                formula,
                with_latency,
                plain,
            )
        )
        if chip == "v5e":
            out.append(
                BookRow(
                    "part 3, the same small AllGather, the book's profile on a v5e",
                    chip,
                    8e-6,
                    with_latency,
                    plain,
                )
            )
        # Part 3: an AllReduce is a ReduceScatter then an AllGather: twice an AllGather's time, over a line of 8.
        for per_device in (32 << 20, 4 << 10):
            p = collective("all-reduce", "float32", per_device)
            formula = max(2 * (N - 1) * BOOK_HOP, 2 * (N - 1) * (per_device / N) / w)
            with_latency, plain = _card_times(p, chip)
            out.append(
                BookRow(
                    f"part 3, AllReduce over 8 chips (a line), f32, {cost.format_bytes(per_device)} a chip: "
                    "2 max((n-1) T_min, (n-1) V / (n W_link)), n = 8",
                    chip,
                    formula,
                    with_latency,
                    plain,
                )
            )
        # Part 3: an AllToAll over a 1-D bidirectional ring costs a quarter of an AllGather of the whole array:
        # each link carries V / 4. This slice has no wraparound: on a line the middle link carries V / 4 one
        # way, twice the ring's time.
        p = collective("all-to-all", "float32", 4 << 20)
        formula = N * (4 << 20) / (4 * w)
        with_latency, plain = _card_times(p, chip)
        out.append(
            BookRow(
                "part 3, AllToAll over 8 chips (a line), f32, 4.0 MiB a chip: the ring's V / (4 W_bidi) "
                "twice, V / (4 W_link), V the whole array",
                chip,
                formula,
                with_latency,
                plain,
            )
        )
    return out


# ----------------------------------------------------------------------------------------
# The tables.
# ----------------------------------------------------------------------------------------


def compiler_columns(chip_keys) -> list[str]:
    per_chip = (
        "compiler (optimal_seconds)",
        "its HBM bytes / its time",
        "card",
        "card with latency",
        "card / compiler",
    )
    return ["program", "dtype", "per device", "the TPU program's collectives"] + [
        f"{chip}: {what}" for chip in chip_keys for what in per_chip
    ]


BOOK_COLUMNS = ("the book's figure", "chip", "book", "card", "card with latency", "card / book")


def _seconds(s: float | None) -> str:
    if s is None:
        return "none"
    if s <= 0:
        return f"{s:.3g} s, not above zero: no ratio"
    return cost.format_seconds(s)


def _sci(x: float) -> str:
    return f"{x:.2g}".replace("e+", "e")


def _ratio(r: float | None) -> str:
    return f"{r:.2f}x" if r is not None and math.isfinite(r) else ""


def _collectives(row: Row) -> str:
    seen = {m.collectives or m.why for m in row.chips.values()}
    if len(seen) == 1:
        return seen.pop()
    return "; ".join(f"{chip}: {m.collectives or m.why}" for chip, m in row.chips.items())


def compiler_table(rows: list[Row]) -> list[str]:
    chip_keys = list(rows[0].chips) if rows else []
    columns = compiler_columns(chip_keys)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [r.program, r.dtype, cost.format_bytes(r.per_device), _collectives(r)]
        for m in r.chips.values():
            rate = (
                f"{m.compiler_bytes / m.compiler / 1e9:.0f} GB/s"
                if m.compiler and m.compiler > 0 and m.compiler_bytes
                else ""
            )
            cells += [
                _seconds(m.compiler),
                rate,
                _seconds(m.card) if m.card is not None else "no card",
                _seconds(m.card_latency) if m.card_latency is not None else "",
                _ratio(m.ratio),
            ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def book_table(rows: list[BookRow]) -> list[str]:
    out = ["| " + " | ".join(BOOK_COLUMNS) + " |", "|" + "---|" * len(BOOK_COLUMNS)]
    for r in rows:
        cells = [
            r.what,
            r.chip,
            cost.format_seconds(r.book),
            _seconds(r.card_plain),
            _seconds(r.card),
            _ratio(r.ratio),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def versions() -> str:
    from importlib import metadata

    import jax

    try:
        libtpu = metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        libtpu = "none"
    return f"JAX {jax.__version__}, libtpu {libtpu}, Python {platform.python_version()}"


def block(compiler: list[Row], book: list[BookRow], command: str) -> list[str]:
    when = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    cores = os.cpu_count()
    lines = [
        f"Measured {when} on a {cores}-core CPU machine with no TPU ({platform.machine()}), {versions()}; "
        f"regenerate with `{command}`.",
        "",
    ]
    if compiler:
        where = " and ".join(tpucompile.described(TOPOLOGIES[chip]) for chip in compiler[0].chips)
        lines += [f"Against the TPU compiler (8 devices, one axis; compiled for {where}):", ""]
        lines += compiler_table(compiler) + [""]
    if book:
        lines += [
            'Against the book "How to Scale Your Model" (its formulas with its chip figures, and two times it '
            f"measured): W_link is one ICI link one way (part 2: {_sci(BOOK_LINK['v5e'])} B/s on a v5e, "
            f"{_sci(BOOK_LINK['v6e'])} on a v6e), W_bidi twice that, T_min one hop (part 3: {BOOK_HOP * 1e6:g} µs), "
            "V the array's bytes; card / book is the card with latency over the book:",
            "",
        ]
        lines += book_table(book) + [""]
    return lines


def write(lines: list[str], path: Path = BENCHMARKS) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(
            f"{path.name} has no calibration block: put the two lines\n{BEGIN}\n{END}\nwhere it goes"
        )
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + BEGIN + "\n" + "\n".join(lines).rstrip() + "\n" + END + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(COLLECTIVES + OTHERS), help="programs, comma-separated")
    ap.add_argument(
        "--sizes", default=",".join(str(s) for s in SIZES), help="bytes a device holds, comma-separated"
    )
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--chips", default=",".join(TOPOLOGIES))
    ap.add_argument("--no-book", action="store_true", help="leave out the book's figures")
    ap.add_argument("--write", action="store_true", help="replace the calibration block of BENCHMARKS.md")
    args = ap.parse_args(argv)
    ok, why = tpucompile.libtpu_available()
    if not ok:
        print(f"skipped: {why}")
        return 0
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(COLLECTIVES + OTHERS)
    if unknown:
        ap.error(f"unknown programs: {', '.join(sorted(unknown))}")
    chip_keys = [c.strip() for c in args.chips.split(",") if c.strip()]
    if set(chip_keys) - set(TOPOLOGIES):
        ap.error(f"chips: {', '.join(TOPOLOGIES)}")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    compiler = compiler_rows(only, sizes, dtypes, chip_keys)
    book = [] if args.no_book else book_rows(chip_keys)
    shown = " ".join(
        [".venv/bin/python benchmarks/bench_calibration.py", *(sys.argv[1:] if argv is None else argv)]
    )
    lines = block(compiler, book, shown)
    print("\n".join(lines))
    if args.write:
        write(lines)
        print(f"wrote {BENCHMARKS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
