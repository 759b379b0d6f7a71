"""How far a grading run has got, from the files it writes: one run, or the shards of one on any engine.

Every grading run writes `OUT/progress.json` as it goes (`record`). A class graded in shards (Slurm's
array tasks, Kubernetes pods, `--shard i/N` by hand) has one such file per shard folder,
`OUT/shards/<i>/progress.json`; `read` sums them, and `python -m labkit progress OUT` prints the sum,
once or every few seconds (`--watch`), whichever engine runs the shards.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.grading.state.files import write_atomic

FILE = "progress.json"


def record(out: Path, *, phase: str, total: int, done: int, started: float) -> None:
    """Write what a grading run has done so far (called after each graded unit)."""
    write_atomic(
        Path(out) / FILE,
        json.dumps(
            {"phase": phase, "total": total, "done": done, "started": started, "updated": time.time()}
        ),
    )


@dataclass
class Part:
    name: str
    phase: str = (
        "waiting"  # "waiting" (nothing written yet), "reference solutions", "grading N students", ...
    )
    total: int = 0
    done: int = 0
    started: float = 0.0
    finished: bool = False  # the run wrote its scoreboard
    exit: int | None = (
        None  # the exit status an engine recorded for it (see labkit.grading.slurm), when there is one
    )


def _read_part(folder: Path, name: str) -> Part:
    part = Part(name)
    try:
        data = json.loads((folder / FILE).read_text())
        part.phase, part.total, part.done = str(data["phase"]), int(data["total"]), int(data["done"])
        part.started = float(data["started"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    part.finished = (folder / "scoreboard.json").is_file()
    return part


def _jobs(out: Path) -> dict:
    """What the last Slurm submission into OUT recorded (labkit/grading/slurm.py), or {}."""
    try:
        data = json.loads((out / "slurm" / "jobs.json").read_text())
        return {"shards": int(data["shards"]), "submitted": float(data.get("submitted", 0))}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _slurm_part(out: Path, i: int) -> Part:
    """Shard i of the last Slurm submission: finished only when its task said so (its exit file, which every
    submission clears), so that a scoreboard an earlier submission left is not taken for this one's."""
    part = _read_part(out / "shards" / str(i), str(i))
    try:
        part.exit = int((out / "slurm" / f"shard-{i}.exit").read_text().strip())
    except (OSError, ValueError):
        part.exit = None
    part.finished = part.exit == 0 and part.finished
    return part


def parts(out: Path) -> list[Part]:
    """Each shard's progress under OUT/shards/, or OUT's own when it was graded in one run: whichever ran last."""
    out = Path(out)
    shards = out / "shards"
    local = _read_part(out, out.name)
    if not shards.is_dir():
        return [local]
    jobs = _jobs(out)
    if jobs:
        found = [_slurm_part(out, i) for i in range(1, jobs["shards"] + 1) if (shards / str(i)).is_dir()]
        began = jobs["submitted"]
    else:
        folders = sorted((p for p in shards.iterdir() if p.is_dir()), key=lambda p: (len(p.name), p.name))
        found = [_read_part(p, p.name) for p in folders]
        began = max((p.started for p in found), default=0.0)
    if local.started and local.started > began:
        return [local]  # a run of the whole class into OUT, after the shards': theirs are stale
    return found


def summary(found: list[Part], now: float | None = None) -> str:
    """One line: shards done, units graded (of those known so far), and an estimate of the time left."""
    now = time.time() if now is None else now
    finished = sum(p.finished for p in found)
    grading = [p for p in found if p.phase.startswith("grading")]
    done, total = sum(p.done for p in grading), sum(p.total for p in grading)
    line = f"shards finished {finished}/{len(found)}, units graded {done}/{total}"
    waiting = [p for p in found if not p.finished and not p.phase.startswith("grading")]
    if waiting:
        line += f" ({len(waiting)} not grading students yet: {', '.join(p.phase for p in waiting)})"
    running = [p for p in grading if not p.finished and p.done and p.started]
    if running:
        # the slowest shard decides: its own rate over what it has left
        left = max((now - p.started) / p.done * (p.total - p.done) for p in running)
        line += f", about {left:.0f} s left"
    failed = [p.name for p in found if p.exit not in (None, 0)]
    if failed:
        line += f"; failed: shard {', '.join(failed)}"
    return line


def watch(out: Path, every: float, stream, until=None) -> None:
    """Print `summary` every `every` seconds until every shard has finished (or `until()` says stop)."""
    while True:
        found = parts(out)
        print(summary(found), file=stream, flush=True)
        if all(p.finished for p in found) or (until is not None and until()):
            return
        time.sleep(every)


class Progress:
    """A grading run's progress as it goes: a bar with an ETA on a terminal, plain lines otherwise."""

    def __init__(
        self, total: int, title: str, stream=None, terminal: bool | None = None, out: Path | None = None
    ):
        """`out`: the grading run's folder, where `progress.json` says how far it has got (`record`)."""
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

            self.bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                auto_refresh=False,
                transient=False,
            )
            self.task = self.bar.add_task(title, total=total)
            self.bar.start()
        elif total:
            print(f"{title}: {total} to grade", file=self.stream, flush=True)

    def _record(self) -> None:
        if self.out is not None:
            record(self.out, phase=self.title, total=self.total, done=self.done, started=self.began)

    def advance(self, unit, row: dict) -> None:
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
        print(
            f"[{self.done:>{width}}/{self.total}] {line}  (elapsed {elapsed:.0f} s, eta {eta:.0f} s)",
            file=self.stream,
            flush=True,
        )

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
