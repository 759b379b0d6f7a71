"""The term's scope, kept with the course's state: where the submissions come from, which labs and which
device configurations the class is graded on.

    OUT/course/term.json   {"format": 1, "sources": [{"path", "kind"}], "labs": [3, 5],
                            "configs": ["cpu-1", "cpu-8"]}
    OUT/downloads.json     {path: {"digest", "notes"}}: what each download held when it was last read into
                           this OUT's collected/ (beside it, not in the course's state: a shard has its own)

So that the bare command means "the same again": `grade` with no `--submissions`, `--labs` or `--configs`
grades the term so far, from the kept sources (a kept download whose files changed, such as a folder
`labkit canvas collect` filled again, is read again and adds what is new in it), on the kept labs and
configurations. A value given adds to the term and narrows the run: `--labs 3` after a term of labs 3 and
5 grades lab 3 again and holds lab 5 as it was (labkit/grading/running/held.py); `--labs 7` adds lab 7 to
the term and grades it alone. `--forget labs` (or `configs`, `submissions`) drops the kept value, so that
the one given (or the default: every lab, every configuration here, `submissions/`) is the term's from then.

The students are not kept here: the class is the roster's (or, without one, the submission folders'), and
`--students` narrows one run. The time a late penalty counts from is the policy's (`[late] accept`),
kept with the policy.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading.state.files import write_atomic

FILE = "term.json"
FORMAT = 1
NAMES = ("submissions", "labs", "configs")  # what --forget takes besides the course's inputs
DOWNLOAD, FOLDER = "download", "folder"  # an LMS download (added up in OUT/collected), the kit's own layout
DEFAULT_SUBMISSIONS = Path("submissions")


class TermError(ValueError):
    """The term's scope cannot be used: the message names the file and what to do."""


@dataclass
class Term:
    """The term one run grades, and the part of it this run grades again (the rest is held as it was)."""

    folder: Path
    sources: list[dict]  # in the order given: {"path", "kind"}
    labs: list[int]  # the term's, in the course's order
    configs: list[str]
    run_labs: list[int]  # what this run was asked to grade (the term's own when nothing was given)
    run_configs: list[str]
    changes: list[str] = field(default_factory=list)
    kept: dict = field(default_factory=dict)  # the file as read

    @property
    def narrowed(self) -> bool:
        return self.run_labs != self.labs or self.run_configs != self.configs

    def lines(self) -> list[str]:
        labs = ", ".join(str(n) for n in self.labs)
        what = (
            f"term ({self.folder / FILE}): labs {labs}; configurations {', '.join(self.configs)}; sources "
            + ("; ".join(s["path"] for s in self.sources) or "none")
        )
        out = [what]
        if self.narrowed:
            out.append(
                f"  this run grades labs {', '.join(map(str, self.run_labs))} on {', '.join(self.run_configs)} "
                "again; every other unit is held as it was"
            )
        return out + [f"  changed: {c}" for c in self.changes]

    def save(self) -> None:
        """Keep the term (only where it changed)."""
        data = {"format": FORMAT, "sources": self.sources, "labs": self.labs, "configs": self.configs}
        if data != self.kept:
            write_atomic(self.folder / FILE, json.dumps(data, indent=1, sort_keys=True) + "\n")


def split_forget(forget: str, inputs: list[str]) -> tuple[list[str], str]:
    """`--forget`'s names: (those of the term, the rest for the course's inputs); TermError for an unknown one."""
    names = [n.strip() for n in (forget or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES and n not in inputs]
    if unknown:
        raise TermError(
            f"--forget {', '.join(unknown)}: no such course input (known: {', '.join([*inputs, *NAMES])})"
        )
    return [n for n in names if n in NAMES], ",".join(n for n in names if n not in NAMES)


def read(folder: Path) -> dict:
    path = Path(folder) / FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not (
            isinstance(data, dict)
            and all(isinstance(s, dict) and isinstance(s.get("path"), str) for s in data.get("sources", []))
            and all(isinstance(n, int) for n in data.get("labs", []))
            and all(isinstance(c, str) for c in data.get("configs", []))
        ):
            raise ValueError("not the kit's format")
    except (OSError, ValueError) as e:
        raise TermError(
            f"{path}: the term's kept scope cannot be read ({e}): give --submissions, --labs and --configs "
            "with --forget submissions,labs,configs to keep them again"
        ) from None
    return data


def resolve(
    folder: Path,
    *,
    submissions: Path | None,
    labs: list[int] | None,
    configs: list[str] | None,
    forget: list[str],
    all_labs: list[int],
    default_configs: list[str],
    is_download,
) -> Term:
    """The term this run grades: the kept scope, with what was given added, what was forgotten dropped.

    `labs`, `configs`: what the run was given (None: nothing); `all_labs`: the course's labs, in order;
    `default_configs`: every configuration here; `is_download`: whether a path is an LMS download.
    """
    folder = Path(folder)
    kept = read(folder)
    changes: list[str] = []
    old_labs = [] if "labs" in forget else list(kept.get("labs", []))
    old_configs = [] if "configs" in forget else list(kept.get("configs", []))
    for name, old in (
        ("labs", kept.get("labs")),
        ("configs", kept.get("configs")),
        ("submissions", kept.get("sources")),
    ):
        if name in forget and old:
            changes.append(
                f"{name}: forgotten (was {', '.join(str(o.get('path', o)) if isinstance(o, dict) else str(o) for o in old)})"
            )
    run_labs = labs if labs else (old_labs or list(all_labs))
    term_labs = [n for n in all_labs if n in set(old_labs) | set(run_labs)]
    added = [n for n in term_labs if n not in old_labs]
    if old_labs and added:
        changes.append(f"labs: {', '.join(map(str, added))} added to the term")
    run_configs = configs if configs else (old_configs or list(default_configs))
    term_configs = old_configs + [c for c in run_configs if c not in old_configs]
    if old_configs and term_configs != old_configs:
        changes.append(
            f"configs: {', '.join(c for c in term_configs if c not in old_configs)} added to the term"
        )
    sources = _sources(kept, submissions, "submissions" in forget, is_download, changes)
    run_labs = [n for n in term_labs if n in run_labs]
    run_configs = [c for c in term_configs if c in run_configs]
    return Term(folder, sources, term_labs, term_configs, run_labs, run_configs, changes, kept)


def _sources(kept: dict, given: Path | None, forgotten: bool, is_download, changes: list[str]) -> list[dict]:
    """The term's sources: the kept ones, and the one given added (a folder of the kit's layout replaces the
    kept folder; it cannot be mixed with LMS downloads, whose notebooks are added up in OUT/collected)."""
    sources = [] if forgotten else [dict(s) for s in kept.get("sources", [])]
    if given is None:
        if not sources:
            given = DEFAULT_SUBMISSIONS
        else:
            return sources
    path = str(Path(given).absolute())
    if not Path(path).exists():
        raise TermError(
            f"the submissions folder {path} does not exist "
            "(expected <student_id>/lab-<N>.ipynb inside it, or an LMS download)"
        )
    kind = DOWNLOAD if is_download(Path(path)) else FOLDER
    if any(s["path"] == path for s in sources):
        return sources
    others = [s for s in sources if s.get("kind") != kind]
    if others:
        raise TermError(
            f"{path}: a {'folder of <student_id>/lab-<N>.ipynb' if kind == FOLDER else 'LMS download'}, and "
            f"this class's submissions come from {'LMS downloads' if kind == FOLDER else 'the folder'} "
            f"{', '.join(s['path'] for s in others)} (kept in the term): the two cannot be added up; to grade "
            "from this one alone from now on, add --forget submissions (make: FORGET=submissions)"
        )
    if kind == FOLDER and sources:
        changes.append(f"submissions: now {path} (was {sources[0]['path']})")
        return [{"path": path, "kind": kind}]
    if sources:
        changes.append(f"submissions: {path} added to the term's downloads")
    return [*sources, {"path": path, "kind": kind}]


def digest(path: Path) -> str:
    """What a source holds, to tell whether it changed: a file's bytes, a folder's names, sizes and times."""
    path = Path(path)
    if path.is_file():
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    parts = []
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            parts.append(f"{p.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


READ = "downloads.json"  # OUT/downloads.json


class Read:
    """What each download held when it was last read into one OUT's collected/ (`OUT/downloads.json`)."""

    def __init__(self, out: Path):
        self.path = Path(out) / READ
        try:
            data = json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}
        except (OSError, ValueError):
            data = {}  # read every download again: adding up what is already kept changes nothing
        self.data: dict = data if isinstance(data, dict) else {}

    def fresh(self, source: str, digest: str) -> bool:
        """Whether `source` changed since it was last read into this OUT (one never read is fresh)."""
        entry = self.data.get(source)
        return not isinstance(entry, dict) or entry.get("digest") != digest

    def notes(self, source: str) -> list[str]:
        entry = self.data.get(source)
        notes = entry.get("notes") if isinstance(entry, dict) else None
        return [str(n) for n in notes] if isinstance(notes, list) else []

    def mark(self, source: str, digest: str, notes: list[str]) -> None:
        self.data[source] = {"digest": digest, "notes": list(notes)}
        write_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=True) + "\n")
