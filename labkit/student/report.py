"""What a student sees after `make lab-N`: one table, test by configuration, then what went wrong; and after
`make scoreboard`, their own results across labs, with what was run.

For `make lab-N` it only renders: it reads outcomes and run records and prints (the same outcomes feed the
class scoreboard). For `make scoreboard` it reads the reports `make lab-N` wrote and draws them with the class
scoreboard's code, saying what was run.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.course import catalog, configs
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


RUN = "\0"  # where a configuration's name was, in a message said once for several


def without_run(message: str, run: str) -> str:
    """`message` with the configuration's name left out (as `RUN`), so that one reason given on cpu-1 and on
    cpu-8 ("..., not on cpu-1") is one note; `with_runs` puts the names back."""
    return re.sub(rf"(?<![\w-]){re.escape(run)}(?![\w-])", RUN, message)


def with_runs(message: str, runs: list[str]) -> str:
    return message.replace(RUN, " and ".join(runs))


def _reason(o: Outcome) -> str:
    return without_run(o.message or "skipped here", o.run)


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
    found: OrderedDict[tuple[str, str], dict[str, Outcome]] = OrderedDict()
    for o in outcomes:
        found.setdefault((o.exercise, o.test), {})[o.run] = o
    # each exercise's tests together, exercises in the order first met (a file may test one again further on)
    exercises_met = list(dict.fromkeys(e for e, _ in found))
    rows = OrderedDict(sorted(found.items(), key=lambda item: exercises_met.index(item[0][0])))
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
        + with_runs(reason, where[reason])
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
        todo = sum(o.status == "todo" for o in counted)
        notes = (
            [f"{todo} not written yet"] * bool(todo)
            + [f"{skipped} skipped"] * bool(skipped)
            + [f"{optional} optional not tried yet"] * bool(optional)
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


# ----------------------------------------------------------------------------------------------------------
# `make scoreboard`: a student's own results across labs, from their `make lab-N` runs, saying what was run.
#
# The page and its tables are the class scoreboard's, drawn for a class of one (labkit/grading/); around them
# this says what a grading would do that these runs did not: which configurations ran and which were skipped
# (and why), that only the public tests ran (grading adds hidden ones), which compile-only TPU configurations
# (v5e-8, ...) are included, and which configuration's result comes from an earlier run. Points are counted
# over the configurations that ran, and called what they are: not a grade.
# ----------------------------------------------------------------------------------------------------------

HIDDEN_NOT_RUN = "public tests only (the hidden tests grading adds were not run)"
NOT_A_GRADE = f"not a grade: your own `make lab-N` runs, {HIDDEN_NOT_RUN}"


@dataclass
class Ran:
    """What one lab's runs were: configurations that ran, those skipped (with why), those carried over from an
    earlier run (with when), and whether any hidden test ran."""

    ran: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    earlier: dict[str, str] = field(default_factory=dict)
    hidden: bool = False


def reports(build: Path) -> dict[int, dict]:
    """Each lab's report.json of `make lab-N` (lab number -> the report), with the runs it keeps from earlier
    (`earlier`: configurations the last run left out) among its runs and outcomes, marked `earlier`."""
    out: dict[int, dict] = {}
    for lab in catalog.labs():
        try:
            data = json.loads((Path(build) / lab.name / "report.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
            continue
        runs, outcomes, when = dict(data["runs"]), list(data.get("outcomes") or []), {}
        earlier = data["earlier"] if isinstance(data.get("earlier"), dict) else {}
        for label, e in earlier.items():
            if label in runs or not isinstance(e, dict) or not isinstance(e.get("run"), dict):
                continue
            runs[label] = e["run"]
            outcomes += [o for o in e.get("outcomes") or [] if isinstance(o, dict)]
            when[label] = str(e.get("ran") or "an earlier run")
        out[lab.number] = data | {"runs": runs, "outcomes": outcomes, "earlier": when}
    return out


def what_ran(results: dict, found: dict[int, dict]) -> dict[int, Ran]:
    """For each lab, what its runs were: from the results' rows, and which of them are from an earlier run
    from the reports (`reports`)."""
    out: dict[int, Ran] = {}
    for row in results.get("rows", []):
        ran = out.setdefault(row["lab"], Ran())
        if row.get("status") == "skipped":
            ran.skipped[row["config"]] = str(row.get("message") or "skipped")
        else:
            ran.ran.append(row["config"])
        ran.hidden = ran.hidden or any(t.get("hidden") for t in row.get("tests", []))
    for number, data in found.items():
        if number in out:
            out[number].earlier.update({c: w for c, w in data["earlier"].items() if c in out[number].ran})
    return out


def student_results(found: dict[int, dict]) -> dict:
    """The class scoreboard's results for a class of one, from `reports` (earlier runs included)."""
    import tempfile

    from labkit.grading.running import ownresults

    with tempfile.TemporaryDirectory(prefix="labkit-scoreboard-") as folder:
        for number, data in found.items():
            (Path(folder) / catalog.lab(number).name).mkdir()
            (Path(folder) / catalog.lab(number).name / "report.json").write_text(json.dumps(data))
        return ownresults.student_results(Path(folder))


def _order(names) -> list[str]:
    known = list(configs.CONFIGS)
    return sorted(set(names), key=lambda n: (known.index(n) if n in known else len(known), n))


def _compile_only(name: str) -> bool:
    config = configs.by_name(name)
    return bool(config and config.compile_for)


def for_the_page(results: dict) -> dict:
    """The results as the class scoreboard's page draws them, less what a grading would claim: the points
    counted over the configurations that ran (one skipped wherever it was asked for is no configuration
    graded), and marked as no grade, with what was skipped and that no hidden test ran."""
    rows = results.get("rows", [])
    ran = {r["config"] for r in rows if r.get("status") != "skipped"}
    skipped = {r["config"]: r.get("message") or "skipped" for r in rows if r["config"] not in ran}
    hidden = any(t.get("hidden") for r in rows for t in r.get("tests", []))
    note = NOT_A_GRADE if not hidden else NOT_A_GRADE.replace(HIDDEN_NOT_RUN, "public and hidden tests")
    if skipped:
        note += "; " + "; ".join(f"{c} skipped ({why})" for c, why in skipped.items())
    return results | {
        "configs": [c for c in results.get("configs", []) if c["name"] in ran],
        "provisional": note,
    }


def scoreboard_lines(results: dict, ran: dict[int, Ran], points: tuple[float, float] | None) -> list[str]:
    """What the table does not say: what ran, what was skipped and why, what is from an earlier run, which
    tests ran, and the points (over what ran, not a grade)."""
    ran_anywhere = _order(c for r in ran.values() for c in r.ran)
    out = [f"Ran: {', '.join(ran_anywhere) or 'nothing'}."]
    for reason, n in skip_numbers(ran).items():
        where = [
            f"{c} (lab {lab})" for lab, r in ran.items() for c, why in r.skipped.items() if why == reason
        ]
        out.append(f"skipped{str(n).translate(SUPERSCRIPTS)} {', '.join(where)}: {reason}")
    if any(r.hidden for r in ran.values()):
        out.append("Tests: public and hidden (a run with --hidden).")
    else:
        out.append("Tests: public only. Grading adds hidden tests, which these runs did not run.")
    tpu = [c for c in ran_anywhere if _compile_only(c)]
    if tpu:
        out.append(
            f"Compile-only TPU results included: {', '.join(tpu)} (the TPU compiler's program, never run)."
        )
    else:
        out.append(
            "No compile-only TPU configuration ran (v5e-8, ...): `make lab-N CONFIGS=cpu-8,v5e-8` runs one "
            "(after `make setup EXTRAS=tpu`, where libtpu is not installed)."
        )
    for lab, r in ran.items():
        for c, when in r.earlier.items():
            out.append(f"* lab {lab} on {c}: from an earlier run ({when}), not your last `make lab-{lab}`.")
    if points is not None:
        got, most = points
        out.append(f"Points: {got:g}/{most:g} over the configurations that ran; {NOT_A_GRADE}.")
    return out


def skip_numbers(ran: dict[int, Ran]) -> dict[str, int]:
    """Each distinct reason a configuration was skipped, numbered from 1."""
    numbers: dict[str, int] = {}
    for r in ran.values():
        for why in r.skipped.values():
            numbers.setdefault(why, len(numbers) + 1)
    return numbers


def scoreboard_table(results: dict, ran: dict[int, Ran]) -> Table:
    """Lab by configuration: tests passed of those run, `skipped` with the number of its reason, `–` not run."""
    numbers = skip_numbers(ran)
    names = _order(c for r in ran.values() for c in [*r.ran, *r.skipped])
    rows = {(r["lab"], r["config"]): r for r in results.get("rows", [])}
    out = Table(title="you: your last run of each lab on each configuration", title_justify="left")
    out.add_column("lab", no_wrap=True)
    for name in names:
        out.add_column(name, justify="center")
    for lab in results.get("labs", []):
        mine = ran.get(lab["number"], Ran())
        cells = []
        for name in names:
            row = rows.get((lab["number"], name))
            if name in mine.skipped:
                mark = "skipped" + str(numbers[mine.skipped[name]]).translate(SUPERSCRIPTS)
                cells.append(Text(mark, style="dim"))
            elif row is None:
                cells.append(Text("–", style="dim"))
            elif row["status"] in ("ok", "failed"):
                style = "green" if row["passed"] == row["total"] else "red"
                cells.append(
                    Text(f"{row['passed']}/{row['total']}" + ("*" * (name in mine.earlier)), style=style)
                )
            else:
                cells.append(Text(row["status"], style="red"))
        out.add_row(lab["title"], *cells)
    return out


def write_page(results: dict, out: Path, student: str = "you") -> Path:
    """The student's own results page: their feedback as a grading would write it (the class page's tables
    for a class of one, never the TA's similarity list or class statistics), as you.md and you.html."""
    from labkit.grading.publish import markdown, pages

    out.mkdir(parents=True, exist_ok=True)
    for stale in ("scoreboard.html", "scoreboard.md", "scoreboard.json", "scoreboard.csv"):
        (out / stale).unlink(missing_ok=True)  # the class page an older kit wrote here
    (out / "you.md").write_text(markdown.feedback(results, student))
    page = out / "you.html"
    page.write_text(pages.feedback_html(results, student))
    return page


def show_scoreboard(build: Path, out: Path | None = None, console: Console | None = None) -> Path | None:
    """`make scoreboard`: the table, what was run, the points over it, and the page written; None where
    no lab has results yet."""
    from labkit.grading.state import policy

    found = reports(Path(build))
    results = student_results(found)
    if not results["rows"]:
        return None
    ran = what_ran(results, found)
    page_results = for_the_page(results)
    student = next(iter(results.get("students") or {}), "you")  # "you", as ownresults names the student
    mine = policy.grades(page_results)["students"].get(student)
    page = write_page(page_results, Path(out) if out else Path(build) / "scoreboard", student)
    console = console or Console()
    console.print(scoreboard_table(results, ran))
    for line in scoreboard_lines(results, ran, (mine["points"], mine["max_points"]) if mine else None):
        console.print(Text(line), soft_wrap=True)
    console.print(f"details: {page}", soft_wrap=True)
    return page
