"""The course's state: the TA's inputs (roster, policy, overrides, extensions, adjustments), kept with the class's
output.

    OUT/course/manifest.json   {"format": 1, "inputs": {name: {"file", "from", "sha256"}}}
    OUT/course/roster.csv      the copy of each input the class was last graded with
    OUT/course/policy.toml
    OUT/course/overrides.csv
    OUT/course/extensions.csv
    OUT/course/adjustments.csv

Every grading command reads its inputs here: a flag given (`--overrides FILE`) replaces the kept copy,
a flag left out uses it, so a later run without the flags grades with the same roster, policy,
overrides and extensions. `--forget NAME` drops one. A run that changes one says so (the lines added
and removed). The policy is kept too: grading with another one is refused unless asked for by name
(`--change-policy`), since it changes every grade of the term.

Every input is checked before anything is graded (the references included): a bad one is refused
with its file and line (InputError; `grade` exits 2), and nothing is written.

The review page (`make review`, labkit/grading/review/) writes the adjustments, the overrides and the manifest
while a run may be reading them. Both take the course state's lock (`locked`) around what they write, and a run
writes only what it changes: a kept copy it graded with is never written back, an input the review named in the
manifest while the run read its inputs stays named, and a file the run replaces or forgets must still be as the
run read it (else InputError: nothing is graded, and a second run starts from the file as it is now).

The inputs and their checks are a small registry (`labkit/grading/state/registry.py`, `INPUTS`); this
module keeps them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.course import catalog
from labkit.grading.state import policy as policy_mod
from labkit.grading.state.files import write_atomic
from labkit.grading.state.registry import (  # noqa: F401 - the registry, as the kit and its tests name it here
    INPUTS,
    POLICY_FIX,
    Context,
    Input,
    InputError,
    test_points,
)

FOLDER = "course"  # OUT/course
MANIFEST = "manifest.json"
HISTORY = "history"  # OUT/course/history/<file>-<digest>: every kept copy a later run replaced or forgot
LOCK = ".lock"  # where a folder cannot be locked itself: see `locked`
ADD = "+"  # `--overrides +FILE`: FILE's lines added to the kept copy's, not in their place
FORMAT = 1


def add_arguments(parser) -> None:
    """Each input's flag, `--forget`, `--change-policy` and `--course`, on a command that grades; then the
    regrade's `--students` and `--retry`."""
    for entry in INPUTS.values():
        parser.add_argument(
            f"--{entry.name}",
            type=Path,
            default=None,
            help=f"{entry.help}; kept in OUT/{FOLDER}/ for later runs",
        )
    parser.add_argument(
        "--forget",
        default="",
        help=f"comma-separated inputs to drop from OUT/{FOLDER}/ (from: {', '.join(INPUTS)})",
    )
    parser.add_argument(
        "--change-policy",
        action="store_true",
        help="grade with a policy other than the one this class was graded with (every grade changes)",
    )
    parser.add_argument(
        "--course",
        type=Path,
        default=None,
        help=f"where the course's state is kept (default OUT/{FOLDER}; a Slurm shard reads its run's)",
    )
    # and the regrade's own two, which no later run keeps
    parser.add_argument(
        "--students",
        default=None,
        help="comma-separated ids: grade these students again, whatever was kept for them",
    )
    parser.add_argument(
        "--retry",
        action="store_true",
        help="grade again every unit whose kept result is an error or a timeout",
    )


def request_fields(args) -> dict:
    """The fields of a grading request (`grade.Request`) that `add_arguments`' flags (but the regrade's) give."""
    return {
        "inputs": given_of(args),
        "course": args.course,
        "forget": args.forget,
        "change_policy": args.change_policy,
    }


def given_of(args) -> dict[str, Path | None]:
    """The inputs a command's arguments name (see `add_arguments`)."""
    return {name: getattr(args, name, None) for name in INPUTS}


# ----------------------------------------------------------------------------------------
# Reading, checking and keeping the state.
# ----------------------------------------------------------------------------------------


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """The course state's lock, held by a grading run while it keeps its inputs and by the review page while it
    saves: a lock of the folder itself (flock), so that no file is added to it; where the file system locks no
    folder (NFS), a lock file, LOCK, which every taker on that file system then uses alike."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            os.close(fd)
            fd = -1
            fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _file_sha(path: Path) -> str | None:
    """The digest of a file's bytes as text, or None where there is none (or it cannot be read)."""
    try:
        return _sha(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


@dataclass
class Source:
    text: str
    origin: str  # the path the TA gave, as the messages and the results name it
    kept: bool  # read from the kept copy (no flag given this run)


@dataclass
class State:
    folder: Path
    manifest: dict
    sources: dict[str, Source]  # name -> the text graded with this run (absent: no such input)
    changes: list[str]  # what this run changes in the kept state, one line per input
    notes: list[str]  # what the TA should know (a kit default that differs from the kept policy)
    values: dict[str, Any] = field(default_factory=dict)
    # name -> the digest of its file in the folder as the run began (None: none there)
    seen: dict[str, str | None] = field(default_factory=dict)

    def check(self, context: Context, needs_class: bool) -> None:
        """Parse and check the inputs of one phase; InputError names the file and line (and the kept copy)."""
        for name, entry in INPUTS.items():
            if entry.needs_class != needs_class or name not in self.sources:
                continue
            src = self.sources[name]
            # a kept copy checked against today's class: a dropped student's lines stay, inactive, and are named
            context.inactive = [] if src.kept and entry.needs_class else None
            try:
                self.values[name] = entry.check(src.text, src.origin, context)
                self.notes.extend(context.inactive or [])
            except ValueError as e:
                where = (
                    (
                        f" (the copy kept in {self.folder / entry.file}: give a corrected --{name} FILE, or "
                        f"--forget {name})"
                    )
                    if src.kept
                    else ""
                )
                raise InputError(f"{e}{where}") from None
            finally:
                context.inactive = None
            if name == "roster":
                context.students = set(self.values[name].students)
            if name == "policy":
                context.extra_credit = dict(self.values[name].extra)

    def save(self) -> None:
        """Keep what this run graded with, under the course state's lock: only what changed is written (a run
        that changes nothing writes nothing), never a kept copy it graded with (the review page may have saved
        points in it since), and an input named in the manifest since the run began stays named. InputError
        where a file this run replaces or forgets changed since it read it."""
        with locked(self.folder):
            now = read_manifest(self.folder).get("inputs", {})
            began = self.manifest.get("inputs", {})
            inputs = {
                name: {"file": INPUTS[name].file, "from": src.origin, "sha256": _sha(src.text)}
                for name, src in self.sources.items()
            }
            since = {n: now[n] for n in INPUTS if n in now and n not in began and n not in self.sources}
            written = [n for n, src in self.sources.items() if self._rewrites(n, src)]
            removed = [
                n
                for n in INPUTS
                if n not in self.sources and n not in since and (self.folder / INPUTS[n].file).exists()
            ]
            for name in written + removed:
                self._unchanged_since_read(name)
            for name in written:
                self._keep_replaced(name, self.sources[name].text)
                write_atomic(self.folder / INPUTS[name].file, self.sources[name].text)
            for name in removed:
                self._keep_replaced(name, None)
                (self.folder / INPUTS[name].file).unlink(missing_ok=True)
            inputs |= since
            if inputs != now or not (self.folder / MANIFEST).is_file():
                write_atomic(
                    self.folder / MANIFEST,
                    json.dumps({"format": FORMAT, "inputs": inputs}, indent=1, sort_keys=True) + "\n",
                )

    def _rewrites(self, name: str, src: Source) -> bool:
        """Whether this run writes input `name`'s file: one given this run whose text is not the file's, or a kept
        copy whose file is gone."""
        path = self.folder / INPUTS[name].file
        if src.kept:
            return not path.is_file()
        return _file_sha(path) != _sha(src.text)

    def _unchanged_since_read(self, name: str) -> None:
        """InputError where input `name`'s file changed after this run read it (points saved on the review page
        while the run started): replacing it would lose them."""
        path = self.folder / INPUTS[name].file
        if _file_sha(path) == self.seen.get(name):
            return
        raise InputError(
            f"{path}: changed while this run read its inputs (points saved on the review page?); nothing is "
            f"graded and nothing is replaced. Run the command again: it starts from the file as it is now"
        )

    def _keep_replaced(self, name: str, text: str | None) -> None:
        """Before the kept copy of input `name` is replaced by `text` (None: forgotten), keep it in
        OUT/course/history/ by its digest, and say so."""
        path = self.folder / INPUTS[name].file
        try:
            old = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return
        if old == text:
            return
        kept = self.folder / HISTORY / f"{path.stem}-{_sha(old)[:12]}{path.suffix}"
        if not kept.exists():
            write_atomic(kept, old)
        self.changes.append(f"{name}: the copy it replaces is kept as {kept}")

    def lines(self) -> list[str]:
        """The course state this run grades with, and what it changed: for the run's summary."""
        used = ", ".join(f"{n} ({s.origin}{', kept' if s.kept else ''})" for n, s in self.sources.items())
        out = [f"course state ({self.folder}): {used or 'no inputs'}"]
        return out + [f"  changed: {c}" for c in self.changes] + [f"  note: {n}" for n in self.notes]


def read_manifest(folder: Path) -> dict:
    try:
        data = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("inputs"), dict) else {}


def _read_given(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text (save it as CSV UTF-8)") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror or e})") from None


def _diff(old: str, new: str) -> str:
    """The lines added and removed, header and blank lines aside."""

    def body(text):
        return [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]

    before, after = body(old), body(new)
    added = [ln for ln in after if ln not in before]
    removed = [ln for ln in before if ln not in after]
    parts = [
        f"{len(added)} line{'s' if len(added) != 1 else ''} added"
        + (f" ({'; '.join(added[:3])}{' ...' if len(added) > 3 else ''})" if added else "")
    ]
    parts.append(
        f"{len(removed)} removed"
        + (f" ({'; '.join(removed[:3])}{' ...' if len(removed) > 3 else ''})" if removed else "")
    )
    return ", ".join(parts) if added or removed else "the same lines, reordered or reformatted"


def _policy_rules(text: str, origin: str, labs: list[int]) -> dict | None:
    try:
        return policy_mod.parse(text, origin, labs).to_json() | {"source": ""}
    except policy_mod.PolicyError:
        return None  # the check says why, naming the line


def read(
    folder: Path,
    given: dict[str, Path | None],
    *,
    forget: str = "",
    change_policy: bool = False,
    graded_policy: dict | None = None,
    labs: list[int] | None = None,
) -> State:
    """The inputs this run grades with: each one given, else the kept copy, else none (the policy: the kit's).

    `graded_policy`: the policy of the results already in OUT (scoreboard.json), for a class graded before
    its state was kept. InputError for a file that cannot be read, an unknown name to forget, or a policy
    that differs from the class's without `change_policy`.
    """
    folder = Path(folder)
    labs = labs if labs is not None else [lab.number for lab in catalog.labs()]
    dropped = _forgotten(given, forget)
    seen = {name: _file_sha(folder / entry.file) for name, entry in INPUTS.items()}
    manifest = read_manifest(folder)
    kept = manifest.get("inputs", {})
    sources: dict = {}
    changes: list[str] = []
    notes: list[str] = []
    for name, entry in INPUTS.items():
        old = _kept_copy(folder, name, entry, kept, given.get(name) is None and name not in dropped)
        if name in dropped:
            if old is not None:
                changes.append(f"{name}: forgotten (was {old.origin})")
            if name != "policy":
                continue
            old, change_policy = None, True  # back to the kit's policy, asked for by name
        path = given.get(name)
        new = _source_of(name, path, old)
        if new is None:
            continue
        sources[name] = new
        change = _change(name, old, new, path)
        if change:
            changes.append(change)
    if "policy" in sources:
        _check_policy_change(sources, kept, folder, labs, change_policy, graded_policy, changes, notes)
    return State(folder, manifest, sources, changes, notes, seen=seen)


def _forgotten(given: dict[str, Path | None], forget: str) -> list[str]:
    """The inputs `--forget` names, each a course input not also given."""
    unknown = [n for n in given if n not in INPUTS]
    if unknown:
        raise InputError(f"no course input named {', '.join(unknown)} (known: {', '.join(INPUTS)})")
    dropped = [n.strip() for n in forget.split(",") if n.strip()]
    for name in dropped:
        if name not in INPUTS:
            raise InputError(f"--forget {name}: no such course input (known: {', '.join(INPUTS)})")
        if given.get(name) is not None:
            raise InputError(f"--forget {name} and --{name} together: give one or the other")
    return dropped


def _kept_copy(folder: Path, name: str, entry, kept: dict, wanted: bool) -> Source | None:
    """The kept copy of input `name`, where the manifest names one and it is `wanted` (nothing given in its
    place, not forgotten) or its file is there to compare with; InputError where the manifest's copy is gone."""
    if name not in kept or not (wanted or (folder / entry.file).is_file()):
        return None
    try:
        return Source((folder / entry.file).read_text(encoding="utf-8"), str(kept[name]["from"]), True)
    except (OSError, UnicodeDecodeError, KeyError, TypeError):
        raise InputError(
            f"{folder / entry.file}: the kept copy of the {name} is gone or unreadable "
            f"(its manifest {folder / MANIFEST} names it): give --{name} FILE again, or "
            f"--forget {name}"
        ) from None


def _source_of(name: str, path: Path | None, old: Source | None) -> Source | None:
    """What input `name` is this run: the file given, else the kept copy, else (the policy) the kit's own."""
    if path is not None and str(path).startswith(ADD) and name != "policy":
        return _added(name, Path(str(path)[len(ADD) :]), old)
    if path is not None:
        return Source(_read_given(path), str(path), False)
    if old is not None:
        return old
    if name == "policy" and policy_mod.DEFAULT_PATH.exists():
        return Source(
            policy_mod.DEFAULT_PATH.read_text(encoding="utf-8"),
            str(policy_mod.DEFAULT_PATH.relative_to(catalog.ROOT)),
            False,
        )
    return None


def _added(name: str, path: Path, old: Source | None) -> Source:
    """`--NAME +FILE`: the kept copy with FILE's lines after its own (FILE alone where none is kept); FILE's
    header must be the kept copy's, so that every line reads the same. Line numbers count the kept lines first."""
    text = _read_given(path)
    if old is None:
        return Source(text, str(path), False)
    header, *rows = text.splitlines()
    kept_header = old.text.removeprefix("\ufeff").splitlines()[:1]
    if [header.strip().lower()] != [h.strip().lower() for h in kept_header]:
        raise InputError(
            f"{path}, line 1: its header {header.strip()!r} is not the kept {name}'s "
            f"{(kept_header or [''])[0].strip()!r} (field header; fix: give the kept copy's header, then the "
            f"lines to add)"
        )
    body = old.text.rstrip("\n") + "\n" + "".join(f"{row}\n" for row in rows if row.strip())
    return Source(body, f"{old.origin} + {path}", False)


def _change(name: str, old: Source | None, new: Source, path: Path | None) -> str | None:
    """The line that says how input `name` changed from the kept copy, if it did."""
    if old is None:
        return (
            f"{name}: now {new.origin} (none was kept before)" if not new.kept and path is not None else None
        )
    if old.text != new.text:
        return f"{name}: {new.origin}: {_diff(old.text, new.text)}"
    if old.origin != new.origin:
        return f"{name}: the same text, now from {new.origin} (was {old.origin})"
    return None


def _check_policy_change(
    sources: dict[str, Source],
    kept: dict,
    folder: Path,
    labs: list[int],
    change_policy: bool,
    graded_policy: dict | None,
    changes: list[str],
    notes: list[str],
) -> None:
    new = sources["policy"]
    rules = _policy_rules(new.text, new.origin, labs)
    if "policy" in kept and new.kept and policy_mod.DEFAULT_PATH.exists():
        default = policy_mod.DEFAULT_PATH.read_text(encoding="utf-8")
        if default != new.text:
            notes.append(
                f"the kit's tests/policy.toml differs from the policy this class is graded with "
                f"({folder / INPUTS['policy'].file}, from {new.origin}); the class's is used. To grade "
                f"with the kit's: --policy tests/policy.toml --change-policy"
            )
    before = None
    if "policy" in kept and not new.kept:
        text = (folder / INPUTS["policy"].file).read_text(encoding="utf-8")
        before = _policy_rules(text, str(kept["policy"].get("from", "")), labs)
        what = f"the policy this class was graded with ({folder / INPUTS['policy'].file}, from {kept['policy']['from']})"
    elif "policy" not in kept and graded_policy:
        # results of an older kit may lack a key of today's policy: only what they say is compared
        before = {k: v for k, v in graded_policy.items() if k != "source"}
        rules = {k: v for k, v in rules.items() if k in before} if rules else rules
        what = f"the policy of the results already in {folder.parent} (scoreboard.json)"
    if before is None or rules is None or rules == before:
        return
    if not change_policy:
        raise InputError(
            f"{new.origin}, line 1: this policy differs from {what}: "
            f"{_rule_diff(before, rules)}. Every grade of the term would change: to grade with it, "
            f"add --change-policy (make: CHANGE_POLICY=1); to keep the class's, leave --policy out"
        )
    changes.append(f"policy: changed, asked for with --change-policy: {_rule_diff(before, rules)}")


def _rule_diff(before: dict, after: dict) -> str:
    keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return "; ".join(f"{k} {before.get(k)!r} -> {after.get(k)!r}" for k in keys)


def copy(src: Path, dst: Path) -> None:
    """Put a kept state in another output folder (a merge); the same files, byte for byte."""
    src, dst = Path(src), Path(dst)
    if not (src / MANIFEST).is_file() or src.resolve() == dst.resolve():
        return
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


def main(argv: list[str] | None = None) -> int:
    """`python -m labkit.grading.state.course names`: the inputs' names, for the Makefile's flags."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["names"]:
        print(" ".join(INPUTS))
        return 0
    print("usage: python -m labkit.grading.state.course names", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
