"""What a student sees after `make lab-N`: one table, test by configuration, then what went wrong.

Rendering only: it reads outcomes and run records and prints. The same outcomes feed
the class scoreboard.
"""

from __future__ import annotations

from collections import OrderedDict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.judge.judge import Outcome
from labkit.run.execute import RunRecord

MARKS = {
    "passed": ("✓", "green"),
    "failed": ("✗", "red"),
    "todo": ("todo", "yellow"),
    "error": ("error", "red"),
    "timeout": ("timeout", "red"),
    "skipped": ("skip", "dim"),
}


def _label(test: str) -> str:
    return test.removeprefix("test_").replace("_", " ")


def lab_table(title: str, runs: list[str], outcomes: list[Outcome]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    table.add_column("exercise")
    table.add_column("test")
    for run in runs:
        table.add_column(run, justify="center")
    rows: OrderedDict[tuple[str, str], dict[str, Outcome]] = OrderedDict()
    for o in outcomes:
        rows.setdefault((o.exercise, o.test), {})[o.run] = o
    previous = None
    for (exercise, test), by_run in rows.items():
        cells = []
        for run in runs:
            o = by_run.get(run)
            mark, style = MARKS.get(o.status, ("?", "")) if o else ("", "")
            cells.append(Text(mark, style=style))
        table.add_row(exercise if exercise != previous else "", _label(test), *cells)
        previous = exercise
    return table


def problems(outcomes: list[Outcome]) -> list[str]:
    """One line per distinct problem: the test, the configurations where it happened, the message."""
    grouped: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()
    for o in outcomes:
        if o.status in ("passed", "skipped"):
            continue
        grouped.setdefault((o.exercise, o.test, o.message), []).append(o.run)
    lines = []
    seen_todo = set()
    for (exercise, test, message), runs in grouped.items():
        if message == "not implemented yet":
            if exercise in seen_todo:
                continue
            seen_todo.add(exercise)
            lines.append(f"{exercise}: not implemented yet")
            continue
        lines.append(f"{_label(test)} [{', '.join(runs)}]: {message}")
    return lines


def cell_problems(runs: list[str], records: dict[str, RunRecord]) -> list[str]:
    """Errors the notebook's own cells raised, once each with the runs they happened on.

    A cell that only calls an exercise that is not written yet is expected to raise
    NotImplementedError; that is already reported as "not implemented yet".
    """
    seen: OrderedDict[tuple, list[str]] = OrderedDict()
    for run in runs:
        record = records.get(run)
        for err in record.cell_errors if record else []:
            if err.get("type") == "NotImplementedError":
                continue
            seen.setdefault((err["cell"], err.get("code", ""), err["type"], err["message"]), []).append(run)
    lines = []
    for (cell, code, kind, message), where in seen.items():
        shown = f" (`{code}`)" if code else ""
        lines.append(f"cell {cell}{shown} raised {kind}: {message} [{', '.join(where)}]")
    return lines


def summary(runs: list[str], outcomes: list[Outcome], records: dict[str, RunRecord]) -> tuple[str, bool]:
    """The closing line, and whether everything that ran passed."""
    parts, all_ok, ran_any = [], True, False
    for run in runs:
        record = records.get(run)
        mine = [o for o in outcomes if o.run == run]
        if record is not None and record.status == "skipped":
            parts.append(f"{run} skipped ({record.message})")
            continue
        ran_any = True
        if record is not None and record.status in ("error", "timeout"):
            parts.append(f"{run} {record.status}")
            all_ok = False
            continue
        # A test the lab declares meaningless on this configuration is skipped, not failed.
        skipped = sum(o.status == "skipped" for o in mine)
        # A test worth no points whose exercise is not written yet (a stretch exercise) is left for later.
        optional = sum(o.status == "todo" and not o.points for o in mine)
        counted = [o for o in mine if o.status != "skipped" and not (o.status == "todo" and not o.points)]
        passed = sum(o.status == "passed" for o in counted)
        if passed != len(counted) or not counted:
            all_ok = False
        notes = [f"{skipped} skipped"] * bool(skipped) + [f"{optional} optional not tried yet"] * bool(
            optional
        )
        parts.append(f"{passed}/{len(counted)} on {run}" + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(parts), all_ok and ran_any


def print_lab(
    console: Console, title: str, runs: list[str], outcomes: list[Outcome], records: dict[str, RunRecord]
) -> bool:
    console.print(lab_table(title, runs, outcomes))
    for run in runs:
        record = records.get(run)
        if record is not None and record.status in ("error", "timeout"):
            console.print(Text(f"{run}: {record.message}", style="red"), soft_wrap=True)
    for line in cell_problems(runs, records):
        console.print(Text(line, style="yellow"), soft_wrap=True)
    lines = problems(outcomes)
    if lines:
        console.print()
        for line in lines:
            console.print(Text(f"  • {line}"), soft_wrap=True)
    line, ok = summary(runs, outcomes, records)
    console.print()
    if runs and all(records.get(r) is not None and records[r].status == "skipped" for r in runs):
        # nothing could run here (no GPU, no TPU): said with the reason, neither a pass nor an error
        console.print(Text("SKIP  " + line, style="bold yellow"), soft_wrap=True)
        return True
    console.print(
        Text(("PASS  " if ok else "FAIL  ") + line, style="bold green" if ok else "bold red"), soft_wrap=True
    )
    return ok
