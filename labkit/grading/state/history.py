"""Submission history: every version of a notebook the kit collected, kept by its digest.

    OUT/history/<student>/lab-<N>/<sha256>.ipynb   the bytes graded, once per distinct version
    OUT/history/<student>/lab-<N>/history.json     [{digest, collected_at, submitted_at, source, file, times, late}, ...]

Collecting again never overwrites: a new version is added next to the old ones, and a version seen
before keeps the time it was first collected. The scoreboard records the digest it graded, so a
regrade or a dispute can name exactly which bytes were graded and when they arrived.

`folder_times` reads what a plain submissions folder tells of when a notebook was handed in (the
sources are named in labkit/grading/state/deadlines.py): the time of the file's last commit where the student's
folder is a git repository, the file's modification time, and Gradescope's time where the folder
holds the `submission_metadata.json` Gradescope's autograder is given with each submission (and
one notebook, since that file names no lab).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from labkit.grading.state.files import write_atomic

MAX_KEPT = 200_000_000  # larger files are named by digest, not copied
MAX_METADATA = 10_000_000  # a submission_metadata.json larger than this is not read
GIT_TIMEOUT = 20
# git reads the repository's own config: none of it may run a program or change what log prints.
_GIT = [
    "git",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "log.showSignature=false",
    "-c",
    "core.pager=cat",
    "-c",
    "log.date=iso-strict",
    "--no-pager",
]


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


def keep(
    out: Path,
    student: str,
    lab: int,
    path: Path,
    *,
    submitted_at: str | None = None,
    source: str = "",
    file: str = "",
    times: dict | None = None,
    late: bool = False,
    now: datetime | None = None,
) -> dict | None:
    """Keep `path` as a version of the student's lab; its history entry (the first one for these bytes).

    `times` (source -> ISO time) and `late` (an LMS's flag) are what was known of when it was handed in, so that
    the policy can tell later which version was on time (labkit/grading/state/versions.py)."""
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
    entry = {
        "digest": d,
        "collected_at": when,
        "submitted_at": submitted_at,
        "source": source or "folder",
        "file": file or path.name,
    }
    if times is not None:
        entry |= {"times": dict(times), "late": bool(late)}
    write_atomic(where / "history.json", json.dumps(entries + [entry], indent=1) + "\n")
    return entry


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _git_time(path: Path) -> str | None:
    """The committer time of the last commit that changed `path`, where its folder is a git repository."""
    if not (path.parent / ".git").exists():
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_CEILING_DIRECTORIES=str(path.parent.parent),
    )
    try:
        done = subprocess.run(
            [
                *_GIT,
                "-C",
                str(path.parent),
                "log",
                "-1",
                "--no-show-signature",
                "--no-mailmap",
                "--format=%cI",
                "--",
                path.name,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=GIT_TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.strip()
    return line if done.returncode == 0 and line else None


def _gradescope_time(folder: Path) -> str | None:
    """`created_at` of the single-submission `submission_metadata.json` Gradescope's autograder is given."""
    try:
        fd = os.open(folder / "submission_metadata.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(MAX_METADATA + 1)
    try:
        meta = json.loads(data) if len(data) <= MAX_METADATA else None
    except ValueError:
        return None
    created = meta.get("created_at") if isinstance(meta, dict) else None
    return str(created) if created else None


def folder_times(path: Path) -> dict[str, str]:
    """What a plain submissions folder says of when `path` was handed in: source -> ISO time."""
    path = Path(path)
    times = {}
    # The autograder's file is one submission's: it dates a folder's notebook only when there is one.
    gradescope = _gradescope_time(path.parent) if len(list(path.parent.glob("lab-*.ipynb"))) == 1 else None
    if gradescope:
        times["gradescope"] = gradescope
    git = _git_time(path)
    if git:
        times["git"] = git
    try:
        times["mtime"] = _when(path.lstat().st_mtime)
    except OSError:
        pass
    return times
