"""What a finished run's own files say, read as data that may be anything: the errors the student's cells
raised (the executed notebook papermill wrote) and, where no results came back, why (the end of the run's log).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from labkit.run import kernel


def cell_errors(executed: Path) -> tuple[list[dict], int | None]:
    """Errors raised by the student's cells, and the index of the last cell that started (papermill's copy)."""
    try:
        return cell_errors_of(json.loads(executed.read_text()))
    except (OSError, ValueError):
        return [], None


def cell_errors_of(nb) -> tuple[list[dict], int | None]:
    """From an executed notebook's JSON: the errors the student's cells raised (at most 100) and the index of
    the last cell that started. Every value is taken as data that may be anything (a pod's notebook is)."""
    cells = nb.get("cells") if isinstance(nb, dict) else None
    errors, last_started = [], None
    for cell in cells if isinstance(cells, list) else []:
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        if not isinstance(meta, dict):
            continue
        number = meta.get("labkit_cell")
        if not isinstance(number, int) or isinstance(number, bool) or cell.get("cell_type") != "code":
            continue  # markdown, papermill's own marker cells, the harness
        pm = meta.get("papermill")
        if isinstance(pm, dict) and pm.get("start_time"):
            last_started = number
        source = cell.get("source", "")
        source = (
            "".join(s for s in source if isinstance(s, str))
            if isinstance(source, list)
            else _text(source, 10000)
        )
        for out in cell.get("outputs") if isinstance(cell.get("outputs"), list) else []:
            if isinstance(out, dict) and out.get("output_type") == "error":
                errors.append(
                    {
                        "cell": number,
                        "type": _text(out.get("ename", ""), 100),
                        "message": whole_message(out.get("evalue", "")),
                        "code": source.strip().splitlines()[0][:120] if source.strip() else "",
                    }
                )
    return errors[:100], last_started


MESSAGE_LIMIT = 2000  # characters of a cell's error kept; the executed notebook has it all


def whole_message(value) -> str:
    """An error's message on one line (its line breaks as spaces: one may fall inside a tuple), whole up to
    MESSAGE_LIMIT characters, beyond which it ends in "…"."""
    text = " ".join(_text(value, MESSAGE_LIMIT + 1).split())
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT].rstrip() + " …"


def _text(value, limit: int) -> str:
    return str(value)[:limit] if isinstance(value, (str, int, float)) else ""


def why_no_results(log_path: Path, ran: kernel.KernelRun) -> str:
    text = tail(log_path)
    joined = [ln for ln in text.splitlines() if ln.startswith("labkit: process ")]
    if joined:
        return joined[-1].removeprefix("labkit: ")
    returncode = ran.returncode
    if ran.disk:
        return ran.disk
    if ran.died and ran.failure:
        return f"the Python kernel died while running the notebook: {ran.failure}"
    if ran.died:
        if returncode is not None and (returncode < 0 or returncode > 128):
            signum = -returncode if returncode < 0 else returncode - 128
            return f"the Python kernel died while running the notebook (killed by signal {signum}: a crash, or out of memory)"
        return "the Python kernel died while running the notebook (a crash, or out of memory)"
    if ran.failure:
        return f"the notebook stopped before its functions could be called: {ran.failure}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = lines[-1][:300] if lines else f"exit status {returncode}"
    return f"the notebook stopped before its functions could be called: {last}"


LOG_TAIL_BYTES = (
    1 << 16
)  # of a run's log, only the end is read: the kernel's output makes it as long as it likes


def tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""
