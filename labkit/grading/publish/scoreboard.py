"""The scoreboard: graded results drawn as csv, json, markdown, html and per-student feedback.

A lab the catalog gives a leaderboard (labkit/grading/classwide/leaderboard.py) has it drawn in each of them, its
students by id or, where the roster says `hide`, as "anonymous".

Everything here is a pure function of the results (the plain data `grade` produces, or
`ownresults.student_results` makes from a student's own `make lab-N` runs): the same results
always give the same files, byte for byte, which is what lets `merge` put the shards of a
class back together into exactly the scoreboard a single run would have written.

    scoreboard.csv     student,lab,config,passed,total,status,points,max_points,message,isolation: one row per unit
    scoreboard.json    the results themselves: every test's outcome and message (and `leaderboards`, below),
                       each test's failure rate per configuration and the submissions to look at together
    scoreboard.md      the class summary: pass rates, the multi-device bugs most often hit, the leaderboards
    scoreboard.html    one self-contained page: the score distribution per lab and configuration (labkit/grading/classwide/spread.py),
                       each test's failure rate per configuration (labkit/grading/classwide/failrates.py), the submissions whose
                       code is the same or nearly, to look at together (labkit/grading/classwide/similarity.py),
                       a student x lab heat map per configuration, points, the leaderboards, every test
    grades.csv         each student's points per lab and total, under the course's policy, with its rule
    class-anonymous.html  for a lecture: final points per lab and section (labkit/grading/classwide/stats.py), the score
                       distributions and failure rates, with no student's id, name or message
    feedback/<id>.md   for each student: public tests with their messages, hidden tests by name and outcome,
                       their place on a lab's leaderboard
    feedback/<id>.html the same as a self-contained page (labkit/grading/publish/templates/, autoescaped)
    feedback/<id>.zip  both, in one archive to hand back
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path

from rich.table import Table
from rich.text import Text

from labkit.grading.classwide import failrates, leaderboard, similarity
from labkit.grading.classwide.results import (
    STATUS_STYLE,
    configs_of,
    index_of,
    lab_title,
    labs_of,
    rates,
    students_of,
)
from labkit.grading.publish.markdown import feedback, to_markdown
from labkit.grading.publish.pages import anonymous_html, feedback_html, to_html
from labkit.grading.state import adjustments, policy
from labkit.grading.state.files import write_atomic

CSV_COLUMNS = (
    "student",
    "lab",
    "config",
    "passed",
    "total",
    "status",
    "points",
    "max_points",
    "message",
    "isolation",
)
GRADE_COLUMNS = (
    "student",
    "lab",
    "points",
    "max_points",
    "weight",
    "status",
    "late_days",
    "late_penalty",
    "time_source",
    "overridden",
    "adjustments",
    "rule",
)
DRAWN = (
    "leaderboards",
    "failure_rates",
    "similar",
)  # drawn into scoreboard.json from the results, again on a merge


class MergeError(ValueError):
    pass


# ----------------------------------------------------------------------------------------
# csv and json.
# ----------------------------------------------------------------------------------------


def _cell(value) -> str:
    """A csv field that a spreadsheet shows as text: never a formula, whatever a submission wrote."""
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _message(row: dict) -> str:
    return " | ".join(part for part in [row["message"], *row.get("notes", [])] if part)


def to_csv(results: dict) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in results.get("rows", []):
        writer.writerow(
            [
                _cell(r["student"]),
                r["lab"],
                r["config"],
                r["passed"],
                r["total"],
                r["status"],
                r.get("points", ""),
                r.get("max_points", ""),
                _cell(_message(r)),
                r.get("isolation", ""),
            ]
        )
    return buf.getvalue()


def grades_csv(results: dict) -> str:
    """One row per student and lab with the lab's points under the policy, then a `total` row per student."""
    g = policy.grades(results)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(GRADE_COLUMNS)
    for student, mine in g["students"].items():
        for number, lab in mine["labs"].items():
            writer.writerow(
                [
                    _cell(student),
                    number,
                    lab["points"],
                    lab["max_points"],
                    lab["weight"],
                    lab["status"],
                    lab.get("late_days", ""),
                    lab.get("late_penalty", ""),
                    lab.get("time_source", ""),
                    _cell(lab.get("overridden", "")),
                    _cell("; ".join(adjustments.words(a) for a in lab.get("adjustments", []))),
                    g["rule"],
                ]
            )
        writer.writerow(
            [
                _cell(student),
                "total",
                mine["points"],
                mine["max_points"],
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                g["rule"],
            ]
        )
    return buf.getvalue()


def to_json(results: dict) -> str:
    """The results, with what is drawn from them: the leaderboards (under `leaderboards`) where a lab has one,
    each test's failure rate per configuration (`failure_rates`), and the submissions to look at together
    (`similar`) where there are any."""
    drawn = {
        "leaderboards": leaderboard.boards(results),
        "failure_rates": failrates.rates(results),
        "similar": similarity.pairs(results),
    }
    shown = {k: v for k, v in results.items() if k not in DRAWN} | {k: v for k, v in drawn.items() if v}
    return json.dumps(shown, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------------------
# Writing, merging, and the terminal.
# ----------------------------------------------------------------------------------------


def write(results: dict, out: Path) -> None:
    """Every file of the scoreboard, each written atomically."""
    out = Path(out)
    write_atomic(out / "scoreboard.csv", to_csv(results))
    write_atomic(out / "grades.csv", grades_csv(results))
    write_atomic(out / "scoreboard.json", to_json(results))
    write_atomic(out / "scoreboard.md", to_markdown(results))
    write_atomic(out / "scoreboard.html", to_html(results))
    write_atomic(out / "class-anonymous.html", anonymous_html(results))
    stems = {student.replace("/", "_"): student for student in students_of(results)}
    for stem, student in stems.items():
        md, page = feedback(results, student), feedback_html(results, student)
        write_atomic(out / "feedback" / f"{stem}.md", md)
        write_atomic(out / "feedback" / f"{stem}.html", page)
        write_atomic(out / "feedback" / f"{stem}.zip", _archive(stem, md, page))
    for old in (out / "feedback").glob("*"):
        if old.suffix in (".md", ".html", ".zip") and old.stem not in stems:
            old.unlink()  # a student of an earlier run in this folder, no longer in these results


def _archive(stem: str, md: str, page: str) -> bytes:
    """One student's feedback, ready to hand back: the same files give the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in ((f"{stem}/feedback.md", md), (f"{stem}/feedback.html", page)):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)
    return buf.getvalue()


def read(folder: Path) -> dict:
    path = Path(folder) / "scoreboard.json"
    try:
        return json.loads(path.read_text())
    except OSError:
        raise MergeError(f"{path} does not exist: is {folder} the --out folder of a grading run?") from None
    except ValueError as e:
        raise MergeError(f"{path} is not valid JSON ({e})") from None


def terminal(results: dict) -> Table:
    """The scoreboard on a terminal: for one student, lab by configuration; for a class, the pass rates."""
    configs, labs = configs_of(results), labs_of(results)
    students = students_of(results)
    if len(students) == 1:
        index = index_of(results)
        table = Table(title=f"{students[0]}: every lab on every configuration", title_justify="left")
        table.add_column("lab")
        for c in configs:
            table.add_column(c["name"], justify="center")
        for lab in labs:
            cells = []
            for c in configs:
                row = index.get((students[0], lab["number"], c["name"]))
                if row is None:
                    cells.append(Text("–", style="dim"))
                elif row["status"] in ("ok", "failed"):
                    cells.append(Text(f"{row['passed']}/{row['total']}", style=STATUS_STYLE[row["status"]]))
                else:
                    cells.append(Text(row["status"], style=STATUS_STYLE.get(row["status"], "")))
            table.add_row(lab_title(lab), *cells)
        return table
    table = Table(
        title=f"{len(students)} students: who passes every test, by lab and configuration",
        title_justify="left",
    )
    table.add_column("lab")
    for c in configs:
        table.add_column(c["name"], justify="center")
    by = {(r["lab"]["number"], r["config"]["name"]): r for r in rates(results)}
    for lab in labs:
        cells = []
        for c in configs:
            r = by[(lab["number"], c["name"])]
            cells.append(f"{r['ok']}/{r['students']}" if r["graded"] else "skipped")
        table.add_row(lab_title(lab), *cells)
    return table
