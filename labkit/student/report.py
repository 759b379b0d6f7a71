"""What a student sees after `make lab-N`: one table, test by configuration, then what went wrong.

Rendering only: it reads outcomes and run records and prints. The same outcomes feed
the class scoreboard.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path

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
# A skip's mark carries the number of its reason, told under the table: skip¹, skip².
SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _label(test: str) -> str:
    return test.removeprefix("test_").replace("_", " ")


def _reason(o: Outcome) -> str:
    """A skip's reason with its configuration's name left out (as `RUN`), so that one reason given on cpu-1
    and on cpu-8 ("..., not on cpu-1") is one note."""
    return re.sub(rf"(?<![\w-]){re.escape(o.run)}(?![\w-])", RUN, o.message or "skipped here")


RUN = "\0"


def skip_reasons(outcomes: list[Outcome]) -> dict[str, int]:
    """Each distinct reason a test was skipped, numbered from 1 in the order met."""
    reasons: dict[str, int] = {}
    for o in outcomes:
        if o.status == "skipped":
            reasons.setdefault(_reason(o), len(reasons) + 1)
    return reasons


def _mark(o: Outcome | None, reasons: dict[str, int]) -> Text:
    if o is None:
        return Text("")
    mark, style = MARKS.get(o.status, ("?", ""))
    if o.status == "skipped":
        mark += str(reasons[_reason(o)]).translate(SUPERSCRIPTS)
    return Text(mark, style=style)


def lab_table(title: str, runs: list[str], outcomes: list[Outcome], width: int | None = None) -> Table:
    """Test by configuration, every test's name whole on one row: the exercise in a column of its own where
    the line is wide enough (`width`, the terminal's); else the marks first and the name after them, under
    its exercise's name, so that only a name longer than the whole line is wrapped (between words)."""
    rows: OrderedDict[tuple[str, str], dict[str, Outcome]] = OrderedDict()
    for o in outcomes:
        rows.setdefault((o.exercise, o.test), {})[o.run] = o
    reasons = skip_reasons(outcomes)
    marks = {
        run: max([len(run)] + [len(_mark(by.get(run), reasons)) for by in rows.values()]) for run in runs
    }
    names = max([len("test")] + [len(_label(t)) for _, t in rows])
    exercises = max([len("exercise")] + [len(e) for e, _ in rows])
    # every column has a space either side and a rule after it, and the table a rule on its left
    wide = 1 + (exercises + 3) + (names + 3) + sum(w + 3 for w in marks.values())
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    if width is None or wide <= width:
        table.add_column("exercise", no_wrap=True)
        table.add_column("test", no_wrap=True)
        for run in runs:
            table.add_column(run, justify="center", no_wrap=True)
        previous = None
        for (exercise, test), by_run in rows.items():
            cells = [_mark(by_run.get(run), reasons) for run in runs]
            table.add_row(exercise if exercise != previous else "", _label(test), *cells)
            previous = exercise
        return table
    for run in runs:
        table.add_column(run, justify="center", no_wrap=True, min_width=marks[run])
    table.add_column("exercise: test", overflow="fold")
    previous = None
    for (exercise, test), by_run in rows.items():
        if exercise != previous:
            table.add_row(*[""] * len(runs), Text(exercise, style="bold"))
            previous = exercise
        table.add_row(*[_mark(by_run.get(run), reasons) for run in runs], "  " + _label(test))
    return table


def skip_notes(outcomes: list[Outcome]) -> list[str]:
    """Under the table, each skip's reason by its number, with the configurations it was skipped on."""
    reasons = skip_reasons(outcomes)
    where: dict[str, list[str]] = {}
    for o in outcomes:
        if o.status == "skipped":
            runs = where.setdefault(_reason(o), [])
            if o.run not in runs:
                runs.append(o.run)
    return [
        f"skip{str(n).translate(SUPERSCRIPTS)} [{', '.join(where[reason])}]: "
        + reason.replace(RUN, " and ".join(where[reason]))
        for reason, n in reasons.items()
    ]


def problems(outcomes: list[Outcome], records: dict[str, RunRecord] | None = None) -> list[str]:
    """One line per distinct problem: the test, the configurations where it happened, the message. A run
    that failed as a whole (its kernel died, it ran out of time) is said once, above, not for each test."""
    said = {
        run: r.message
        for run, r in (records or {}).items()
        if r is not None and r.status in ("error", "timeout")
    }
    grouped: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()
    for o in outcomes:
        if o.status in ("passed", "skipped") or (o.run in said and o.message.endswith(said[o.run])):
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


# A cell's error is shown whole up to this many characters; a longer one is cut at the end of a sentence (or
# of a clause), marked "…", with where the whole message is.
SHOWN = 600


def whole_or_cut(message: str, where: str, limit: int = SHOWN) -> str:
    """`message` whole; or, longer than `limit`, up to its last sentence end before it, "…" and `where`."""
    if len(message) <= limit:
        return message
    head = message[:limit]
    end = max(head.rfind(". "), head.rfind("; "), head.rfind(": "))
    if end < limit // 3:
        end = head.rfind(" ")
    return f"{head[: end + 1].rstrip()} … (the whole message: {where})"


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
        record = records.get(where[0])
        executed = Path(record.workdir) / "executed.ipynb" if record and record.workdir else None
        told = whole_or_cut(
            message, f"cell {cell} of {executed}" if executed else f"cell {cell}, run it in Jupyter"
        )
        lines.append(f"cell {cell}{shown} raised {kind}: {told} [{', '.join(where)}]")
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
    console.print(lab_table(title, runs, outcomes, console.width))
    for line in skip_notes(outcomes):
        console.print(Text(line, style="dim"), soft_wrap=True)
    for run in runs:
        record = records.get(run)
        if record is not None and record.status in ("error", "timeout"):
            console.print(Text(f"{run}: {record.message}", style="red"), soft_wrap=True)
    for line in cell_problems(runs, records):
        console.print(Text(line, style="yellow"), soft_wrap=True)
    lines = problems(outcomes, records)
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


def why_no_card(calls: list, results: dict[str, dict]) -> str:
    """One line saying why no cost card was shown ("" where there is nothing to say): where every examined
    exercise still raises NotImplementedError on every run, that it is not written yet (nothing failed);
    otherwise the cost model's own reason."""
    from labkit import cost

    examined = [c for c in calls if c.get("facts")]
    got = [((by_id or {}).get(c["id"]) or {}) for by_id in results.values() for c in examined]
    if got and all((r.get("error") or {}).get("type") == "NotImplementedError" for r in got):
        names = list(dict.fromkeys(c["function"] for c in examined))
        which = ", ".join(f"`{n}`" for n in names)
        return (
            f"No cost card yet: {which} {'is' if len(names) == 1 else 'are'} not written yet (still raising "
            "NotImplementedError): nothing failed. Each exercise's card shows here once it returns a result."
        )
    return cost.why_none(calls, results)
