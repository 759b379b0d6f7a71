"""Submission history: every version of a notebook the kit collected, kept by its digest.

    OUT/history/<student>/lab-<N>/<sha256>.ipynb   the bytes graded, once per distinct version
    OUT/history/<student>/lab-<N>/history.json     [{digest, collected_at, submitted_at, source, file}, ...]

Collecting again never overwrites: a new version is added next to the old ones, and a version seen
before keeps the time it was first collected. The scoreboard records the digest it graded, so a
regrade or a dispute can name exactly which bytes were graded and when they arrived.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

from labkit.files import write_atomic

MAX_KEPT = 200_000_000  # larger files are named by digest, not copied


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder(out: Path, student: str, lab: int) -> Path:
    return Path(out) / "history" / student / f"lab-{lab}"


def read(out: Path, student: str, lab: int) -> list[dict]:
    try:
        data = json.loads((folder(out, student, lab) / "history.json").read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def keep(out: Path, student: str, lab: int, path: Path, *, submitted_at: str | None = None, source: str = "",
         file: str = "", now: datetime | None = None) -> dict | None:
    """Keep `path` as a version of the student's lab; its history entry (the first one for these bytes)."""
    path = Path(path)
    if not path.is_file():
        return None
    d = digest(path)
    entries = read(out, student, lab)
    for entry in entries:
        if entry.get("digest") == d:
            return entry
    where = folder(out, student, lab)
    if path.stat().st_size <= MAX_KEPT:
        write_atomic(where / f"{d}.ipynb", path.read_bytes())
    when = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    entry = {"digest": d, "collected_at": when, "submitted_at": submitted_at, "source": source or "folder",
             "file": file or path.name}
    write_atomic(where / "history.json", json.dumps(entries + [entry], indent=1) + "\n")
    return entry
