"""The student release: the folder (and .tar.gz) a course hands to students.

A release holds what a student needs to work through the labs and run `make lab-N`:

    labkit/  labs/  tests/public/  docs/  Makefile  noxfile.py  pyproject.toml  uv.lock  README.md  BENCHMARKS.md

and nothing that gives answers away: no `reference/`, no `tests/hidden/`, no solution text.
The student notebooks in it are rendered from `reference/` at release time (the same function
`make student-notebooks` uses), so a release never carries a stale or hand-edited `labs/` file;
the pages the labs share (`labs/*.md`, such as `meshes.md`) are copied as they are.
After copying, `leaks()` scans the whole folder; a release with a leak is refused and no
archive is written.
"""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile
import textwrap
from pathlib import Path

import nbformat

from labkit.course import authoring, catalog

# What a release holds, relative to the kit's root: folders and files, in this order.
CONTENTS = (
    "labkit",
    "tests/public",
    "docs",
    "Makefile",
    "noxfile.py",
    "pyproject.toml",
    "uv.lock",
    "README.md",
    "BENCHMARKS.md",
)
# Never copied, wherever they sit.
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", ".pytest_cache")
# Folders whose presence alone is a leak.
FORBIDDEN = ("reference", "tests/hidden")
# Written into every release, so that building again may replace an earlier release (and nothing else).
MARKER = ".labkit-release"
# The kit's own code: never scanned for solution text (it is what every student gets anyway).
KIT_CODE = "labkit/"
# The kit's own files that document the solution markers; they name the marker but hold no solution.
DOCUMENTS_MARKERS = ("labkit/course/authoring.py", "docs/authoring.md")


class ReleaseError(RuntimeError):
    """The release could not be built; the message says why."""


class LeakedSolution(ReleaseError):
    """The release would give away a solution or a hidden test."""


def solutions(root: Path = catalog.ROOT) -> list[tuple[str, str]]:
    """(where, text) of every marked solution region in the reference notebooks, dedented.

    A region whose text the student notebook shows anyway (in a worked example, say) is no secret
    and is left out.
    """
    found = []
    for lab in catalog.labs(root):
        if not lab.reference.exists():
            continue
        nb = nbformat.read(lab.reference, as_version=4)
        shown = _squeeze(_code_of(lab.student, authoring.render(lab.reference)))
        for number, cell in enumerate(nb.cells, start=1):
            if cell.cell_type != "code":
                continue
            inside, lines = False, []
            for line in cell.source.splitlines():
                if authoring.BEGIN.match(line):
                    inside, lines = True, []
                elif authoring.END.match(line):
                    inside = False
                    text = textwrap.dedent("\n".join(lines)).strip()
                    if text and _squeeze(text) not in shown:
                        found.append((f"{lab.reference.name}, cell {number}", text))
                elif inside:
                    lines.append(line)
    return found


def _text_files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            try:
                yield path, path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue


def _code_of(path: Path, text: str) -> str:
    """The code a file holds: a notebook's code cells joined, any other file as it is."""
    if path.suffix != ".ipynb":
        return text
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable notebook is scanned as plain text
        return text
    return "\n".join(cell.source for cell in nb.cells)


def _squeeze(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def leaks(folder: Path, root: Path = catalog.ROOT) -> list[str]:
    """Everything in `folder` that gives an answer away, one line each; [] when the release is clean."""
    folder = Path(folder)
    problems = [f"{name}/ is in the release" for name in FORBIDDEN if (folder / name).exists()]
    regions = [(where, _squeeze(text)) for where, text in solutions(root)]
    for path, text in _text_files(folder):
        rel = path.relative_to(folder).as_posix()
        in_notebook = path.suffix == ".ipynb" and ("BEGIN SOLUTION" in text or "END SOLUTION" in text)
        as_a_line = rel not in DOCUMENTS_MARKERS and any(
            authoring.BEGIN.match(line) for line in text.splitlines()
        )
        if in_notebook or as_a_line:
            problems.append(f"{rel} contains a solution marker")
        if rel.startswith(KIT_CODE):
            continue  # the kit's own code ships as it is; a one-line solution may well call the same helper
        code = _squeeze(_code_of(path, text))
        for where, region in regions:
            if region in code:
                problems.append(f"{rel} contains the solution of {where}")
    return problems


def _archive(folder: Path) -> Path:
    """folder.tar.gz next to the folder, the same bytes for the same files (no times, owners or modes of the host)."""
    target = folder.with_name(folder.name + ".tar.gz")

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder, arcname=folder.name, recursive=False, filter=normalise)
        for path in sorted(folder.rglob("*")):
            tar.add(
                path,
                arcname=f"{folder.name}/{path.relative_to(folder).as_posix()}",
                recursive=False,
                filter=normalise,
            )
    with open(target, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(buffer.getvalue())
    return target


def build(out: Path, root: Path = catalog.ROOT) -> Path:
    """Build the release in `out` (replacing an earlier release there) and `out`.tar.gz; returns the archive."""
    root, out = Path(root).resolve(), Path(out).resolve()
    if out == root or root.is_relative_to(out):
        raise ReleaseError(f"{out} holds the kit itself: choose another folder for the release")
    if out.exists():
        if not (out / MARKER).exists():
            raise ReleaseError(f"{out} exists and is not an earlier release: not overwriting it")
        shutil.rmtree(out)
    missing = [name for name in CONTENTS if not (root / name).exists()]
    if missing:
        raise ReleaseError(f"the kit at {root} has no {', '.join(missing)}")
    out.mkdir(parents=True)
    for name in CONTENTS:
        source, target = root / name, out / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=IGNORED)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for page in sorted((root / "labs").glob("*.md")):  # what several labs point to, said once
        (out / "labs").mkdir(exist_ok=True)
        shutil.copy2(page, out / "labs" / page.name)
    for lab in catalog.labs(root):
        target = out / "labs" / lab.student.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if lab.reference.exists():
            target.write_text(authoring.render(lab.reference))
        else:
            shutil.copy2(lab.student, target)
    (out / MARKER).write_text("A student release of the lab kit, built by `python -m labkit release`.\n")
    found = leaks(out, root)
    if found:
        raise LeakedSolution(
            f"the release in {out} would give answers away, so no archive was written:\n  "
            + "\n  ".join(found)
        )
    return _archive(out)
