"""From a reference notebook to the student's: strip the marked solutions, clear outputs.

In a reference notebook a solution sits between two marker lines::

    def shard_map_double(x):
        ### BEGIN SOLUTION
        ...
        ### END SOLUTION

The student version keeps everything else, and puts in the solution's place a
`raise NotImplementedError(...)` indented like the solution was. Generation is a pure
function of the reference, so `labs/` can be checked against `reference/` at any time.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import nbformat

BEGIN = re.compile(r"^(\s*)### BEGIN SOLUTION\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
STUB = 'raise NotImplementedError("write your solution here")'


class MarkerError(ValueError):
    pass


class EditedNotebook(RuntimeError):
    """A student notebook that someone has edited: generation never overwrites it."""


def strip_source(source: str, where: str = "cell") -> str:
    out, inside, indent = [], False, ""
    for number, line in enumerate(source.splitlines(), start=1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if inside:
                raise MarkerError(f"{where}, line {number}: BEGIN SOLUTION inside another solution")
            inside, indent = True, begin.group(1)
            out.append(f"{indent}# Your code here.")
            out.append(f"{indent}{STUB}")
        elif end:
            if not inside:
                raise MarkerError(f"{where}, line {number}: END SOLUTION without BEGIN SOLUTION")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"{where}: BEGIN SOLUTION is never closed")
    return "\n".join(out)


def student_version(reference: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    nb = nbformat.from_dict(reference)
    for i, cell in enumerate(nb.cells, start=1):
        if cell.cell_type == "code":
            cell.source = strip_source(cell.source, f"{name}, cell {i}")
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
    nb.metadata.pop("papermill", None)
    nb.metadata["labkit"] = {"generated": cells_digest(nb)}
    return nb


def cells_digest(nb) -> str:
    """A fingerprint of a notebook's cell types and sources: what a person edits."""
    cells = [[c.get("cell_type"), "".join(c.get("source", ""))] for c in nb.get("cells", [])]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]


def edited(student_path: Path) -> bool:
    """True when the file's cells are no longer the ones generation wrote (a student worked in it)."""
    try:
        nb = json.loads(student_path.read_text())
    except (OSError, ValueError):
        return True
    recorded = nb.get("metadata", {}).get("labkit", {}).get("generated")
    return recorded != cells_digest(nb)


def render(reference_path: Path) -> str:
    """The student notebook for `reference_path`, as the exact text to write."""
    ref = nbformat.read(reference_path, as_version=4)
    return nbformat.writes(student_version(ref, reference_path.name)) + "\n"


def generate(reference_path: Path, student_path: Path, force: bool = False) -> bool:
    """Write the student version; True when the file changed. An edited notebook is never overwritten."""
    text = render(reference_path)
    if student_path.exists() and student_path.read_text() == text:
        return False
    if student_path.exists() and not force and edited(student_path):
        raise EditedNotebook(
            f"{student_path} has been edited since it was generated; not overwriting it "
            "(move it away, or regenerate with FORCE=1 if you mean to discard the edits)"
        )
    student_path.parent.mkdir(parents=True, exist_ok=True)
    student_path.write_text(text)
    return True


def stale(reference_path: Path, student_path: Path) -> bool:
    """True when the student version is missing or differs from what the reference generates."""
    return not student_path.exists() or student_path.read_text() != render(reference_path)
