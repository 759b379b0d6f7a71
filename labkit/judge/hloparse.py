"""Parsing the text of a compiled program (optimised HLO) as instructions (pure Python: tested without JAX).

Each line of a computation is parsed as what XLA prints an instruction to be (`[ROOT] %name = shape
opcode(operands), attribute=value, ...`) by a scanner that knows XLA's brackets, quoted strings and comments
(`_Scanner`): a student's words (a `jax.named_scope`, a `named_call`, a function's name, a frontend attribute)
reach the program only inside quoted strings or as identifiers, and neither is ever read as an opcode, a shape or
an attribute. A line that starts as an instruction and does not parse, and an element type whose size is not
known, are errors that name them (`Unreadable`). What the program does is read from the parsed structure by
`labkit.judge.hlo`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# Bits of one element of each XLA element type (`xla_data.proto`'s PrimitiveType, as HLO text names them).
ELEMENT_BITS = {
    "pred": 8,
    "s1": 1,
    "u1": 1,
    "s2": 2,
    "u2": 2,
    "s4": 4,
    "u4": 4,
    "s8": 8,
    "u8": 8,
    "s16": 16,
    "u16": 16,
    "s32": 32,
    "u32": 32,
    "s64": 64,
    "u64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "f4e2m1fn": 4,
    "f8e3m4": 8,
    "f8e4m3": 8,
    "f8e4m3fn": 8,
    "f8e4m3fnuz": 8,
    "f8e4m3b11fnuz": 8,
    "f8e5m2": 8,
    "f8e5m2fnuz": 8,
    "f8e8m0fnu": 8,
    "token": 0,
}
_ARRAY = re.compile(r"(?<![\w.])(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[0-9,\s]*)\]")


class Unreadable(ValueError):
    """A part of the program this reader cannot read: the fact that needs it is not given (never guessed)."""


def shape_arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, dimensions) of each array of an HLO shape, in order: `f32[8,4]{1,0}` or a tuple
    `(f32[8], bf16[2,2])`. A dtype whose size is not known is refused by name."""
    found = []
    for m in _ARRAY.finditer(without_layouts(shape)):
        dtype = m.group("dtype")
        if dtype not in ELEMENT_BITS:
            raise Unreadable(f"an array of element type {dtype!r}, whose size this reader does not know")
        found.append((dtype, tuple(int(d) for d in m.group("dims").split(",") if d.strip())))
    return found


def shape_elements(shape: str) -> list[tuple[str, int]]:
    """(dtype, element count) of each array of an HLO shape (`shape_arrays`)."""
    return [(dtype, math.prod(dims)) for dtype, dims in shape_arrays(shape)]


def array_bytes(dtype: str, dims: tuple[int, ...]) -> int:
    """Bytes of one array (elements smaller than a byte packed, rounded up)."""
    return -(-math.prod(dims) * ELEMENT_BITS[dtype] // 8)


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape (a tuple's summed; elements smaller than a byte packed, rounded up per array)."""
    return sum(array_bytes(dtype, dims) for dtype, dims in shape_arrays(shape))


def without_layouts(shape: str) -> str:
    """A shape without its layouts (`{1,0:T(8,128)S(1)}`) and index comments: only dtypes and dimensions."""
    out, depth = [], 0
    for ch in re.sub(r"/\*.*?\*/", "", shape):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def compact(shape: str) -> str:
    """A result shape without its index comments: `(f32[4]{0}, /*index=1*/f32[4]{0})` is
    `(f32[4]{0}, f32[4]{0})`. Whole, never cut: what a collective sends is read from it."""
    return re.sub(r"\s+", " ", re.sub(r"/\*.*?\*/", "", shape)).strip()


# ----------------------------------------------------------------------------------------
# Instructions, as XLA prints them.
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One instruction: its name, result shape (as printed), opcode, operand names, the literal inside its
    parentheses where it has no operands (a constant's value, a parameter's number), and its attributes
    (name -> the value as printed, a quoted string still quoted)."""

    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    literal: str
    attributes: dict[str, str] = field(default_factory=dict)
    root: bool = False


_CLOSING = {"(": ")", "{": "}", "[": "]"}


class _Scanner:
    """Walks one line of HLO text, knowing its brackets, its quoted strings and its comments."""

    def __init__(self, text: str):
        self.text, self.i = text, 0

    def skip_space(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def take(self, pattern: re.Pattern) -> str | None:
        m = pattern.match(self.text, self.i)
        if m is None:
            return None
        self.i = m.end()
        return m.group(0)

    def until(self, stops: str) -> str:
        """Text up to (not including) the first of `stops` outside brackets, quotes and comments, or the end."""
        start, text = self.i, self.text
        depth: list[str] = []
        while self.i < len(text):
            ch = text[self.i]
            if ch in "\"'":
                self._quoted(ch)
                continue
            if text.startswith("/*", self.i):
                end = text.find("*/", self.i + 2)
                if end < 0:
                    raise Unreadable("an unterminated comment")
                self.i = end + 2
                continue
            if not depth and ch in stops:
                break
            if ch in _CLOSING:
                depth.append(_CLOSING[ch])
            elif ch in ")}]" and (not depth or depth.pop() != ch):
                raise Unreadable(f"an unbalanced {ch!r}")
            self.i += 1
        if depth:
            raise Unreadable("an unclosed bracket")
        return text[start : self.i]

    def _quoted(self, quote: str) -> None:
        text, i = self.text, self.i + 1
        while i < len(text) and text[i] != quote:
            i += 2 if text[i] == "\\" else 1
        if i >= len(text):
            raise Unreadable("an unterminated string")
        self.i = i + 1

    def expect(self, ch: str) -> None:
        if self.i >= len(self.text) or self.text[self.i] != ch:
            raise Unreadable(f"{ch!r} expected")
        self.i += 1


_NAME = re.compile(r"%?[\w.\-]+")
_OPCODE = re.compile(r"[a-z][a-z0-9\-]*(?=\()")
_INSTRUCTION_START = re.compile(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s")
_HEADER = re.compile(r"\s*(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(")


def instruction(line: str) -> Instruction:
    """One instruction line, parsed (Unreadable where it is not one)."""
    s = _Scanner(line)
    s.skip_space()
    root = s.take(re.compile(r"ROOT\s+")) is not None
    name = s.take(_NAME)
    s.skip_space()
    if name is None or s.take(re.compile(r"=\s*")) is None:
        raise Unreadable("not an instruction")
    shape = s.until(" \t")
    s.skip_space()
    opcode = s.take(_OPCODE)
    if not shape or opcode is None:
        raise Unreadable("an instruction without a shape or an opcode")
    s.expect("(")
    inside = s.until(")")
    s.expect(")")
    attributes: dict[str, str] = {}
    s.skip_space()
    while s.i < len(line):
        s.expect(",")
        s.skip_space()
        part = s.until(",").strip()
        key, eq, value = part.partition("=")
        if not eq or not re.fullmatch(r"[\w.\-]+", key.strip()):
            raise Unreadable(f"an attribute that is not key=value after {opcode}")
        attributes[key.strip()] = value.strip()
    operands, literal = [], ""
    for piece in split_outside(inside):
        token = piece.split()[-1] if piece.split() else ""
        if token.startswith("%"):
            operands.append(token[1:])
        elif token:
            literal = piece.strip()
    return Instruction(name.lstrip("%"), compact(shape), opcode, tuple(operands), literal, attributes, root)


def split_outside(text: str) -> list[str]:
    """`text` split at its commas outside brackets and quotes."""
    s, parts = _Scanner(text), []
    while s.i < len(text):
        parts.append(s.until(","))
        s.i += 1
    return [p for p in parts if p.strip()]


@dataclass
class Computation:
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}

    @property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions if i.root), None)


@dataclass
class Module:
    """A program's computations by name (`""`: lines outside any computation, as the tests write fragments),
    and the name of its entry."""

    computations: dict[str, Computation]
    entry: str | None


# The tables JAX's printer puts before the computations (the source locations metadata names): a title, then
# numbered rows of one quoted string or one braced record each, up to a blank line.
_TABLES = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
_TABLE_ROW = re.compile(r"\s*\d+\s+(?=[\"{])")


def _table_row(line: str) -> bool:
    """Is `line` one row of a printer's table: a number, then one quoted string or one braced record, whole?"""
    start = _TABLE_ROW.match(line)
    if start is None:
        return False
    s = _Scanner(line)
    s.i = start.end()
    s.until(" \t")
    s.skip_space()
    return s.i == len(line)


def parse(hlo: str) -> Module:
    """The program's computations and their instructions. A line that starts as an instruction must parse as
    one (Unreadable, naming the line's opcode where it has one, otherwise); the printer's tables of source
    locations are read as rows and skipped; any other line is refused."""
    found = {"": Computation("")}
    entry, current, table = None, "", False
    for number, line in enumerate(hlo.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("HloModule", "//")):
            table = False
            continue
        if current == "" and (stripped in _TABLES or (table and _table_row(line))):
            table = True
            continue
        if stripped == "}":
            current = ""
            continue
        if _INSTRUCTION_START.match(line):
            try:
                found[current].instructions.append(instruction(line))
            except Unreadable as e:
                raise Unreadable(
                    f"line {number} of the program could not be read as an instruction ({e})"
                ) from e
            continue
        header = _HEADER.match(line)
        if header and stripped.endswith("{"):
            current = header.group("name")
            found[current] = Computation(current)
            if header.group("entry"):
                entry = current
            continue
        raise Unreadable(f"line {number} of the program is neither an instruction nor a computation's header")
    return Module(found, entry)
