"""A lab's written answer (lab 14's design note), taken from the notebook a student handed in so that a TA
can grade it against the rubric (`--adjustments`, an `item` line: labkit/grading/state/adjustments.py).

The answer is the markdown cell that opens with HEADING. Grading writes it to
`OUT/writeups/<student>/lab-<N>.md`: the student's words inside a fence, no backtick kept, so that no
markup of theirs is drawn as markup wherever the TA reads the file. The notebook is read as the
similarity check reads it (at most MAX_BYTES, plain JSON, nothing run), and the note is cut at MAX_CHARS.
"""

from __future__ import annotations

from pathlib import Path

from labkit.grading.state.files import read_json_bounded, write_atomic

HEADING = "## Your design note"
MAX_BYTES = 20_000_000  # a notebook larger than this is not read for its note
MAX_CHARS = 20_000  # a note longer than this is cut, and says so


def note_of(nb: object) -> str | None:
    """The text under HEADING in the first markdown cell that opens with it; None where there is none."""
    for cell in nb.get("cells", []) if isinstance(nb, dict) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        if text.lstrip().startswith(HEADING):
            return text.lstrip()[len(HEADING) :].strip()
    return None


def extract(path: Path) -> str | None:
    """The note of a notebook file, or None where the file is too large, not a notebook, or has no note cell."""
    nb = read_json_bounded(path, MAX_BYTES)
    return note_of(nb) if nb is not None else None


def text(student: str, lab: int, note: str | None, handout: str | None) -> str:
    """The file a TA reads: who and which lab, then the note as plain text (or why there is none)."""
    head = f"# Design note: {student!r}, lab {lab}\n\n"
    if note is None:
        return head + 'No note: the notebook has no cell that opens with "' + HEADING + '".\n'
    if not note or note == handout:
        return head + "Not written: the cell is as the handout gave it.\n"
    cut = note[:MAX_CHARS]
    more = f"\n\n(cut at {MAX_CHARS} characters of {len(note)})" if len(note) > MAX_CHARS else ""
    return head + "```text\n" + cut.replace("`", "'") + "\n```" + more + "\n"


def write(out: Path, student: str, lab: int, path: Path, handout: str | None) -> Path | None:
    """Write the note of `path` (a handed-in notebook of `lab`) for the TA; None where the lab asks for none
    (the handout has no note cell)."""
    if handout is None:
        return None
    target = Path(out) / "writeups" / student / f"lab-{lab}.md"
    write_atomic(target, text(student, lab, extract(path), handout))
    return target
