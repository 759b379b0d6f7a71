"""When the student last ran `check(...)` in Jupyter, so that `make lab-N` can say when the notebook on disk
is older than that check (edits not yet saved: `make lab-N` runs the file on disk, not the open kernel).

The stamp is the student's own note about their own kernel, written by that kernel into the kit's build
folder; the kit reads at most a few bytes of it, and anything it cannot read as a time is no stamp."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

NAME = "last-check.json"
LIMIT = 256  # bytes read at most: the stamp is one small JSON object
SLACK = 2.0  # seconds: a save and a check within this of each other are the same moment


def write(folder: Path, now: float | None = None) -> None:
    """Note that a check ran now (from the student's kernel; a folder that cannot be written is no error)."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / NAME).write_text(json.dumps({"time": time.time() if now is None else now}))
    except OSError:
        pass


def read(folder: Path) -> float | None:
    """The time of the last check, or None (no stamp, or not a regular file holding a time)."""
    try:
        fd = os.open(
            Path(folder) / NAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        )
    except OSError:
        return None
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        when = json.loads(os.read(fd, LIMIT).decode()).get("time")
        return float(when) if isinstance(when, (int, float)) else None
    except (OSError, ValueError, AttributeError):
        return None
    finally:
        os.close(fd)


def advice(notebook: Path, folder: Path) -> list[str]:
    """Lines for `make lab-N` about the notebook it runs: how to open it, and whether it is older than the
    last check() (the student's latest edits may not be saved)."""
    out = [
        f'To work on it: `.venv/bin/jupyter lab {notebook}` (or `make docker-lab`), then `check("name")` '
        + "in a cell runs the public tests of one function."
    ]
    checked = read(folder)
    try:
        saved = Path(notebook).stat().st_mtime
    except OSError:
        return out
    if checked is not None and saved + SLACK < checked:

        def at(t: float) -> str:
            return time.strftime("%H:%M:%S", time.localtime(t))

        out.append(
            f"Note: {notebook} was last saved at {at(saved)}, before your last check() at {at(checked)}. "
            "This run grades the file on disk: if you changed the notebook since, save it in JupyterLab "
            "(Ctrl+S) and run this again."
        )
    return out
