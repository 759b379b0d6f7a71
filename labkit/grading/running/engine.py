"""The grading engine: notebooks run `jobs` at a time, finished runs judged in batches (one pytest
session per lab for many students at once), every unit kept the moment it is graded, and a stop
request (Ctrl-C, SIGTERM) that ends the children and keeps what finished.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from labkit import cost, envnames
from labkit.course import catalog
from labkit.course.configs import DeviceConfig
from labkit.grading.intake.collect import MAX_BYTES, Unit
from labkit.grading.running import pods as pods_mod
from labkit.grading.running.progress import Progress
from labkit.grading.running.rows import clean_message, make_row, submission_notes, unjudged_row
from labkit.grading.running.store import (
    Store,
    config_digest,
    kit_digest,
    lab_digest,
    submission_digest,
    unit_key,
)
from labkit.judge import judge, timeline
from labkit.run import execute, jaxcache, processes, warm
from labkit.run.allowance import DEFAULT_LIMITS, Limits
from labkit.statuses import Run

# ----------------------------------------------------------------------------------------
# The engine: run notebooks `jobs` at a time, judge finished runs in batches, keep everything.
# ----------------------------------------------------------------------------------------


@dataclass
class _RunState:
    """What one `Grader.run` holds while it goes: the rows so far, the runs going, those ended and waiting
    to be judged, and the units waiting for a twin's run (same notebook, lab, configuration and limits)."""

    store: Store
    expected: dict
    rows: dict[Unit, dict]
    progress: Progress
    queue: list[tuple[Unit, str, execute.RunRecord, float]] = field(default_factory=list)
    running: dict[Future, tuple[Unit, str, float]] = field(default_factory=dict)
    twins: dict[str, list[Unit]] = field(default_factory=dict)


class Grader:
    def __init__(
        self,
        out: Path,
        labs: list[catalog.Lab],
        chosen: list[DeviceConfig],
        *,
        jobs: int,
        timeout: float,
        limits: Limits | None = None,
        stream=None,
        terminal: bool | None = None,
        batch_seconds: float = 3.0,
        warm: bool = True,
        pods: tuple[Path, Path] | None = None,
    ):
        self.out = Path(out)
        # (RUNS, PLAN): the notebooks ran in pods of their own (labkit.grading.running.pods); each unit's output is read, not run
        self.pods = pods
        self.labs = {lab.number: lab for lab in labs}
        self.configs = {c.name: c for c in chosen}
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.limits = limits or DEFAULT_LIMITS
        self.stream = stream or sys.stderr
        self.terminal = terminal
        self.batch_seconds = batch_seconds
        self.stop: StopRequest | None = (
            None  # grade() sets one for its whole run; run() makes its own otherwise
        )
        self._calls: dict[int, list[dict]] = {}
        self._kit = kit_digest()
        self._labs = {n: lab_digest(lab) for n, lab in self.labs.items()}
        self.graded = 0  # units graded (not taken from a previous run) in this process
        self.again = lambda unit, row: (
            False
        )  # (unit, its kept row) -> grade it again all the same (--students, --retry)
        # Warm starts (labkit.run.warm): one server, started at the first run, forks every one-process CPU run's kernel.
        self.warm_wanted = warm and os.environ.get(envnames.WARM, "on") != "off"
        # JAX's compilation cache: filled by the reference solutions' runs, read-only for every student's (jaxcache).
        # Made at the first run, so that a grading run refused before any leaves OUT as it was.
        self.cache = None
        self._warm = None  # None: not tried yet; False: not to be had here; else the started server

    def warm_server(self):
        """The warm server of this grading run (started once, at the first need), or None: runs start cold."""
        if self._warm is None:
            self._warm = False
            base = warm.environment_for(self.configs.values())
            if self.warm_wanted and base is not None:
                server = warm.Server(
                    [self.out / "work", self.out / "reference" / "work"],
                    base,
                    self.out / ".warm",
                    shared=[self.cache.folder] if self.cache else [],
                    labs=list(self.labs.values()),
                )
                if server.start(self.limits):
                    self._warm = server
                else:
                    print(
                        f"warm starts: none here ({server.why}); every kernel starts cold",
                        file=self.stream,
                        flush=True,
                    )
        return self._warm or None

    def close(self) -> None:
        """Stop the warm server, if one was started, and give the compilation cache its usual mode back."""
        if self._warm:
            self._warm.stop()
        self._warm = None
        jaxcache.release(self.cache)

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def calls(self, lab: int) -> list[dict]:
        if lab not in self._calls:
            self._calls[lab] = judge.collect_calls(self.labs[lab].test_dirs(hidden=True))
        return self._calls[lab]

    def key(self, unit: Unit) -> str:
        return unit_key(
            [
                self._kit,
                self._labs[unit.lab],
                config_digest(self.configs[unit.config]),
                submission_digest(unit.path),
                float(self.timeout),
                self.limits.to_json(),
            ]
            + (["pods", str(self.pods[0])] if self.pods else [])
        )

    def _judge(
        self, store: Store, batch: list[tuple[Unit, str, execute.RunRecord, float]], expected: dict
    ) -> list[tuple[Unit, str, dict, float]]:
        """One pytest session per lab for every finished run of that lab in `batch`; each unit's row.

        One unit's bad data is that unit's error: a session that raises is tried again unit by unit, and
        whatever raises while one unit is judged or its row is made becomes that unit's `error` row, with
        the reason and key "" (not kept: graded again next time), never the end of the class's grading."""
        rows = []
        by_lab: dict[int, list] = {}
        for item in batch:
            by_lab.setdefault(item[0].lab, []).append(item)
        for number, items in by_lab.items():
            try:
                rows += self._judge_lab(store, number, items, expected)
            except Exception as e:  # noqa: BLE001 - found out unit by unit below
                if len(items) == 1:
                    rows.append(self._unjudged(items[0], e, expected))
                    continue
                for item in items:
                    try:
                        rows += self._judge_lab(store, number, [item], expected)
                    except Exception as e:  # noqa: BLE001 - this unit's, and this unit's alone
                        rows.append(self._unjudged(item, e, expected))
        return rows

    def _judge_lab(self, store: Store, number: int, items: list, expected: dict) -> list:
        lab = self.labs[number]
        specs = [
            judge.RunSpec(u.label, u.path, self.configs[u.config], store.workdir(u), record=rec)
            for u, _, rec, _ in items
        ]
        judgement = judge.judge(
            lab.test_dirs(hidden=True), specs, hidden_dirs=[lab.hidden_tests], jobs=1, timeout=self.timeout
        )
        by_run: dict[str, list[judge.Outcome]] = {}
        for o in judgement.outcomes:
            by_run.setdefault(o.run, []).append(o)
        rows = []
        for item in items:
            unit, key, record, seconds = item
            try:
                outcomes = by_run.get(unit.label, [])
                for o in outcomes:
                    o.message = clean_message(o.message, unit, store.root)
                record.message = clean_message(record.message, unit, store.root)
                for e in record.cell_errors:
                    e["message"] = clean_message(str(e.get("message", "")), unit, store.root)
                row = make_row(
                    unit.student,
                    unit.lab,
                    unit.config,
                    record,
                    outcomes,
                    submission_notes(unit.path),
                    *expected.get((unit.lab, unit.config), (0, 0)),
                )
                if record.status == "ok":  # what its examined calls cost (labkit/cost.py), for the feedback
                    found = cost.cards(self.calls(number), {unit.config: record.results})
                    row["costs"] = cost.to_json(found)
                    # and their schedules, drawn in the feedback (labkit/judge/timeline.py)
                    if pictured := timeline.gather(found, {unit.config: record.results}):
                        row["timelines"] = pictured
            except Exception as e:  # noqa: BLE001 - this unit's, and this unit's alone
                rows.append(self._unjudged(item, e, expected))
                continue
            rows.append((unit, key, row, seconds))
        return rows

    def _unjudged(self, item: tuple, e: Exception, expected: dict) -> tuple[Unit, str, dict, float]:
        """The `error` row of a unit the kit could not judge, naming why; key "": not kept, judged again next run."""
        unit, _, record, seconds = item
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        why = clean_message(f"{type(e).__name__}: {first}"[:300], unit, self.out)
        row = unjudged_row(
            unit.student, unit.lab, unit.config, why, *expected.get((unit.lab, unit.config), (0, 0))
        )
        row.update(isolation=getattr(record, "isolation", ""), judged_by=getattr(record, "judged_by", ""))
        return unit, "", row, seconds

    def run(
        self,
        units: list[Unit],
        store: Store,
        title: str,
        expected: dict | None = None,
        fills_cache: bool = False,
    ) -> list[dict]:
        """Grade `units` (skipping those already graded with the same key); their rows, in the order given.

        `fills_cache`: these runs (the reference solutions') write JAX's compilation cache; others only read it.
        """
        expected = expected or {}
        rows, todo, again = self._sorted(units, store, expected, title)
        state = _RunState(
            store, expected, rows, Progress(len(todo), title, self.stream, self.terminal, out=self.out)
        )
        self._prepare(todo)
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="grade")
        stop = self.stop or StopRequest()
        try:
            self._submit(pool, todo, again, state, fills_cache)
            self._drain(state, stop)
        except BaseException:
            _stop_children()  # the runs still going would otherwise go on writing into OUT
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            if stop is not self.stop:
                stop.restore()
            state.progress.close()
        pool.shutdown(wait=True)
        return [rows[u] for u in units]

    # -- the steps of a run ------------------------------------------------------------------

    def _sorted(
        self, units: list[Unit], store: Store, expected: dict, title: str
    ) -> tuple[dict[Unit, dict], list[tuple[Unit, str]], set[Unit]]:
        """The rows of the units that need no run (no notebook, or graded before under the same key), the
        units to grade with their keys, and those of them whose kept row (and run) is not to be used again."""
        rows: dict[Unit, dict] = {}
        todo: list[tuple[Unit, str]] = []
        unchanged, again = 0, set()
        for unit in units:
            if unit.path is None:
                rows[unit] = make_row(
                    unit.student,
                    unit.lab,
                    unit.config,
                    None,
                    [],
                    [],
                    *expected.get((unit.lab, unit.config), (0, 0)),
                )
                if unit.refused:
                    rows[unit].update(status="error", message=f"refused: {unit.refused}")
                continue
            key = self.key(unit)
            cached = store.row(unit, key)
            if cached is not None and not self.again(unit, cached):
                rows[unit] = cached
                unchanged += 1
            else:
                todo.append((unit, key))
                if cached is not None:
                    again.add(unit)  # its kept run too is not used again
        if unchanged:
            print(
                f"{title}: {unchanged} of {len(units)} unchanged since the last run, not graded again",
                file=self.stream,
                flush=True,
            )
        return rows, todo, again

    def _prepare(self, todo: list[tuple[Unit, str]]) -> None:
        """Before any run starts: each lab's calls collected (in this thread), the compilation cache and the
        warm server made where runs will use them."""
        for unit, _ in todo:
            self.calls(unit.lab)
        if todo and not self.pods:
            if self.cache is None and jaxcache.wanted():
                self.cache = jaxcache.prepare(self.out / ".jax-cache", unlisted=True)
            self.warm_server()

    def _submit(
        self,
        pool: ThreadPoolExecutor,
        todo: list[tuple[Unit, str]],
        again: set[Unit],
        state: _RunState,
        fills_cache: bool,
    ) -> None:
        """Start each unit's run, or queue for judging the run a stopped grading left, or wait for a twin's."""
        for unit, key in todo:
            record = state.store.record(unit, key) if unit not in again else None
            if record is not None:
                state.queue.append(
                    (unit, key, record, record.seconds)
                )  # ran before the last stop: judge only
            elif key in state.twins and not self.pods:  # a pod's output is its student's own: never shared
                state.twins[key].append(unit)
            else:
                state.twins[key] = []
                future = pool.submit(self._timed_run, unit, state.store, fills_cache)
                state.running[future] = (unit, key, time.monotonic())

    def _drain(self, state: _RunState, stop: StopRequest) -> None:
        """Until every run has ended and been judged: collect ended runs, judge them in batches."""
        last_judged = time.monotonic()
        while state.running or state.queue:
            stop.check()
            if state.running:
                done, _ = wait(list(state.running), timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    self._ended(future, state)
            stop.check()
            state.progress.tick()
            due = time.monotonic() - last_judged >= self.batch_seconds or len(state.queue) >= 4 * self.jobs
            if state.queue and (not state.running or due):
                batch, state.queue = state.queue, []
                self._keep(state, self._judge(state.store, batch, state.expected))
                last_judged = time.monotonic()

    def _ended(self, future: Future, state: _RunState) -> None:
        """A run has ended: its record kept and queued for judging, with a copy for each of its twins."""
        unit, key, began = state.running.pop(future)
        waiting = state.twins.pop(key, [])
        try:
            record, seconds = future.result()
            state.store.save_record(unit, key, record)
        except Exception as e:  # noqa: BLE001 - the kit's fault, not the student's: not kept
            record = execute.RunRecord(
                unit.config,
                Run.ERROR,
                f"the kit could not run this notebook ({type(e).__name__}: {e}); grade again to retry",
            )
            key, seconds = "", round(time.monotonic() - began, 2)  # key "": graded again next time
        state.queue.append((unit, key, record, seconds))
        for twin in waiting:
            copy = _shared_run(record, unit, twin, state.store)
            if key:
                state.store.save_record(twin, key, copy)
            state.queue.append((twin, key, copy, seconds))

    def _keep(self, state: _RunState, judged: list[tuple[Unit, str, dict, float]]) -> None:
        """Judged rows: each kept (unless its key is "") and shown in the progress."""
        for unit, key, row, seconds in judged:
            if key:
                state.store.save_row(unit, key, row, seconds)
            state.rows[unit] = row
            self.graded += 1
            state.progress.advance(unit, row)

    def _timed_run(self, unit: Unit, store: Store, fills_cache: bool) -> tuple[execute.RunRecord, float]:
        began = time.monotonic()
        record = self._run_unit(unit, store, fills_cache)
        return record, round(time.monotonic() - began, 2)

    def _run_unit(self, unit: Unit, store: Store, fills_cache: bool) -> execute.RunRecord:
        """One unit's run (in a worker thread): its notebook in a sandbox, or its pod's output read."""
        if unit.path.is_file() and unit.path.stat().st_size > MAX_BYTES:
            return execute.RunRecord(
                unit.config,
                "error",
                f"{unit.path} is {unit.path.stat().st_size / 1e6:.0f}"
                f" MB, more than the {MAX_BYTES / 1e6:.0f} MB a notebook may be",
                workdir=str(store.workdir(unit)),
            )
        workdir = store.workdir(unit)
        if self.pods:
            runs, plan = self.pods
            output = pods_mod.output_of(runs, plan, unit.student, unit.lab, unit.config, kit=unit.kit)
            return pods_mod.record_of(
                output,
                self.configs[unit.config],
                self.calls(unit.lab),
                workdir,
                self.timeout,
                self.limits,
            )
        cache = None if self.cache is None else self.cache if fills_cache else self.cache.read_only()
        return execute.run_notebook(
            unit.path,
            self.configs[unit.config],
            self.calls(unit.lab),
            workdir,
            timeout=self.timeout,
            limits=self.limits,
            warm=self.warm_server(),
            cache=cache,
        )


def _shared_run(record: execute.RunRecord, first: Unit, twin: Unit, store: Store) -> execute.RunRecord:
    """`first`'s run as `twin`'s (the same notebook's bytes, lab, configuration and limits): a copy of its record
    in which every mention of first's files (its notebook, its work folder) names twin's, so that nothing in
    twin's row or feedback names another student."""
    pairs = [(str(store.workdir(first)), str(store.workdir(twin)))]
    if first.path is not None and twin.path is not None:
        pairs.append((str(first.path), str(twin.path)))

    def swap(value):
        if isinstance(value, str):
            for theirs, mine in pairs:
                value = value.replace(theirs, mine)
            return value
        if isinstance(value, list):
            return [swap(v) for v in value]
        if isinstance(value, dict):
            return {swap(k): swap(v) for k, v in value.items()}
        return value

    return execute.RunRecord.from_json(swap(record.to_json()))


class StopRequest:
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
            processes.kill_tree(child.pid)
        except (OSError, ValueError):
            continue


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
