"""Writing files so that a reader never sees half of one, and reading a submitted notebook with a bound: the
helpers grading and the scoreboard share."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write `path` through a temporary file next to it and a rename: readers see the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode("utf-8") if isinstance(text, str) else text
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json_bounded(path: Path, max_bytes: int) -> object | None:
    """The JSON in a file of at most `max_bytes` (a submitted notebook); None where it is larger, unreadable or
    not JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            return None
        return json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None
