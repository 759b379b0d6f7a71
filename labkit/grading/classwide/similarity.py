"""Submissions to look at together: pairs of notebooks of one lab whose code is the same, or nearly.

This is a list for a person to read, never a verdict. Students of one course write the same
exercises from the same handout, and short exercises have few good answers; a pair on this list
is two notebooks worth opening side by side, nothing more.

What is compared is the code a student wrote, normalised:

- code cells only, outputs and markdown left out; IPython's `%magic` and `!shell` lines left out;
- a cell that is, once normalised, a cell of the lab's handout (labs/lab-N.ipynb) is left out, so
  that everyone's copy of the handout matches no one;
- Python's `tokenize` reads each cell: comments and blank lines go, indentation stays as tokens,
  every string literal becomes one placeholder;
- names become `v1`, `v2`, ... in the order they first appear in the cell, except what the code
  does not choose: keywords, builtins, attributes (`jnp.sum` keeps `sum`), keyword arguments
  (`in_specs=`), and names the notebook or its handout imports (`jnp`, `P`). A copy whose variables were
  renamed reads the same as the original.

Each submission's normalised code is kept in the results as a fingerprint (`fingerprint`): a
digest of the whole token stream, and the set of its shingles (every run of SHINGLE tokens inside
a cell, hashed) less the shingles of the handout. A pair is listed (`pairs`) when

    byte-identical              the two files' sha256 digests are the same (and they change the handout)
    identical after normalising the normalised token streams are the same
    near-identical              the shingle sets' Jaccard similarity (shared / either) is NEAR or more

the last two only where both wrote at least MIN_SHINGLES shingles of their own (a few lines of
code): below that, two correct answers are alike because the exercise is short. Two members of a
declared group (one `group` on the roster, or one Gradescope group submission) are never a pair: their
one submission is the same by design. Since the
fingerprints travel in the results, the list is a pure function of them, and the shards of a
class merged (`labkit merge`) give the same list as one run.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import keyword
import re
import tokenize
from itertools import combinations
from pathlib import Path

from labkit.grading.state.files import read_json_bounded

SHINGLE = 5  # tokens per shingle
NEAR = 0.8  # Jaccard similarity from which two submissions are listed as near-identical
MIN_SHINGLES = 25  # shingles of a student's own below which only byte-identical files are listed
MAX_BYTES = 50_000_000  # a notebook larger than this is not read for its code
STRING = "STR"  # what every string literal becomes

_KEPT = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))
_MAGIC = re.compile(r"^\s*[%!]")
_ROUGH = re.compile(r"[A-Za-z_]\w*|\d+|\S")
_FSTRING = {
    getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)
}
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


def _imported(source: str) -> set[str]:
    """Every name a cell's imports spell (modules, their parts, aliases); by a scan of its lines where it does not parse."""
    words = re.compile(r"[A-Za-z_]\w*")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        lines = [line for line in source.splitlines() if re.match(r"\s*(from|import)\s", line)]
        return set(words.findall("\n".join(lines))) - {"from", "import", "as"}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update(words.findall(getattr(node, "module", None) or ""))
            for alias in node.names:
                names.update(words.findall(alias.name))
                names.update([alias.asname] if alias.asname else [])
    return names


def _raw_tokens(source: str) -> list[tuple[int, str]]:
    """(type, text) of each token that counts; a cell tokenize cannot read is split into words and symbols."""
    try:
        return [
            (t.type, t.string)
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in _SKIPPED
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [
            (tokenize.NAME if w[0].isalpha() or w[0] == "_" else tokenize.OP, w)
            for w in _ROUGH.findall(source)
        ]


def _without_magics(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if not _MAGIC.match(line))


def imported(cells: list[str]) -> set[str]:
    """The names a notebook's cells import, which keep their names in every cell."""
    return set().union(*(_imported(_without_magics(c)) for c in cells))


def tokens(source: str, keep: set[str] = frozenset()) -> list[str]:
    """One cell's code, normalised: the token sequence two copies of the same code share (see the module).

    `keep`: names imported elsewhere in the notebook, kept as they are like the cell's own imports.
    """
    source = _without_magics(source)
    imported = _imported(source) | keep
    raw = _raw_tokens(source)
    names: dict[str, str] = {}
    out = []
    for k, (kind, text) in enumerate(raw):
        if kind == tokenize.NAME:
            before = raw[k - 1][1] if k else ""
            after = raw[k + 1][1] if k + 1 < len(raw) else ""
            keyword_argument = after == "=" and before in ("(", ",")
            if text in _KEPT or text in imported or before == "." or keyword_argument:
                out.append(text)
            else:
                out.append(names.setdefault(text, f"v{len(names) + 1}"))
        elif kind == tokenize.STRING or kind in _FSTRING:
            if not out or out[-1] != STRING:  # an f-string's pieces, or adjacent literals, are one string
                out.append(STRING)
        elif kind == tokenize.NEWLINE:
            out.append("NEWLINE")
        elif kind == tokenize.INDENT:
            out.append("INDENT")
        elif kind == tokenize.DEDENT:
            out.append("DEDENT")
        else:
            out.append(text)
    return out


def code_cells(nb: object) -> list[str]:
    """The source of each code cell of a notebook read as JSON (anything else in it is left out)."""
    out = []
    cells = nb.get("cells") if isinstance(nb, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(s for s in source if isinstance(s, str))
        if isinstance(source, str):
            out.append(source)
    return out


def _shingles(seq: list[str]) -> set[int]:
    return {
        int.from_bytes(hashlib.blake2b("\x1f".join(seq[i : i + SHINGLE]).encode(), digest_size=6).digest())
        for i in range(max(len(seq) - SHINGLE + 1, 1 if seq else 0))
    }


def starter(cells: list[str]) -> dict:
    """What a lab's handout gives everyone (its code cells), for `fingerprint_of` to leave out."""
    return {"cells": list(cells), "imported": imported(cells)}


def fingerprint_of(cells: list[str], handout: dict | None = None) -> dict:
    """A submission's fingerprint from its code cells: {normalised: digest, shingles: [sorted ints]}.

    Cells of the handout, normalised, are left out, and so are the handout's shingles. Both are
    normalised keeping the names either imports.
    """
    handout = handout or starter([])
    keep = imported(cells) | handout["imported"]
    given = [tokens(c, keep) for c in handout["cells"]]
    given_cells, given_shingles = {tuple(s) for s in given if s}, set().union(*map(_shingles, given))
    own = [seq for seq in (tokens(c, keep) for c in cells) if seq and tuple(seq) not in given_cells]
    stream = "\x1e".join("\x1f".join(seq) for seq in own)
    shingles = set().union(*map(_shingles, own)) - given_shingles
    return {
        "normalised": hashlib.sha256(stream.encode()).hexdigest()[:16] if own else "",
        "shingles": sorted(shingles),
    }


def read_cells(path: Path) -> list[str] | None:
    """The code cells of a notebook file; None where it is too large or is not a notebook."""
    nb = read_json_bounded(path, MAX_BYTES)
    return code_cells(nb) if nb is not None else None


def fingerprint(path: Path, handout: dict | None = None) -> dict | None:
    """The fingerprint of a notebook file (see `fingerprint_of`); None where it cannot be read as a notebook."""
    cells = read_cells(path)
    return None if cells is None else fingerprint_of(cells, handout)


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def compare(a: dict, b: dict) -> tuple[str, float] | None:
    """(how alike, Jaccard similarity) of two submissions' fingerprints (with their file `digest`), or None.

    `how` is one of "byte-identical", "identical after normalising", "near-identical".
    """
    fa, fb = a.get("code") or {}, b.get("code") or {}
    sa, sb = set(fa.get("shingles", [])), set(fb.get("shingles", []))
    score = jaccard(sa, sb)
    if a.get("digest") and a.get("digest") == b.get("digest") and fa.get("normalised"):
        return "byte-identical", 1.0
    if min(len(sa), len(sb)) < MIN_SHINGLES:
        return None
    if fa.get("normalised") and fa.get("normalised") == fb.get("normalised"):
        return "identical after normalising", 1.0
    if score >= NEAR:
        return "near-identical", score
    return None


def pairs(results: dict) -> list[dict]:
    """Per lab, the pairs of submissions to look at together, most alike first.

    Each: {lab, students: [a, b] (sorted), how, similarity (0..1, two decimals)}; read from the
    submissions' fingerprints in results["students"][id]["submissions"][lab]["code"].
    """
    found = []
    students = results.get("students", {})
    for lab in results.get("labs", []):
        handed = {
            s: info["submissions"][str(lab["number"])]
            for s, info in sorted(students.items())
            if str(lab["number"]) in (info.get("submissions") or {})
        }
        for (s, a), (t, b) in combinations(handed.items(), 2):
            if together(students, s, t, a, b):
                continue  # a declared group's one submission: the same by design, not a finding
            alike = compare(a, b)
            if alike:
                found.append(
                    {
                        "lab": lab["number"],
                        "students": [s, t],
                        "how": alike[0],
                        "similarity": round(alike[1], 2),
                    }
                )
    order = {"byte-identical": 0, "identical after normalising": 1, "near-identical": 2}
    found.sort(key=lambda p: (p["lab"], order[p["how"]], -p["similarity"], p["students"]))
    return found


def together(students: dict, s: str, t: str, a: dict, b: dict) -> bool:
    """Whether two students handed in together, as the course declared: one `group` on the roster, or one
    Gradescope group submission (its `group`, the members it names)."""
    mine, theirs = students[s].get("group"), students[t].get("group")
    if mine and mine == theirs:
        return True
    return t in (a.get("group") or ()) or s in (b.get("group") or ())


RULE = (
    f"Pairs of submissions of one lab whose code is the same or nearly, once normalised: outputs, comments, "
    f"whitespace and the handout's own code left out, names renamed in the order they appear, strings made "
    f"one placeholder. Near-identical: {round(100 * NEAR)}% or more of their runs of {SHINGLE} tokens in "
    f"common (Jaccard), where each wrote at least {MIN_SHINGLES} of their own. Students of one course write "
    f"the same exercises from the same handout, and a short exercise has few good answers: these are "
    f"notebooks to look at together, side by side, and no finding about anyone."
)


def add_fingerprints(
    handed: dict[tuple[str, int], dict], notebooks: dict[str, dict[int, Path]], labs: list
) -> None:
    """Each kept notebook's fingerprint (`code`: what `compare` reads, the handout's own code left out)
    added to what the results say of it; `notebooks`: student -> lab -> the notebook graded."""
    handouts = {lab.number: starter(read_cells(lab.student) or []) for lab in labs}
    for (student, lab), info in handed.items():
        code = fingerprint(notebooks[student][lab], handouts[lab])
        if code is not None:
            info["code"] = code
