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

The inputs are a small registry, `INPUTS`: each has a name (its flag `--NAME`, the Makefile's
`NAME=` in capitals), the name of its kept copy, and a check that parses its text against the class
(`Context`) and raises ValueError naming the file and line. One whose parsed value goes into the
results names the key (`results_key`). Adding an input is one more `Input(...)` line in `INPUTS`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.course import catalog
from labkit.grading.state import adjustments as adjustments_mod
from labkit.grading.state import deadlines, table
from labkit.grading.state import overrides as overrides_mod
from labkit.grading.state import pins as pins_mod
from labkit.grading.state import policy as policy_mod
from labkit.grading.state import roster as roster_mod
from labkit.grading.state.files import write_atomic

FOLDER = "course"  # OUT/course
MANIFEST = "manifest.json"
HISTORY = "history"  # OUT/course/history/<file>-<digest>: every kept copy a later run replaced or forgot
ADD = "+"  # `--overrides +FILE`: FILE's lines added to the kept copy's, not in their place
FORMAT = 1


class InputError(ValueError):
    """A TA's input that cannot be used: the message names the file and the line, and what to do."""


@dataclass
class Context:
    """What the inputs are checked against: the course's labs, and the class once it is known."""

    labs: list[int]
    students: set[str] | None = None  # the roster's ids where there is one, else the submission folders
    tests: dict[int, set[str]] = field(
        default_factory=dict
    )  # lab -> its test names, collected when first asked
    points: dict[int, float] = field(
        default_factory=dict
    )  # lab -> what its tests are worth, collected with them
    extra_credit: dict[int, float] = field(default_factory=dict)  # the policy's [labs.N] extra_credit
    # while a kept copy is checked: its lines of students no longer in the class, kept but inactive
    inactive: list[str] | None = None

    def lab_tests(self) -> Mapping[int, set[str]]:
        """lab -> the names of its tests (public and hidden), each lab's collected only when asked for."""
        return _LabTests(self)

    def lab_points(self) -> Mapping[int, float]:
        """lab -> the points its tests are worth together (a points override's bound), collected when asked."""
        return _LabPoints(self)


class _LabTests(Mapping):
    def __init__(self, context: Context):
        self.context = context

    def __getitem__(self, lab: int) -> set[str]:
        if lab not in self.context.labs:
            raise KeyError(lab)
        if lab not in self.context.tests:
            points = test_points(catalog.lab(str(lab)))
            self.context.tests[lab], self.context.points[lab] = set(points), sum(points.values())
        return self.context.tests[lab]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.context.labs))

    def __len__(self) -> int:
        return len(self.context.labs)

    def __contains__(self, lab) -> bool:
        return lab in self.context.labs


class _LabPoints(_LabTests):
    def __getitem__(self, lab: int) -> float:  # type: ignore[override]
        super().__getitem__(lab)
        return self.context.points[lab]


class _Names:
    """A pytest plugin that notes the name of every lab test collected (what the judge reports as `test`)."""

    def __init__(self):
        self.names: set[str] = set()
        self.points: dict[str, float] = {}
        self.errors: list[str] = []

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(report.nodeid)

    def pytest_collection_finish(self, session):
        for item in session.items:
            if "lab_run" in getattr(item, "fixturenames", ()):
                self.points[item.originalname] = getattr(item.function, "__labkit_points__", 1)
        self.names = set(self.points)


def test_points(lab: catalog.Lab) -> dict[str, float]:
    """Each of a lab's public and hidden tests by name, with its points, collected without running anything."""
    import pytest

    from labkit.judge import judge

    plugin = _Names()
    status = pytest.main(judge._args(lab.test_dirs(hidden=True)) + ["--collect-only"], plugins=[plugin])
    if plugin.errors or status not in (0, 5):  # 5: none collected, which the names then say
        raise InputError(
            f"the tests of {lab.name} could not be collected ({', '.join(plugin.errors) or f'pytest exit {status}'})"
        )
    return plugin.points


@dataclass(frozen=True)
class Input:
    name: str  # the flag is --NAME, the Makefile's variable NAME in capitals
    file: str  # the kept copy: OUT/course/<file>
    help: str
    check: Callable[
        [str, str, Context], Any
    ]  # (text, source, class) -> parsed; ValueError naming source and line
    needs_class: bool = True  # checked once the class (roster or submission folders) is known
    results_key: str | None = None  # where the parsed value goes in the results; None: grade uses it itself


def _check_roster(text: str, source: str, context: Context) -> roster_mod.Roster:
    return roster_mod.parse(text, source)


def _check_policy(text: str, source: str, context: Context) -> policy_mod.Policy:
    try:
        return policy_mod.parse(text, source, context.labs)
    except policy_mod.PolicyError as e:
        said = str(e)
        if not said.startswith(f"{source}: "):
            raise
        what = said[len(source) + 2 :]  # in the one shape of every TA file's refusal: line, field, fix
        found = re.search(r"\[([\w.]+)\](?: (\w+))?", what)
        key = (
            f"[{found.group(1)}]" + (f" {found.group(2)}" if found and found.group(2) else "")
            if found
            else ""
        )
        raise policy_mod.PolicyError(
            table.message(source, _toml_line(text, said), what, key, POLICY_FIX)
        ) from None


POLICY_FIX = 'the keys of a policy and their values are in docs/grading.md, "Points and the policy"'


def _toml_line(text: str, message: str) -> int | None:
    """The line of the `[table] key` a policy message names (tomllib's own messages give theirs)."""
    found = re.search(r"\[([\w.]+)\](?: (\w+))?", message)
    if not found:
        return None
    table, key = found.groups()
    current = ""
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            current = stripped.strip("[]").strip()
            if current == table and key is None:
                return n
        elif current == table and key and re.match(rf"{re.escape(key)}\s*=", stripped):
            return n
    return None


def _check_overrides(text: str, source: str, context: Context) -> list[dict]:
    return overrides_mod.parse(
        text,
        source,
        context.students or set(),
        context.lab_tests(),
        context.lab_points(),
        context.extra_credit,
        context.inactive,
    )


def _check_extensions(text: str, source: str, context: Context) -> dict:
    return deadlines.parse_extensions(
        text, source, context.students or set(), set(context.labs), context.inactive
    )


def _check_adjustments(text: str, source: str, context: Context) -> list[dict]:
    return adjustments_mod.parse(
        text, source, context.students or set(), set(context.labs), context.lab_points(), context.inactive
    )


def _check_pins(text: str, source: str, context: Context) -> dict:
    return pins_mod.parse_pins(text, source, context.students or set(), set(context.labs), context.inactive)


# The registry, in the order the inputs are checked (the roster first: the others are checked against it).
INPUTS: dict[str, Input] = {
    i.name: i
    for i in [
        Input(
            "roster",
            "roster.csv",
            "CSV of the class (student, and optionally name, email, lms_id, section, leaderboard)",
            _check_roster,
            needs_class=False,
        ),
        Input(
            "policy",
            "policy.toml",
            "the grading policy (TOML; default tests/policy.toml)",
            _check_policy,
            needs_class=False,
        ),  # a change of policy is asked for by name: --change-policy
        Input(
            "overrides",
            "overrides.csv",
            "CSV of a TA's overrides (student,lab,points,test,status,comment)",
            _check_overrides,
            results_key="overrides",
        ),
        Input(
            "extensions",
            "extensions.csv",
            "CSV of extensions (student,lab,days)",
            _check_extensions,
            results_key="extensions",
        ),
        Input(
            "adjustments",
            "adjustments.csv",
            "CSV of a TA's point adjustments and rubric items (student,lab,points,comment[,item,max])",
            _check_adjustments,
            results_key="adjustments",
        ),
        Input(
            "pins",
            "pins.csv",
            "CSV of the kept versions a TA pins (student,lab,version,comment): the one that counts",
            _check_pins,
        ),  # used by labkit/grading/intake/counted.py, before anything is graded
    ]
}


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
        """Keep what this run graded with (only where it changed: a run that changes nothing writes nothing)."""
        inputs = {
            name: {"file": INPUTS[name].file, "from": src.origin, "sha256": _sha(src.text)}
            for name, src in self.sources.items()
        }
        if inputs == self.manifest.get("inputs") and all(
            (self.folder / INPUTS[n].file).is_file() for n in inputs
        ):
            return
        for name, src in self.sources.items():
            self._keep_replaced(name, src.text)
            write_atomic(self.folder / INPUTS[name].file, src.text)
        for name, entry in INPUTS.items():
            if name not in self.sources:
                self._keep_replaced(name, None)
                (self.folder / entry.file).unlink(missing_ok=True)
        write_atomic(
            self.folder / MANIFEST,
            json.dumps({"format": FORMAT, "inputs": inputs}, indent=1, sort_keys=True) + "\n",
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
    return State(folder, manifest, sources, changes, notes)


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
