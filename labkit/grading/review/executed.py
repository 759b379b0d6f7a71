"""A student's notebook as a grading run executed it, as a regrade request's page shows it: each cell's source
and outputs, as plain text.

    OUT/work/<student>/lab-<N>/<config>/executed.ipynb             a one-process configuration's run
    OUT/work/<student>/lab-<N>/<config>/process-0/executed.ipynb   process 0 of a run of several processes

The student's code wrote that folder as it ran, so everything in it is the student's word. It is read through
the gate's `read_below` (labkit/grading/review/guard.py: no link followed, nothing outside the output folder,
at most MAX_BYTES), parsed as JSON and shown as text only, which the page escapes: an HTML, SVG or other rich
output is shown as its text/plain where it has one, else as its source; an image is named, not drawn. A cell's
text is cut at MAX_TEXT characters, and a notebook's at MAX_SHOWN.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading.review import guard

WORK = "work"  # OUT/work/<student>/lab-<N>/<config>/: labkit/grading/running/store.py's `workdir`
NAME = "executed.ipynb"
FIRST = "process-0"  # the first process's folder, where a configuration runs several
MAX_BYTES = 10_000_000
MAX_TEXT = 20_000
MAX_SHOWN = 400_000
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class Cell:
    number: int
    kind: str  # code, markdown or raw
    source: str
    outputs: list[str]


@dataclass
class Executed:
    config: str
    cells: list[Cell] = field(default_factory=list)
    problem: str = ""  # why it is not shown ('' where it is)
    cut: bool = False  # some of it is left out (MAX_TEXT, MAX_SHOWN)


def of_unit(out: Path, student: str, lab: int, config: str) -> Executed:
    """The notebook a run of `student`'s lab `lab` on `config` executed, or why it is not shown."""
    folder = [WORK, student, f"lab-{lab}", config]
    for steps in ([*folder, NAME], [*folder, FIRST, NAME]):
        try:
            data, more = guard.read_below(out, steps, MAX_BYTES)
        except FileNotFoundError:
            continue
        except guard.NotBelow as e:
            return Executed(config, problem=f"not shown: {e} (the page follows no link in OUT/{WORK}/)")
        except OSError as e:
            return Executed(config, problem=f"cannot be read ({e.strerror})")
        if more:
            return Executed(
                config, problem=f"larger than {MAX_BYTES} bytes: open {'/'.join(steps)} in Jupyter"
            )
        return _parsed(config, data)
    return Executed(config, problem=f"no executed notebook in OUT/{'/'.join(folder)}/ (graded elsewhere?)")


def _parsed(config: str, data: bytes) -> Executed:
    try:
        nb = json.loads(data)
    except (ValueError, RecursionError):
        return Executed(config, problem="not a notebook (not JSON)")
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        return Executed(config, problem="not a notebook (no list of cells)")
    shown, left = Executed(config), MAX_SHOWN
    for n, cell in enumerate(c for c in cells if isinstance(c, dict)):
        outputs = cell.get("outputs")
        drawn = Cell(
            n,
            str(cell.get("cell_type", ""))[:20],
            _cut(_text(cell.get("source"))),
            [_cut(_output(o)) for o in outputs if isinstance(o, dict)] if isinstance(outputs, list) else [],
        )
        left -= len(drawn.source) + sum(map(len, drawn.outputs))
        if left < 0:
            shown.cut = True
            break
        shown.cells.append(drawn)
    shown.cut = shown.cut or any(_CUT in c.source or any(_CUT in o for o in c.outputs) for c in shown.cells)
    return shown


_CUT = "\n… (cut)"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + _CUT


def _text(value: object) -> str:
    """A notebook's text field: a string, or a list of strings (anything else: nothing)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return ""


def _output(output: dict) -> str:
    """One output as text: a stream's text, a result's text/plain (else its rich form's source), an error's
    name, value and traceback without the terminal's colours."""
    kind = output.get("output_type")
    if kind == "stream":
        return _text(output.get("text"))
    if kind == "error":
        traceback = output.get("traceback")
        lines = [t for t in traceback if isinstance(t, str)] if isinstance(traceback, list) else []
        return _ANSI.sub("", "\n".join([f"{output.get('ename', '')}: {output.get('evalue', '')}", *lines]))
    data = output.get("data")
    if not isinstance(data, dict):
        return ""
    if "text/plain" in data:
        return _text(data["text/plain"])
    for mime, value in data.items():
        if str(mime).startswith("image/") and mime != "image/svg+xml":
            return f"({mime}: an image, not shown)"
        return f"({mime}, shown as its text)\n" + (_text(value) or json.dumps(value)[:MAX_TEXT])
    return ""
