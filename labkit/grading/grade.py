"""Grade a class: every student, lab and device configuration, through the student loop's own pipeline.

    submissions/<student_id>/lab-<N>.ipynb   what the TA collected
    OUT/units/<student_id>/lab-<N>/<config>.json      one graded unit (student, lab, configuration)
    OUT/units/<student_id>/lab-<N>/<config>.run.json  its notebook run, kept as soon as the run ends
    OUT/work/<student_id>/lab-<N>/<config>/           the run's folder: executed notebook, log
    OUT/reference/...                                 the same for the reference solutions
    OUT/scoreboard.{csv,json,md,html}, OUT/feedback/  drawn by `scoreboard` from the graded units

Every unit runs its notebook with `execute.run_notebook` (a process of its own, on its
configuration) and is judged by `judge.judge` with the lab's public and hidden tests: the
same two stages as `make lab-N`. Runs go on `jobs` at a time; the main thread keeps each
run's record the moment it ends, and judges finished runs in batches, one pytest session
per lab for many students at once. Every file is written atomically, so a run stopped
half way keeps what it finished, and the next run grades only what is left.

Each unit has a key: a digest of the submission's bytes, the lab's tests and reference,
the configuration, the timeout, and the kit's grading code and locked environment. A unit
whose key has not changed is not graded again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil

from labkit import cost
from labkit.course import catalog, configs
from labkit.course.configs import DeviceConfig
from labkit.grading import deadlines, history, lms, scoreboard, similarity
from labkit.grading import overrides as overrides_mod
from labkit.grading import pods as pods_mod
from labkit.grading import policy as policy_mod
from labkit.grading import progress as progress_mod
from labkit.grading import roster as roster_mod
from labkit.grading.files import write_atomic
from labkit.judge import judge
from labkit.run import execute, jaxcache, sandbox, warm
from labkit.run.sandbox import DEFAULT_LIMITS, Limits

ROW_STATUSES = ("ok", "failed", "error", "timeout", "missing", "skipped")
FORMAT = 1  # of the unit files; part of every key
LARGE_BYTES = 10_000_000  # a notebook this large is graded, with a note (its outputs are not run)
MAX_BYTES = 200_000_000  # a file larger than this is not read at all
REFERENCE = "reference"  # how the reference solution's runs are labelled

# Modules of the kit that draw or drive, and do not change a grade: editing them regrades nothing.
_NOT_GRADING = {"__init__.py", "__main__.py", "cli.py", "report.py", "scoreboard.py", "loop.py",
                "authoring.py", "notebook.py", "release.py", "wheelhouse.py", "files.py", "policy.py",
                "roster.py", "lms.py", "gradescope.py", "deadlines.py", "overrides.py", "history.py"}
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
_LOOSE_NAME = re.compile(r"lab[\s_.-]*0*([1-9][0-9]*)", re.IGNORECASE)


class GradeError(RuntimeError):
    """The kit could not grade (bad arguments, a reference failing its own tests): exit non-zero."""


class ReferenceBroken(GradeError):
    pass


# ----------------------------------------------------------------------------------------
# What there is to grade.
# ----------------------------------------------------------------------------------------

@dataclass
class Submissions:
    students: dict[str, dict[int, Path]] = field(default_factory=dict)  # student -> lab -> path
    notes: dict[str, list[str]] = field(default_factory=dict)  # student -> what was ignored, and why
    class_notes: list[str] = field(default_factory=list)  # entries of the folder that are not students
    refused: dict[tuple[str, int], str] = field(default_factory=dict)  # (student, lab) -> why it is not graded


LINKED = ("symlink: {what} is a symbolic link, and a link is never followed into the grader (it could name "
          "another student's notebook or a file of the machine); hand in the notebook itself")


def discover(folder: Path, known_labs: list[int]) -> Submissions:
    """Read the submissions folder: DIR/<student_id>/lab-<N>.ipynb. Anything else is noted and ignored.

    Links are never followed: a student folder or a notebook that is a symbolic link (as `git clone`,
    `tar` or `cp -a` keep them), or a notebook that is not a regular file, is refused, and its rows say why."""
    subs = Submissions()
    for entry in sorted(Path(folder).iterdir()):
        if entry.name.startswith("."):
            continue  # .DS_Store, .ipynb_checkpoints, .git
        if entry.is_symlink():
            subs.students[entry.name] = {}
            subs.notes[entry.name] = [f"refused: {LINKED.format(what='this student folder')}"]
            for number in known_labs:
                subs.refused[(entry.name, number)] = LINKED.format(what="the student folder")
            continue
        if not entry.is_dir():
            subs.class_notes.append(f"{entry.name}: ignored, not a student folder "
                                    "(submissions go in <student_id>/lab-<N>.ipynb)")
            continue
        student = entry.name
        found: dict[int, Path] = {}
        notes: list[str] = []
        for item in sorted(entry.iterdir()):
            if item.name.startswith("."):
                continue
            m = catalog.NOTEBOOK_NAME.match(item.name)
            if m:
                number = int(m.group(1))
                if number in known_labs and item.is_symlink():
                    subs.refused[(student, number)] = LINKED.format(what=item.name)
                    notes.append(f"{item.name}: refused, it is a symbolic link")
                elif number in known_labs and not stat.S_ISREG(mode := item.lstat().st_mode) and not stat.S_ISDIR(mode):
                    subs.refused[(student, number)] = f"{item.name} is not a regular file"
                    notes.append(f"{item.name}: refused, it is not a regular file")
                elif number in known_labs:
                    found[number] = item
                else:
                    notes.append(f"{item.name}: ignored, there is no lab {number}")
                continue
            loose = _LOOSE_NAME.search(item.name)
            hint = ""
            if loose and item.name.lower().endswith(".ipynb") and int(loose.group(1)) in known_labs:
                hint = f" (rename it lab-{int(loose.group(1))}.ipynb to have it graded)"
            kind = "folder" if item.is_dir() else "file"
            notes.append(f"{item.name}: {kind} ignored, its name is not lab-<N>.ipynb{hint}")
        if not found:
            notes.insert(0, "no notebook named lab-<N>.ipynb in this folder")
        subs.students[student] = found
        subs.notes[student] = notes
    return subs


def shard_of(student: str, count: int) -> int:
    """Which of `count` shards grades `student` (1-based): fixed by the id alone, on every machine."""
    return int(hashlib.sha256(student.encode()).hexdigest()[:12], 16) % count + 1


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    m = re.fullmatch(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise GradeError(f"--shard takes i/N with 1 <= i <= N, e.g. 1/4; got {text!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Unit:
    student: str
    lab: int
    config: str
    path: Path | None  # the submission; None when it was not handed in (or refused)
    refused: str = ""  # why a submission handed in is not graded (a symbolic link...)

    @property
    def label(self) -> str:
        return f"{self.student}/{self.config}"

    @property
    def where(self) -> Path:
        return Path(self.student) / f"lab-{self.lab}" / self.config


# ----------------------------------------------------------------------------------------
# Keys: what a unit's grade depends on.
# ----------------------------------------------------------------------------------------

def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _code_digest(path: Path) -> str:
    """A module's code, not its layout: comments, formatting and docstrings do not change a grade."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return _file_digest(path)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return _sha(ast.dump(tree).encode())


def kit_digest(root: Path = catalog.ROOT) -> str:
    """The kit's grading code (as code: see `_code_digest`) and its locked environment."""
    parts = [sys.version]
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        if path.name not in _NOT_GRADING:
            parts.append(f"{path.relative_to(package)}:{_code_digest(path)}")
    lock = root / "uv.lock"
    parts.append(_file_digest(lock) if lock.exists() else "no lock")
    return _sha("\n".join(parts).encode())


def lab_digest(lab: catalog.Lab) -> str:
    """The lab's reference and every file of its public and hidden tests."""
    parts = [f"reference:{_file_digest(lab.reference) if lab.reference.exists() else 'none'}"]
    for folder in lab.test_dirs(hidden=True):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                parts.append(f"{path.relative_to(lab.root)}:{_file_digest(path)}")
    return _sha("\n".join(parts).encode())


def submission_digest(path: Path | None) -> str:
    if path is None or not path.exists():
        return "missing"
    if path.is_dir():
        return "folder:" + _sha("\n".join(sorted(p.name for p in path.iterdir())).encode())
    if path.stat().st_size > MAX_BYTES:
        return f"too-large:{path.stat().st_size}"
    return _file_digest(path)


def config_digest(config: DeviceConfig) -> str:
    return _sha(json.dumps(asdict(config), sort_keys=True, default=str).encode())


# ----------------------------------------------------------------------------------------
# From a run and the judge's outcomes to one row of the scoreboard.
# ----------------------------------------------------------------------------------------

def submission_notes(path: Path | None) -> list[str]:
    """What is worth saying about a file that can still be graded: its size, an old nbformat."""
    if path is None or not path.is_file():
        return []
    notes = []
    size = path.stat().st_size
    if size > MAX_BYTES:
        return notes
    if size > LARGE_BYTES:
        notes.append(f"the notebook is {size / 1e6:.0f} MB, mostly saved outputs: they are cleared before "
                     "grading; clear them before handing in (Kernel > Restart & Clear Output)")
    try:
        with open(path, "rb") as f:
            version = json.load(f).get("nbformat")
    except (OSError, ValueError, AttributeError):
        return notes
    if isinstance(version, int) and version < 4:
        notes.append(f"the notebook is in the old nbformat {version}; it was converted to nbformat 4 to be "
                     "graded: save it from a current Jupyter")
    return notes


def _clean(text: str, unit: Unit, out: Path) -> str:
    """Messages name files relative to the class, never by this machine's paths."""
    if unit.path is not None:
        text = text.replace(str(unit.path), f"{unit.student}/{unit.path.name}")
    text = text.replace(str(out) + os.sep, "").replace(str(out), ".")
    return _ADDRESS.sub("0x…", text)  # "<object at 0x7f3e...>" differs on every run


def make_row(student: str, lab: int, config: str, record: execute.RunRecord | None,
             outcomes: list[judge.Outcome], notes: list[str] = (), expected_total: int = 0,
             expected_points: float = 0) -> dict:
    """One row: the run's status and the judge's per-test outcomes folded into one of ROW_STATUSES.

    `points` are those of the tests passed on this configuration alone, `max_points` those of the
    tests that ran here; how configurations combine into a lab's points is the policy's (labkit/grading/policy.py).
    """
    tests = [{"test": o.test, "exercise": o.exercise, "file": o.file, "hidden": bool(o.hidden),
              "status": o.status, "message": o.message, "points": o.points} for o in outcomes]
    # A test worth no points whose exercise is not written (a stretch not tried) is left out, as make lab-N does.
    counted = [t for t in tests if t["status"] != "skipped" and not (t["status"] == "todo" and not t["points"])]
    passed = sum(t["status"] == "passed" for t in counted)
    row = {"student": student, "lab": lab, "config": config, "status": "ok", "passed": passed,
           "total": len(counted), "message": "", "tests": tests, "cell_errors": [], "notes": list(notes),
           "points": _number(sum(t["points"] for t in counted if t["status"] == "passed")),
           "max_points": _number(sum(t["points"] for t in counted))}
    if record is None:
        row.update(status="missing", total=expected_total, tests=[], points=0, max_points=_number(expected_points),
                   message=f"lab-{lab}.ipynb was not handed in")
        return row
    row["cell_errors"] = [dict(e) for e in record.cell_errors if e.get("type") != "NotImplementedError"]
    row["isolation"] = record.isolation  # "bubblewrap", or "limits-only" where no sandbox could be made
    row["start"] = record.start  # "warm" (forked by the warm server) or "cold" (a kernel of its own)
    row["judged_by"] = record.judged_by  # "verified" (the kit ran the programs itself) or "reported" (see verify)
    if record.status == "skipped":
        row.update(status="skipped", total=0, passed=0, points=0, max_points=0, message=record.message)
    elif record.status in ("timeout", "error"):
        row.update(status=record.status, passed=0, points=0,
                   message=record.message or f"the run ended with {record.status}")
    elif not counted:
        row.update(status="error", message="no test ran on this configuration")
    elif any(t["status"] in ("error", "timeout") for t in counted):
        bad = next(t for t in counted if t["status"] in ("error", "timeout"))
        row.update(status="timeout" if bad["status"] == "timeout" else "error", message=bad["message"])
    elif passed < len(counted):
        failing = [t for t in counted if t["status"] != "passed"]
        first = next((t for t in failing if not t["hidden"]), failing[0])
        what = "not implemented yet" if first["status"] == "todo" else first["message"]
        row.update(status="failed", message=f"{len(failing)} of {len(counted)} tests did not pass; "
                                            f"first: {first['test'].removeprefix('test_').replace('_', ' ')}: {what}")
    return row


def _number(x: float) -> float | int:
    """2.0 -> 2: points read as the integers they mostly are, in the csv and the json."""
    return int(x) if float(x).is_integer() else round(float(x), 4)


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
        return data.get("row") if data else None

    def record(self, unit: Unit, key: str) -> execute.RunRecord | None:
        data = self._read(self.root / "units" / f"{unit.where}.run.json", key)
        return execute.RunRecord.from_json(data["record"]) if data else None

    def save_row(self, unit: Unit, key: str, row: dict, seconds: float) -> None:
        write_atomic(self.root / "units" / f"{unit.where}.json",
                     json.dumps({"key": key, "seconds": seconds, "row": row}, indent=1))

    def save_record(self, unit: Unit, key: str, record: execute.RunRecord) -> None:
        write_atomic(self.root / "units" / f"{unit.where}.run.json",
                     json.dumps({"key": key, "record": record.to_json()}))

    def workdir(self, unit: Unit) -> Path:
        return self.root / "work" / unit.where


# ----------------------------------------------------------------------------------------
# Progress: a bar with an ETA on a terminal, plain lines otherwise.
# ----------------------------------------------------------------------------------------

class Progress:
    def __init__(self, total: int, title: str, stream=None, terminal: bool | None = None, out: Path | None = None):
        """`out`: the grading run's folder, where `progress.json` says how far it has got (`labkit.grading.progress`)."""
        self.total, self.done, self.start = total, 0, time.monotonic()
        self.title, self.out, self.began = title, out, time.time()
        self._record()
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.bar = None
        if self.terminal and total:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                           console=Console(file=self.stream), auto_refresh=False, transient=False)
            self.task = self.bar.add_task(title, total=total)
            self.bar.start()
        elif total:
            print(f"{title}: {total} to grade", file=self.stream, flush=True)

    def _record(self) -> None:
        if self.out is not None:
            progress_mod.record(self.out, phase=self.title, total=self.total, done=self.done, started=self.began)

    def advance(self, unit: Unit, row: dict) -> None:
        self.done += 1
        self._record()
        line = f"{unit.student} lab-{unit.lab} {unit.config}: {row['status']} {row['passed']}/{row['total']}"
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=line)
            self.bar.refresh()
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        width = len(str(self.total))
        print(f"[{self.done:>{width}}/{self.total}] {line}  (elapsed {elapsed:.0f} s, eta {eta:.0f} s)",
              file=self.stream, flush=True)

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ----------------------------------------------------------------------------------------
# The engine: run notebooks `jobs` at a time, judge finished runs in batches, keep everything.
# ----------------------------------------------------------------------------------------

class Grader:
    def __init__(self, out: Path, labs: list[catalog.Lab], chosen: list[DeviceConfig], *, jobs: int,
                 timeout: float, limits: Limits | None = None, stream=None, terminal: bool | None = None,
                 batch_seconds: float = 3.0, warm: bool = True, pods: tuple[Path, Path] | None = None):
        self.out = Path(out)
        # (RUNS, PLAN): the notebooks ran in pods of their own (labkit.grading.pods); each unit's output is read, not run
        self.pods = pods
        self.labs = {lab.number: lab for lab in labs}
        self.configs = {c.name: c for c in chosen}
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.limits = limits or DEFAULT_LIMITS
        self.stream = stream or sys.stderr
        self.terminal = terminal
        self.batch_seconds = batch_seconds
        self.stop: _StopRequest | None = None  # grade() sets one for its whole run; run() makes its own otherwise
        self._calls: dict[int, list[dict]] = {}
        self._kit = kit_digest()
        self._labs = {n: lab_digest(lab) for n, lab in self.labs.items()}
        self.graded = 0  # units graded (not taken from a previous run) in this process
        # Warm starts (labkit.run.warm): one server, started at the first run, forks every one-process CPU run's kernel.
        self.warm_wanted = warm and os.environ.get("LABKIT_WARM", "on") != "off"
        # JAX's compilation cache: filled by the reference solutions' runs, read-only for every student's (jaxcache).
        # Made at the first run, so that a grading run refused before any leaves OUT as it was.
        self.cache = None
        self._warm = None  # None: not tried yet; False: not to be had here; else the started server

    def warm_server(self):
        """The warm server of this grading run (started once, at the first need), or None: runs start cold."""
        if self._warm is None:
            self._warm = False
            wanted = [c for c in self.configs.values() if c.platform == "cpu" and c.processes == 1]
            if self.warm_wanted and wanted:
                base = {k: v for k, v in wanted[0].environment().items() if k != "JAX_NUM_CPU_DEVICES"}
                server = warm.Server([self.out / "work", self.out / "reference" / "work"], base, self.out / ".warm",
                                     shared=[self.cache.folder] if self.cache else [])
                if server.start(self.limits):
                    self._warm = server
                else:
                    print(f"warm starts: none here ({server.why}); every kernel starts cold", file=self.stream,
                          flush=True)
        return self._warm or None

    def close(self) -> None:
        """Stop the warm server, if one was started, and give the compilation cache its usual mode back."""
        if self._warm:
            self._warm.stop()
        self._warm = None
        jaxcache.release(self.cache)

    def calls(self, lab: int) -> list[dict]:
        if lab not in self._calls:
            self._calls[lab] = judge.collect_calls(self.labs[lab].test_dirs(hidden=True))
        return self._calls[lab]

    def key(self, unit: Unit) -> str:
        return _sha(json.dumps([FORMAT, self._kit, self._labs[unit.lab], config_digest(self.configs[unit.config]),
                                submission_digest(unit.path), float(self.timeout), self.limits.to_json()]
                               + (["pods", str(self.pods[0])] if self.pods else [])).encode())

    def _judge(self, store: Store, batch: list[tuple[Unit, str, execute.RunRecord, float]],
               expected: dict) -> list[tuple[Unit, str, dict, float]]:
        """One pytest session per lab for every finished run of that lab in `batch`."""
        rows = []
        by_lab: dict[int, list] = {}
        for item in batch:
            by_lab.setdefault(item[0].lab, []).append(item)
        for number, items in by_lab.items():
            lab = self.labs[number]
            specs = [judge.RunSpec(u.label, u.path, self.configs[u.config], store.workdir(u), record=rec)
                     for u, _, rec, _ in items]
            judgement = judge.judge(lab.test_dirs(hidden=True), specs, hidden_dirs=[lab.hidden_tests], jobs=1,
                                    timeout=self.timeout)
            by_run: dict[str, list[judge.Outcome]] = {}
            for o in judgement.outcomes:
                by_run.setdefault(o.run, []).append(o)
            for unit, key, record, seconds in items:
                outcomes = by_run.get(unit.label, [])
                for o in outcomes:
                    o.message = _clean(o.message, unit, store.root)
                record.message = _clean(record.message, unit, store.root)
                for e in record.cell_errors:
                    e["message"] = _clean(str(e.get("message", "")), unit, store.root)
                row = make_row(unit.student, unit.lab, unit.config, record, outcomes,
                               submission_notes(unit.path), *expected.get((unit.lab, unit.config), (0, 0)))
                if record.status == "ok":  # what its examined calls cost (labkit/cost.py), for the feedback
                    row["costs"] = cost.to_json(cost.cards(self.calls(number), {unit.config: record.results}))
                rows.append((unit, key, row, seconds))
        return rows

    def run(self, units: list[Unit], store: Store, title: str, expected: dict | None = None,
            fills_cache: bool = False) -> list[dict]:
        """Grade `units` (skipping those already graded with the same key); their rows, in the order given.

        `fills_cache`: these runs (the reference solutions') write JAX's compilation cache; others only read it.
        """
        expected = expected or {}
        rows: dict[Unit, dict] = {}
        todo: list[tuple[Unit, str]] = []
        unchanged = 0
        for unit in units:
            if unit.path is None:
                rows[unit] = make_row(unit.student, unit.lab, unit.config, None, [], [],
                                      *expected.get((unit.lab, unit.config), (0, 0)))
                if unit.refused:
                    rows[unit].update(status="error", message=f"refused: {unit.refused}")
                continue
            key = self.key(unit)
            cached = store.row(unit, key)
            if cached is not None:
                rows[unit] = cached
                unchanged += 1
            else:
                todo.append((unit, key))
        if unchanged:
            print(f"{title}: {unchanged} of {len(units)} unchanged since the last run, not graded again",
                  file=self.stream, flush=True)
        progress = Progress(len(todo), title, self.stream, self.terminal, out=self.out)
        queue: list[tuple[Unit, str, execute.RunRecord, float]] = []

        def finish(done_rows):
            for unit, key, row, seconds in done_rows:
                if key:
                    store.save_row(unit, key, row, seconds)
                rows[unit] = row
                self.graded += 1
                progress.advance(unit, row)

        def start(unit: Unit, key: str) -> tuple[execute.RunRecord, float]:
            began = time.monotonic()
            record = _run(unit)
            return record, round(time.monotonic() - began, 2)

        def _run(unit: Unit) -> execute.RunRecord:
            if unit.path.is_file() and unit.path.stat().st_size > MAX_BYTES:
                return execute.RunRecord(unit.config, "error", f"{unit.path} is {unit.path.stat().st_size / 1e6:.0f}"
                                         f" MB, more than the {MAX_BYTES / 1e6:.0f} MB a notebook may be",
                                         workdir=str(store.workdir(unit)))
            workdir = store.workdir(unit)
            if self.pods:
                runs, plan = self.pods
                return pods_mod.record_of(pods_mod.output_of(runs, plan, unit.student, unit.lab, unit.config),
                                          self.configs[unit.config], self.calls(unit.lab), workdir, self.timeout,
                                          self.limits)
            cache = None if self.cache is None else self.cache if fills_cache else self.cache.read_only()
            return execute.run_notebook(unit.path, self.configs[unit.config], self.calls(unit.lab), workdir,
                                        timeout=self.timeout, limits=self.limits, warm=self.warm_server(),
                                        cache=cache)

        for unit, _ in todo:
            self.calls(unit.lab)  # collect in this thread, before any run starts
        if todo and not self.pods:
            if self.cache is None and jaxcache.wanted():
                self.cache = jaxcache.prepare(self.out / ".jax-cache", unlisted=True)
            self.warm_server()
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="grade")
        running: dict[Future, tuple[Unit, str, float]] = {}
        stop = self.stop or _StopRequest()
        try:
            for unit, key in todo:
                record = store.record(unit, key)
                if record is not None:
                    queue.append((unit, key, record, record.seconds))  # ran before the last stop: judge only
                else:
                    running[pool.submit(start, unit, key)] = (unit, key, time.monotonic())
            last_judged = time.monotonic()
            while running or queue:
                stop.check()
                if running:
                    done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in done:
                        unit, key, began = running.pop(fut)
                        try:
                            record, seconds = fut.result()
                            store.save_record(unit, key, record)
                        except Exception as e:  # noqa: BLE001 - the kit's fault, not the student's: not kept
                            record = execute.RunRecord(unit.config, "error", f"the kit could not run this notebook "
                                                       f"({type(e).__name__}: {e}); grade again to retry")
                            key, seconds = "", round(time.monotonic() - began, 2)  # key "": graded again next time
                        queue.append((unit, key, record, seconds))
                stop.check()
                progress.tick()
                due = time.monotonic() - last_judged >= self.batch_seconds or len(queue) >= 4 * self.jobs
                if queue and (not running or due):
                    batch, queue = queue, []
                    finish(self._judge(store, batch, expected))
                    last_judged = time.monotonic()
        except BaseException:
            _stop_children()  # the runs still going would otherwise go on writing into OUT
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            if stop is not self.stop:
                stop.restore()
            progress.close()
        pool.shutdown(wait=True)
        return [rows[u] for u in units]


class _StopRequest:
    """Ctrl-C and SIGTERM stop a grading run between two steps, never inside the judge's pytest session.

    The handler only notes the request; the grading loop sees it within half a second, ends the
    notebooks still running and raises KeyboardInterrupt; outside the loop it is seen at the next
    step (after the scoreboard is written, never half-way through it). What was kept stays kept.
    Made once for the whole `grade()` call: a signal that comes between the loop's end and the
    command's exit is still a stop, not the interpreter's default death.
    """

    def __init__(self):
        self.requested = False
        self.previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[sig] = signal.signal(sig, self._note)
            except ValueError:  # not the main thread: leave signals alone
                break

    def _note(self, signum, frame):
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}


def _stop_children() -> None:
    """End the runs this process started (and their kernels), so that a stopped grading run leaves nothing behind."""
    try:
        children = psutil.Process().children(recursive=False)
    except psutil.Error:
        return
    for child in children:
        try:
            execute.kill_tree(child.pid)
        except (OSError, ValueError):
            continue


# ----------------------------------------------------------------------------------------
# The command.
# ----------------------------------------------------------------------------------------

def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def choose_labs(text: str | None) -> list[catalog.Lab]:
    if text:
        try:
            chosen = [catalog.lab(t.strip()) for t in str(text).split(",") if t.strip()]
        except catalog.UnknownLab as e:
            raise GradeError(str(e)) from None
    else:
        chosen = catalog.labs()
    chosen = [lab for lab in dict.fromkeys(chosen)]
    without = [lab.name for lab in chosen if not lab.reference.exists()]
    if without:
        raise GradeError(f"no reference solution for {', '.join(without)}: grading needs reference/lab-N.ipynb")
    if not chosen:
        raise GradeError("there are no labs to grade")
    return chosen


def choose_configs(text: str | None) -> list[DeviceConfig]:
    if text:
        try:
            return configs.parse(text)
        except configs.UnknownConfig as e:
            raise GradeError(str(e)) from None
    return configs.graded_by_default()


def check_reference(rows: list[dict], labs: dict[int, catalog.Lab]) -> None:
    """Every reference must pass every test on every configuration that ran; else say which test is broken."""
    broken = []
    for row in rows:
        if row["status"] in ("ok", "skipped"):
            continue
        lab = labs[row["lab"]]
        bad = [t for t in row["tests"] if t["status"] not in ("passed", "skipped")]
        if not bad or row["status"] in ("error", "timeout"):  # the run itself: one line, not one per test
            broken.append(f"{lab.reference.relative_to(lab.root)} on {row['config']}: {row['status']}: {row['message']}")
            continue
        for t in bad:
            where = "hidden" if t["hidden"] else "public"
            broken.append(f"{lab.reference.relative_to(lab.root)} on {row['config']}: {t['test']} "
                          f"({where}, {t['file']}) {t['status']}: {t['message']}")
    if broken:
        raise ReferenceBroken("the reference solution does not pass its own tests, so grading stops here:\n  "
                              + "\n  ".join(broken))


def check_isolation(limits: Limits, stream) -> None:
    """Before anything runs: the sandbox every run will get, or `sandbox.SandboxUnavailable` (fail closed).

    Only `--isolation limits-only`, asked for by name, grades without one; every row then says so.
    """
    if limits.isolation == sandbox.LIMITS_ONLY:
        print("isolation: resource limits only, asked for by name (--isolation limits-only): a notebook can read "
              "what this user can read and use the network; every row says limits-only", file=stream, flush=True)
        return
    if limits.isolation == sandbox.POD:
        sandbox.isolation(sandbox.POD)  # raises, with the reason, where this is no pod of the kit's design
        print("isolation: no bubblewrap, the pod is the sandbox, asked for by name (--isolation pod); every row "
              "says pod", file=stream, flush=True)
        return
    if limits.isolation != sandbox.SANDBOX:
        return
    found = sandbox.require_sandbox("nothing was graded")
    print(f"isolation: every notebook runs in a sandbox: {found.summary()}", file=stream, flush=True)
    for problem in found.problems:
        print(f"  not used: {problem.lines()[0]}", file=stream, flush=True)


def results_of(rows: list[dict], labs: list[catalog.Lab], chosen: list[DeviceConfig], subs: Submissions,
               students: list[str], *, ref_rows: list[dict] = (), grading: policy_mod.Policy | None = None,
               people: roster_mod.Roster | None = None) -> dict:
    """The plain data the scoreboard is drawn from (nothing in it depends on when or where it ran).

    Each lab carries its tests with their points and the configurations they ran on (from the
    reference), and the results carry the policy and the roster's columns, so that points and
    LMS exports are drawn from these results alone.
    """
    tests = policy_mod.lab_tests(list(ref_rows))
    labs_out = []
    for lab in labs:
        entry = {"number": lab.number, "name": lab.name, "title": lab.title}
        if ref_rows:
            mine = tests.get(lab.number, {})
            entry["tests"] = mine
            entry["reference_costs"] = {r["config"]: r["costs"] for r in ref_rows
                                        if r["lab"] == lab.number and r.get("costs")}
            entry["max_points"] = policy_mod.lab_points(grading or policy_mod.Policy(), mine, {})[1]
        if lab.leaderboard is not None:  # the class leaderboard the catalog gives it (labkit/grading/leaderboard.py)
            entry["leaderboard"] = lab.leaderboard.to_json()
        labs_out.append(entry)
    info = people.students if people else {}
    results = {
        "format": FORMAT,
        "labs": labs_out,
        "configs": [{"name": c.name, "summary": c.summary, "devices": c.devices} for c in chosen],
        "students": {s: {"notes": subs.notes.get(s, []), **info.get(s, {})} for s in students},
        "notes": list(subs.class_notes),
        "rows": rows,
    }
    if grading is not None:
        results["policy"] = grading.to_json()
    return results


def _with_roster(subs: Submissions, people: roster_mod.Roster) -> None:
    """Every roster student is in the class (a missing one with a note); a folder not on it is reported, not graded."""
    for student in list(subs.students):
        if student not in people.students:
            subs.class_notes.append(f"{student}: a submission folder not on the roster ({people.source}), "
                                    "not graded")
            del subs.students[student]
            subs.notes.pop(student, None)
    for student in people.students:
        if student not in subs.students:
            subs.students[student] = {}
            subs.notes[student] = ["no submission: nothing was handed in for this student"]


def grade(submissions: Path, out: Path, *, labs: str | None = None, config_names: str | None = None,
          jobs: int | None = None, timeout: float = execute.DEFAULT_TIMEOUT, shard: str | None = None,
          limits: Limits | None = None, stream=None, terminal: bool | None = None,
          roster: Path | None = None, policy: Path | None = None, overrides: Path | None = None,
          extensions: Path | None = None, start: str = "warm", runs_from: Path | None = None,
          plan: Path | None = None) -> dict:
    """Grade the class in `submissions` into `out`; the results (also written as the scoreboard)."""
    stream = stream or sys.stderr
    # Absolute from here on: the warm server's socket, the kernels' connection files and the sandbox's binds
    # are all named by path, and a relative one (`make grade`'s default OUT=scoreboard) means nothing there.
    submissions, out = Path(submissions).absolute(), Path(out).absolute()
    if not submissions.exists():
        raise GradeError(f"the submissions folder {submissions} does not exist "
                         "(expected <student_id>/lab-<N>.ipynb inside it, or an LMS download)")
    if timeout <= 0:
        raise GradeError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if jobs is not None and jobs < 1:
        raise GradeError(f"--jobs must be at least 1, got {jobs}")
    part = parse_shard(shard)
    chosen_labs, chosen = choose_labs(labs), choose_configs(config_names)
    grading, people, provisional = _policy_and_roster(policy, roster, [c.name for c in chosen])
    limits = limits or replace(DEFAULT_LIMITS, isolation=sandbox.SANDBOX)
    check_isolation(limits, stream)
    if (runs_from is None) != (plan is None):
        raise GradeError("--runs-from and --plan go together: the pods' outputs and the plan that made their inputs")
    pods = (Path(runs_from).absolute(), Path(plan).absolute()) if runs_from is not None else None
    grader = Grader(out, chosen_labs, chosen, jobs=jobs or default_jobs(), timeout=timeout, limits=limits,
                    stream=stream, terminal=terminal, warm=start != "cold", pods=pods)
    grader.stop = stop = _StopRequest()

    try:
        subs, times = _submissions(submissions, out, people, stream)  # an LMS download is checked before any run

        # The reference solutions first: they must pass everything, or nothing else is worth grading.
        ref_units = [Unit(REFERENCE, lab.number, c.name, lab.reference) for lab in chosen_labs for c in chosen]
        ref_rows = grader.run(ref_units, Store(out / "reference"), "reference solutions", fills_cache=True)
        check_reference(ref_rows, grader.labs)
        stop.check()
        expected = {(r["lab"], r["config"]): (r["total"], r["max_points"]) for r in ref_rows}

        if people is not None:
            _with_roster(subs, people)
        students = sorted(subs.students)
        if part:
            students = [s for s in students if shard_of(s, part[1]) == part[0]]
        units = [Unit(s, lab.number, c.name, subs.students[s].get(lab.number), subs.refused.get((s, lab.number), ""))
                 for s in students for lab in chosen_labs for c in chosen]
        changes, moved = _overrides_and_extensions(overrides, extensions, set(subs.students), ref_rows)
        handed = _keep_history(out, subs, students, chosen_labs, times, grading)
        rows = grader.run(units, Store(out), f"grading {len(students)} students", expected)
        for row in rows:
            row["digest"] = handed.get((row["student"], row["lab"]), {}).get("digest", "")
        results = results_of(rows, chosen_labs, chosen, subs, students, ref_rows=ref_rows, grading=grading,
                             people=people)
        for (student, lab), info in sorted(handed.items()):
            results["students"][student].setdefault("submissions", {})[str(lab)] = info
        if provisional:
            results["provisional"] = provisional
        mine = set(students)
        if changes:
            results["overrides"] = [o for o in changes if o["student"] in mine]
        if moved:
            results["extensions"] = {s: days for s, days in moved.items() if s in mine}
        scoreboard.write(results, out)
        stop.check()  # a stop asked for while the scoreboard was written: it is whole, and the run still ends as stopped
        return results
    finally:
        stop.restore()
        grader.close()  # the warm server, if one was started


def _submissions(submissions: Path, out: Path, people: roster_mod.Roster | None,
                 stream) -> tuple[Submissions, dict]:
    """The class's notebooks: the kit's folder layout, or an LMS download read into OUT/collected first.

    Also (student, lab) -> what the LMS says of the submission (time, late mark), where it says it.
    """
    known = [lab.number for lab in catalog.labs()]
    if not lms.is_download(submissions):
        return discover(submissions, known), {}
    into = out / "collected"
    if into.exists():
        shutil.rmtree(into)  # the last import's files: this download alone says what is handed in
    try:
        found = lms.collect(submissions, people, into, known)
    except lms.LmsError as e:
        raise GradeError(str(e)) from None
    into.mkdir(parents=True, exist_ok=True)
    for line in found.notes():
        print(f"{submissions.name}: {line}", file=stream, flush=True)
    subs = discover(into, known)
    subs.class_notes[:0] = found.notes()
    for (student, lab), entry in sorted(found.files.items()):
        if entry["late"] and student in subs.notes:
            subs.notes[student].append(f"lab-{lab}: {entry['source'].capitalize()} marked it late ({entry['member']})")
    return subs, {k: {"submitted_at": v["submitted_at"], "late": v["late"], "source": v["source"],
                      "file": v["member"], "times": v.get("times", {})} for k, v in found.files.items()}


def _keep_history(out: Path, subs: Submissions, students: list[str], labs: list[catalog.Lab], times: dict,
                  grading: policy_mod.Policy) -> dict[tuple[str, int], dict]:
    """Keep every notebook about to be graded in OUT/history by digest; (student, lab) -> what the results say.

    The results name the digest graded, the fingerprint of its code (labkit/grading/similarity.py), the LMS's submission time and late flag, and every time
    known for the submission by source (`times`: the LMS's, or a plain folder's git commit, file
    modification time or Gradescope metadata; when the kit collected it stays in OUT/history, so that
    grading the same class again writes the same results); the policy
    decides which of them a late penalty may count from (labkit/grading/deadlines.py).
    """
    handed = {}
    handouts = {lab.number: similarity.starter(similarity.read_cells(lab.student) or []) for lab in labs}
    for student in students:
        for lab in labs:
            path = subs.students[student].get(lab.number)
            if path is None:
                continue
            lms_info = times.get((student, lab.number), {})
            entry = history.keep(out, student, lab.number, path, submitted_at=lms_info.get("submitted_at"),
                                 source=lms_info.get("source", ""), file=lms_info.get("file", ""))
            if entry is None:
                continue
            known = dict(lms_info["times"]) if "times" in lms_info else history.folder_times(path)
            info = {"digest": entry["digest"], "submitted_at": lms_info.get("submitted_at"),
                    "late": bool(lms_info.get("late")), "times": known}
            code = similarity.fingerprint(path, handouts[lab.number])
            if code is not None:
                info["code"] = code  # what labkit/grading/similarity.py compares, the handout's own code left out
            handed[student, lab.number] = info
    return handed


def _overrides_and_extensions(overrides: Path | None, extensions: Path | None, students: set[str],
                              ref_rows: list[dict]) -> tuple[list[dict], dict]:
    """A TA's overrides and the extensions, checked against the class and the labs graded, before any student runs."""
    tests = {lab: set(names) for lab, names in policy_mod.lab_tests(ref_rows).items()}
    try:
        changes = overrides_mod.load(overrides, students, tests) if overrides else []
        moved = deadlines.load_extensions(extensions, students, set(tests)) if extensions else {}
    except (overrides_mod.OverrideError, deadlines.DeadlineError) as e:
        raise GradeError(str(e)) from None
    return changes, moved


def _policy_and_roster(policy_path: Path | None, roster_path: Path | None,
                       chosen: list[str]) -> tuple[policy_mod.Policy, roster_mod.Roster | None, str]:
    """The course's policy (refusing final grades without a required configuration) and the roster, if any."""
    try:
        grading = policy_mod.load(policy_path)
        provisional = policy_mod.check_required(grading, chosen)
        people = roster_mod.load(roster_path) if roster_path is not None else None
    except (policy_mod.PolicyError, roster_mod.RosterError) as e:
        raise GradeError(str(e)) from None
    return grading, people, provisional


# ----------------------------------------------------------------------------------------
# The student's own view: their last `make lab-N` runs, as results.
# ----------------------------------------------------------------------------------------

def student_results(build: Path, student: str = "you") -> dict:
    """Results (as the class scoreboard takes them) from build/lab-N/report.json of `make lab-N`."""
    build = Path(build)
    rows, labs, seen = [], [], {}
    for lab in catalog.labs():
        path = build / lab.name / "report.json"
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        labs.append(lab)
        outcomes = [judge.Outcome(**{k: o[k] for k in judge.Outcome.__dataclass_fields__ if k in o})
                    for o in report.get("outcomes", [])]
        for label, rec in report.get("runs", {}).items():
            record = execute.RunRecord.from_json(rec | {"results": {}})
            config = configs.by_name(record.config or label)
            seen.setdefault(label, config)
            mine = [o for o in outcomes if o.run == label]
            rows.append(make_row(student, lab.number, label, record, mine))
    order = list(configs.CONFIGS)
    rows.sort(key=lambda r: (r["lab"], order.index(r["config"]) if r["config"] in order else len(order)))
    names = sorted(seen, key=lambda n: order.index(n) if n in order else len(order))
    return {
        "format": FORMAT,
        "labs": [{"number": lab.number, "name": lab.name, "title": lab.title} for lab in labs],
        "configs": [{"name": n, "summary": seen[n].summary if seen[n] else "", "devices": seen[n].devices if seen[n]
                     else None} for n in names],
        "students": {student: {"notes": []}} if rows else {},
        "notes": [],
        "rows": rows,
        "policy": _course_policy().to_json(),
    }


def _course_policy() -> policy_mod.Policy:
    """The course's policy for a student's own scoreboard; the default where the file cannot be used."""
    try:
        return policy_mod.load()
    except policy_mod.PolicyError:
        return policy_mod.Policy()
