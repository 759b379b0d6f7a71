"""Where graded units are kept, each under a key: a digest of everything its grade depends on
(the submission's bytes, the lab's tests and reference, the configuration, the kit's grading code
and locked environment). A unit whose key has not changed is not graded again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

from labkit.course import catalog
from labkit.course.configs import DeviceConfig
from labkit.grading.intake.collect import MAX_BYTES, Unit
from labkit.grading.state.files import write_atomic
from labkit.grading.state.history import digest as file_digest
from labkit.run import execute

FORMAT = 1  # of the unit files; part of every key


# Modules of the kit that draw or drive, and do not change a grade: editing them regrades nothing.
_NOT_GRADING = {
    "__init__.py",
    "__main__.py",
    "cli.py",
    "report.py",
    "loop.py",
    "authoring.py",
    "notebook.py",
    "release.py",
    "wheelhouse.py",
    "files.py",
    "policy.py",
    "roster.py",
    "lms.py",
    "gradebook.py",
    "canvas.py",
    "gradescope.py",
    "deadlines.py",
    "overrides.py",
    "history.py",
    "progress.py",
    "course.py",
    "merge.py",
    "scoreboard.py",
    "results.py",
    "markdown.py",
    "pages.py",
    "context.py",
    "stats.py",
    "adjustments.py",
}  # the scoreboard's drawing, and points a TA adds after grading


# ----------------------------------------------------------------------------------------
# Keys: what a unit's grade depends on.
# ----------------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unit_key(parts: list) -> str:
    """A graded unit's key: a digest of the file format and everything its grade depends on (`parts`, JSON)."""
    return _sha(json.dumps([FORMAT, *parts]).encode())


def _code_digest(path: Path) -> str:
    """A module's code, not its layout: comments, formatting and docstrings do not change a grade."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return file_digest(path)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return _sha(ast.dump(tree).encode())


def kit_digest(root: Path = catalog.ROOT) -> str:
    """The kit's grading code (as code: see `_code_digest`) and its locked environment."""
    parts = [sys.version]
    package = Path(__file__).resolve().parents[2]  # labkit/
    for path in sorted(package.rglob("*.py")):
        if path.name not in _NOT_GRADING:
            parts.append(f"{path.relative_to(package)}:{_code_digest(path)}")
    lock = root / "uv.lock"
    parts.append(file_digest(lock) if lock.exists() else "no lock")
    return _sha("\n".join(parts).encode())


def lab_digest(lab: catalog.Lab) -> str:
    """The lab's reference and every file of its public and hidden tests."""
    parts = [f"reference:{file_digest(lab.reference) if lab.reference.exists() else 'none'}"]
    for folder in lab.test_dirs(hidden=True):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                parts.append(f"{path.relative_to(lab.root)}:{file_digest(path)}")
    return _sha("\n".join(parts).encode())


def submission_digest(path: Path | None) -> str:
    if path is None or not path.exists():
        return "missing"
    if path.is_dir():
        return "folder:" + _sha("\n".join(sorted(p.name for p in path.iterdir())).encode())
    if path.stat().st_size > MAX_BYTES:
        return f"too-large:{path.stat().st_size}"
    return file_digest(path)


def config_digest(config: DeviceConfig) -> str:
    return _sha(json.dumps(asdict(config), sort_keys=True, default=str).encode())


# ----------------------------------------------------------------------------------------
# Where graded units are kept.
# ----------------------------------------------------------------------------------------


class Store:
    """Graded units and finished runs under one folder, each file written atomically, each with its key."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _read(self, path: Path, key: str) -> dict | None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("key") == key else None

    def row(self, unit: Unit, key: str) -> dict | None:
        data = self._read(self.root / "units" / f"{unit.where}.json", key)
        row = data.get("row") if data else None
        return row if isinstance(row, dict) else None  # anything else: graded again

    def record(self, unit: Unit, key: str) -> execute.RunRecord | None:
        """The unit's finished run, kept under `key`; None (run again) when there is none or it cannot be read."""
        data = self._read(self.root / "units" / f"{unit.where}.run.json", key)
        try:
            return execute.RunRecord.from_json(data["record"]) if data else None
        except (KeyError, TypeError):
            return None

    def save_row(self, unit: Unit, key: str, row: dict, seconds: float) -> None:
        write_atomic(
            self.root / "units" / f"{unit.where}.json",
            json.dumps({"key": key, "seconds": seconds, "row": row}, indent=1),
        )

    def save_record(self, unit: Unit, key: str, record: execute.RunRecord) -> None:
        write_atomic(
            self.root / "units" / f"{unit.where}.run.json",
            json.dumps({"key": key, "record": record.to_json()}),
        )

    def workdir(self, unit: Unit) -> Path:
        return self.root / "work" / unit.where
