"""The scoreboard: graded results drawn as csv, json, markdown, html and per-student feedback.

A lab the catalog gives a leaderboard (labkit/grading/leaderboard.py) has it drawn in each of them, its
students by id or, where the roster says `hide`, as "anonymous".

Everything here is a pure function of the results (the plain data `grade` produces, or
`grade.student_results` makes from a student's own `make lab-N` runs): the same results
always give the same files, byte for byte, which is what lets `merge` put the shards of a
class back together into exactly the scoreboard a single run would have written.

    scoreboard.csv     student,lab,config,passed,total,status,points,max_points,message,isolation: one row per unit
    scoreboard.json    the results themselves: every test's outcome and message (and `leaderboards`, below),
                       each test's failure rate per configuration and the submissions to look at together
    scoreboard.md      the class summary: pass rates, the multi-device bugs most often hit, the leaderboards
    scoreboard.html    one self-contained page: the score distribution per lab and configuration (labkit/grading/spread.py),
                       each test's failure rate per configuration (labkit/grading/failrates.py), the submissions whose
                       code is the same or nearly, to look at together (labkit/grading/similarity.py),
                       a student x lab heat map per configuration, points, the leaderboards, every test
    grades.csv         each student's points per lab and total, under the course's policy, with its rule
    feedback/<id>.md   for each student: public tests with their messages, hidden tests by name and outcome,
                       their place on a lab's leaderboard
    feedback/<id>.html the same as a self-contained page (labkit/grading/templates/, autoescaped)
    feedback/<id>.zip  both, in one archive to hand back
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path

from rich.table import Table
from rich.text import Text

from labkit import cost
from labkit.grading import deadlines, failrates, leaderboard, policy, similarity, spread
from labkit.grading.files import write_atomic

CSV_COLUMNS = ("student", "lab", "config", "passed", "total", "status", "points", "max_points", "message",
               "isolation")
GRADE_COLUMNS = ("student", "lab", "points", "max_points", "weight", "status", "late_days", "late_penalty",
                 "time_source", "overridden", "rule")
MARK = {"passed": "✓", "failed": "✗", "todo": "todo", "error": "error", "timeout": "timeout", "skipped": "skip"}
DRAWN = ("leaderboards", "failure_rates", "similar")  # drawn into scoreboard.json from the results, again on a merge
STATUS_STYLE = {"ok": "green", "failed": "red", "error": "red", "timeout": "red", "missing": "dim",
                "skipped": "dim"}


class MergeError(ValueError):
    pass


# ----------------------------------------------------------------------------------------
# Reading the results.
# ----------------------------------------------------------------------------------------

def _labs(results: dict) -> list[dict]:
    return results.get("labs", [])


def _configs(results: dict) -> list[dict]:
    return results.get("configs", [])


def _students(results: dict) -> list[str]:
    return sorted(results.get("students", {}))


def _index(results: dict) -> dict[tuple, dict]:
    return {(r["student"], r["lab"], r["config"]): r for r in results.get("rows", [])}


def _label(test: str) -> str:
    return test.removeprefix("test_").replace("_", " ")


def _lab_title(lab: dict) -> str:
    title = lab.get("title") or lab["name"]
    if title.lower().replace("-", " ").startswith(lab["name"].replace("-", " ")):
        return title  # "Lab 3 · shard_map basics" already says which lab
    return f"{lab['name']} · {title}"


def _multi(config: dict) -> bool:
    return config.get("devices") != 1


def rates(results: dict) -> list[dict]:
    """Per lab and configuration: students ok, tests passed, and how many rows had each status."""
    out = []
    rows = results.get("rows", [])
    for lab in _labs(results):
        for config in _configs(results):
            mine = [r for r in rows if r["lab"] == lab["number"] and r["config"] == config["name"]]
            graded = [r for r in mine if r["status"] != "skipped"]
            out.append({
                "lab": lab, "config": config, "students": len(mine),
                "ok": sum(r["status"] == "ok" for r in mine),
                "graded": len(graded),
                "passed": sum(r["passed"] for r in graded),
                "total": sum(r["total"] for r in graded),
                "statuses": Counter(r["status"] for r in mine),
            })
    return out


def multi_device_bugs(results: dict, top: int = 10) -> list[dict]:
    """Tests failed on a multi-device configuration by students who pass them on one device, most hit first.

    When the run had no one-device configuration, every failure on several devices counts.
    """
    configs = {c["name"]: c for c in _configs(results)}
    singles = [n for n, c in configs.items() if not _multi(c)]
    index = _index(results)
    hits: OrderedDict[tuple, dict] = OrderedDict()
    for row in results.get("rows", []):
        config = configs.get(row["config"])
        if config is None or not _multi(config):
            continue
        for t in row["tests"]:
            if t["status"] not in ("failed", "error"):
                continue
            if singles:
                alone = [index.get((row["student"], row["lab"], s)) for s in singles]
                if not any(a and any(u["test"] == t["test"] and u["status"] == "passed" for u in a["tests"])
                           for a in alone):
                    continue
            entry = hits.setdefault((row["lab"], t["test"], row["config"]),
                                    {"lab": row["lab"], "test": t["test"], "config": row["config"],
                                     "hidden": t["hidden"], "students": set(), "messages": Counter()})
            entry["students"].add(row["student"])
            entry["messages"][t["message"]] += 1
    found = sorted(hits.values(), key=lambda e: (-len(e["students"]), e["lab"], e["test"], e["config"]))
    return [e | {"students": sorted(e["students"]),
                 "message": min(e["messages"].items(), key=lambda kv: (-kv[1], kv[0]))[0]}
            for e in found[:top]]


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
        writer.writerow([_cell(r["student"]), r["lab"], r["config"], r["passed"], r["total"], r["status"],
                         r.get("points", ""), r.get("max_points", ""), _cell(_message(r)), r.get("isolation", "")])
    return buf.getvalue()


def grades_csv(results: dict) -> str:
    """One row per student and lab with the lab's points under the policy, then a `total` row per student."""
    g = policy.grades(results)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(GRADE_COLUMNS)
    for student, mine in g["students"].items():
        for number, lab in mine["labs"].items():
            writer.writerow([_cell(student), number, lab["points"], lab["max_points"], lab["weight"], lab["status"],
                             lab.get("late_days", ""), lab.get("late_penalty", ""), lab.get("time_source", ""),
                             _cell(lab.get("overridden", "")), g["rule"]])
        writer.writerow([_cell(student), "total", mine["points"], mine["max_points"], "", "", "", "", "", "",
                         g["rule"]])
    return buf.getvalue()


def to_json(results: dict) -> str:
    """The results, with what is drawn from them: the leaderboards (under `leaderboards`) where a lab has one,
    each test's failure rate per configuration (`failure_rates`), and the submissions to look at together
    (`similar`) where there are any."""
    drawn = {"leaderboards": leaderboard.boards(results), "failure_rates": failrates.rates(results),
             "similar": similarity.pairs(results)}
    shown = {k: v for k, v in results.items() if k not in DRAWN} | {k: v for k, v in drawn.items() if v}
    return json.dumps(shown, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------------------
# markdown: the class summary, and each student's feedback.
# ----------------------------------------------------------------------------------------

def _md(text) -> str:
    """Text from a submission, safe inside a markdown table cell."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("`", "\\`").replace("\r", " ").replace("\n", " "))


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "–"


def to_markdown(results: dict) -> str:
    students, labs, configs = _students(results), _labs(results), _configs(results)
    lines = ["# Scoreboard", "",
             (f"{len(students)} student{'s' if len(students) != 1 else ''}; labs "
              f"{', '.join(str(lab['number']) for lab in labs) or 'none'}; configurations "
              f"{', '.join(c['name'] for c in configs) or 'none'}."), "",
             "## Pass rate by lab and configuration", "",
             "A student passes a lab on a configuration when every public and hidden test passes there.", "",
             "| lab | " + " | ".join(c["name"] for c in configs) + " |",
             "| --- |" + " --- |" * len(configs)]
    by = {(r["lab"]["number"], r["config"]["name"]): r for r in rates(results)}
    for lab in labs:
        cells = []
        for c in configs:
            r = by[(lab["number"], c["name"])]
            if not r["graded"]:
                cells.append("skipped")
                continue
            cells.append(f"{r['ok']}/{r['students']} students ({_pct(r['ok'], r['students'])}); "
                         f"tests {_pct(r['passed'], r['total'])}")
        lines.append(f"| {_md(_lab_title(lab))} | " + " | ".join(cells) + " |")
    lines += _points_markdown(results)
    lines += _leaderboards_markdown(results)
    lines += ["", "## Statuses", "", "| lab | configuration | ok | failed | error | timeout | missing | skipped |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rates(results):
        s = r["statuses"]
        lines.append(f"| {r['lab']['number']} | {r['config']['name']} | "
                     + " | ".join(str(s.get(k, 0)) for k in ("ok", "failed", "error", "timeout", "missing", "skipped"))
                     + " |")
    bugs = multi_device_bugs(results)
    lines += ["", "## Multi-device bugs most often hit", ""]
    if bugs:
        lines += ["Tests failed on several devices by students whose code passes them on one device.", "",
                  "| lab | test | configuration | students | most common message |", "| ---: | --- | --- | ---: | --- |"]
        for b in bugs:
            hidden = " (hidden)" if b["hidden"] else ""
            lines.append(f"| {b['lab']} | {_md(_label(b['test']))}{hidden} | {b['config']} | {len(b['students'])} | "
                         f"{_md(b['message'])} |")
    else:
        lines.append("None: no test passed on one device and failed on several.")
    weak = [r for r in results.get("rows", []) if r.get("isolation") == "limits-only"]
    if weak:
        lines += ["", "## Isolation", "",
                  f"**{len(weak)} of {len(results.get('rows', []))} runs had resource limits only, no sandbox** "
                  "(bubblewrap could not run): those notebooks could read what the grading user can read and "
                  "reach the network. See docs/sandbox.md, 'Isolation and limits'."]
    noted = [(s, n) for s in students for n in results["students"][s].get("notes", [])]
    if noted or results.get("notes"):
        lines += ["", "## Notes on the submissions", ""]
        lines += [f"- {_md(n)}" for n in results.get("notes", [])]
        lines += [f"- {_md(s)}: {_md(n)}" for s, n in noted]
    return "\n".join(lines) + "\n"


def _points_cell(p: dict) -> str:
    """A lab's points as shown: `missing`, or points/max, with a late penalty and a TA's override marked."""
    text = "missing" if p["status"] == "missing" and "overridden" not in p else f"{p['points']}/{p['max_points']}"
    if p.get("late_days"):
        source = deadlines.SOURCES.get(p.get("time_source", ""), "an unknown source")
        text += f" (late {p['late_days']}d, -{round(100 * p['late_penalty'])}%, by {source})"
    if p.get("overridden"):
        text += f" (overridden: {p['overridden']})"
    return text


def _points_markdown(results: dict) -> list[str]:
    g = policy.grades(results)
    labs = _labs(results)
    lines = ["", "## Points", "", f"Rule: {_md(g['rule'])}.", "",
             "| student | " + " | ".join(_md(lab["name"]) for lab in labs) + " | total |",
             "| --- |" + " ---: |" * (len(labs) + 1)]
    for student, mine in g["students"].items():
        cells = []
        for lab in labs:
            cells.append(_md(_points_cell(mine["labs"][str(lab["number"])])))
        lines.append(f"| {_md(student)} | " + " | ".join(cells) + f" | {mine['points']}/{mine['max_points']} |")
    return lines


def _board_markdown(board: dict) -> list[str]:
    """One leaderboard as a table: rank, who (an id, or anonymous), the modelled step time."""
    ref = f"The reference: {board['reference']['time']}. " if board["reference"] else ""
    lines = [f"{ref}Students whose code passes every test on {board['config']}, fastest first.", ""]
    if not board["places"]:
        return lines + ["No student is ranked yet."]
    lines += ["| rank | student | step time |", "| ---: | --- | ---: |"]
    lines += [f"| {p['rank']} | {_md(p['name'])} | {p['time']} |" for p in board["places"]]
    return lines


def _leaderboards_markdown(results: dict) -> list[str]:
    lines = []
    for board in leaderboard.boards(results):
        lines += ["", f"## Leaderboard: {board['name']} · {board['title']}", "", *_board_markdown(board)]
    return lines


def feedback(results: dict, student: str) -> str:
    """What one student is told: public tests with their messages, hidden tests by name and outcome only."""
    index = _index(results)
    points = policy.grades(results)
    mine = points["students"].get(student)
    lines = [f"# Feedback: {_md(student)}", ""]
    for note in results.get("students", {}).get(student, {}).get("notes", []):
        lines.append(f"- {_md(note)}")
    if lines[-1] != "":
        lines.append("")
    if mine:
        lines += [f"Points: {mine['points']}/{mine['max_points']} ({_md(points['rule'])}).", ""]
    for lab in _labs(results):
        lines += [f"## {_md(_lab_title(lab))}", ""]
        if mine:
            p = mine["labs"][str(lab["number"])]
            lines += [f"Points: {p['points']}/{p['max_points']}", ""]
            if p.get("late_note"):
                lines += [f"Late policy: {_md(p['late_note'])}", ""]
        board, mine = leaderboard.board(results, lab), leaderboard.yours(results, lab, student)
        if board is not None and mine is not None:
            lines += [_md(mine), "", f"### Leaderboard: {board['title']}", "", *_board_markdown(board), ""]
        for config in _configs(results):
            row = index.get((student, lab["number"], config["name"]))
            if row is None:
                continue
            lines.append(f"### {config['name']}: {row['status']}, {row['passed']}/{row['total']} tests passed")
            lines.append("")
            if row["status"] in ("missing", "skipped", "error", "timeout"):
                lines += [_md(row["message"]), ""]
            for note in row.get("notes", []):
                lines += [f"Note: {_md(note)}", ""]
            public = [t for t in row["tests"] if not t["hidden"]]
            hidden = [t for t in row["tests"] if t["hidden"]]
            if public and row["status"] not in ("error", "timeout"):
                lines.append("Public tests:")
                lines.append("")
                for t in public:
                    say = f": {_md(t['message'])}" if t["message"] and t["status"] != "passed" else ""
                    lines.append(f"- {MARK.get(t['status'], t['status'])} {_md(_label(t['test']))}{say}")
                lines.append("")
            if hidden and row["status"] not in ("error", "timeout"):
                lines.append("Hidden tests (names and outcomes only):")
                lines.append("")
                for t in hidden:
                    lines.append(f"- {MARK.get(t['status'], t['status'])} {_md(_label(t['test']))}")
                lines.append("")
            for e in row.get("cell_errors", []):
                lines += [(f"Cell {e.get('cell')} of your notebook raised {_md(e.get('type', ''))}: "
                           f"{_md(e.get('message', ''))}"), ""]
            card = cost_card(lab, config["name"], row)
            if card:
                lines += ["Cost card (a model: see the kit's docs/student.md, 'The cost card'):", "", "```", *card, "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------
# html: one page, no external assets, every string from a submission escaped.
# ----------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem;color:#1d232a;background:#fff}
h1{font-size:1.5rem;margin:0 0 .3rem} h2{font-size:1.2rem;margin:2rem 0 .5rem} h3{font-size:1.05rem;margin:1.2rem 0 .4rem}
table{border-collapse:collapse;margin:.4rem 0 1rem} th,td{border:1px solid #d4d9de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600}
.heatmap td.cell{text-align:center;min-width:5.5rem;font-variant-numeric:tabular-nums}
.heatmap td.cell a{color:inherit;text-decoration:none;display:block}
.cell small,.msg{display:block;font-size:.8rem;color:#4a525a}
.status-missing{background:#eceff1;color:#6b747c} .status-skipped{background:#f7f8f9;color:#8a939b}
.status-error,.status-timeout{background:#f3b7b7} .legend span{display:inline-block;padding:.1rem .5rem;margin-right:.3rem;border:1px solid #d4d9de}
.t-passed{color:#17692f;font-weight:600} .t-failed,.t-error,.t-timeout{color:#a4161a;font-weight:600} .t-todo{color:#8a5a00} .t-skipped{color:#8a939b}
table.leaderboard caption{text-align:left;font-weight:600;padding:.2rem 0} .yours{font-weight:600}
pre.card{font-size:.8rem;background:#f7f8f9;border:1px solid #d4d9de;padding:.4rem .6rem;overflow-x:auto}
.hidden-tag{font-size:.75rem;color:#6b747c;border:1px solid #c5ccd3;border-radius:3px;padding:0 .25rem;margin-left:.3rem}
details{margin:.2rem 0 .6rem} summary{cursor:pointer;font-weight:600}
.notes{color:#6b4f00} .overridden{outline:2px dashed #8a5a00;outline-offset:-2px} .rule{color:#4a525a}
"""
SPREAD_CSS = ("#spread td{text-align:center;vertical-align:bottom} svg.spread{display:block;margin:0 auto}\n"
              "svg.failrate{display:block} table.failrates caption{text-align:left;font-weight:600;padding:.2rem 0} "
              "tr.several-only th{background:#fbe3df} "
              ".several-tag{font-size:.75rem;color:#8e2a1e;border:1px solid #d9a49b;border-radius:3px;padding:0 .25rem;"
              "margin-left:.3rem}\n")


def _heat(row: dict | None) -> tuple[str, str, str]:
    """(css class, inline style, text) of one heat map cell."""
    if row is None:
        return "status-missing", "", "–"
    status = row["status"]
    if status in ("ok", "failed") and row["total"]:
        frac = row["passed"] / row["total"]
        hue = round(120 * frac)
        return f"status-{status}", f"background:hsl({hue},62%,{78 if frac < 1 else 72}%)", f"{row['passed']}/{row['total']}"
    return f"status-{status}", "", status


_TEMPLATES = None


def _templates():
    """The pages' jinja2 templates (labkit/grading/templates/), autoescaping everything they are given."""
    global _TEMPLATES
    if _TEMPLATES is None:
        from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

        _TEMPLATES = Environment(loader=PackageLoader("labkit.grading", "templates"),
                                 autoescape=select_autoescape(["html", "j2"], default_for_string=True),
                                 undefined=StrictUndefined, keep_trailing_newline=True)
    return _TEMPLATES


def cost_card(lab: dict, config: str, row: dict) -> list[str]:
    """The cost card of a row's examined calls, each compared with the reference's in the same grading run."""
    reference = cost.from_json(lab.get("reference_costs", {}).get(config, {}))
    chip_list = [cost.chips()[k] for k in cost.SHOWN]
    out = []
    for cid, entry in cost.from_json(row.get("costs") or {}).items():
        for label, c in entry.runs.items():
            out += cost.lines(entry.function, label, c, chip_list, reference.get(cid, cost.Examined("")).runs.get(label))
    return out


def _section(results: dict, student: str, sid: str, index: dict, hidden_messages: bool = True) -> dict:
    """One student's labs, test by test and configuration by configuration, for a template.

    Without `hidden_messages` (the student's own page), hidden tests show their name and outcome only.
    """
    configs = _configs(results)
    labs = []
    for lab in _labs(results):
        rows = [index.get((student, lab["number"], c["name"])) for c in configs]
        if not any(rows):
            continue
        tests: OrderedDict[str, dict] = OrderedDict()
        for c, r in zip(configs, rows):
            for t in (r or {}).get("tests", []):
                tests.setdefault(t["test"], {"hidden": t["hidden"]})[c["name"]] = t
        shown = []
        for test, by in tests.items():
            cells = []
            for c in configs:
                t = by.get(c["name"])
                if t is None:
                    cells.append(None)
                    continue
                say = t["message"] if t["message"] and t["status"] != "passed" else ""
                if by["hidden"] and not hidden_messages:
                    say = ""
                cells.append({"config": c["name"], "status": t["status"], "mark": MARK.get(t["status"], t["status"]),
                              "message": say})
            shown.append({"test": test, "label": _label(test), "hidden": by["hidden"], "cells": cells})
        first = next(r for r in rows if r)
        labs.append({
            "number": lab["number"], "anchor": f"{sid}-{lab['number']}", "title": _lab_title(lab),
            "summary": ", ".join(f"{c['name']} {r['status']} {r['passed']}/{r['total']}"
                                 for c, r in zip(configs, rows) if r),
            "problems": [{"config": c["name"], "status": r["status"], "message": r["message"]}
                         for c, r in zip(configs, rows) if r and r["status"] in ("missing", "skipped", "error", "timeout")],
            "tests": shown, "notes": first.get("notes", []),
            "cards": [{"config": c["name"], "text": "\n".join(cost_card(lab, c["name"], r))}
                      for c, r in zip(configs, rows) if r and r.get("costs")],
            "cell_errors": [{"config": c["name"], "cell": e.get("cell"), "type": e.get("type", ""),
                             "message": e.get("message", "")}
                            for c, r in zip(configs, rows) for e in (r or {}).get("cell_errors", [])],
        })
    return {"student": student, "sid": sid, "notes": results["students"][student].get("notes", []), "labs": labs}


def _points_cells(results: dict, mine: dict) -> list[dict]:
    return [{"lab": lab["number"], "text": _points_cell(mine["labs"][str(lab["number"])]),
             "overridden": bool(mine["labs"][str(lab["number"])].get("overridden"))} for lab in _labs(results)]


def _spread(results: dict) -> dict:
    """The score distributions laid out for the page: a row per lab, a histogram per configuration, one scale."""
    found = spread.distributions(results)
    scale = max((d["students"] for d in found), default=1)
    by = {(d["lab"], d["config"]): d for d in found}
    configs = [c["name"] for c in _configs(results)]
    return {"configs": configs, "scale": scale, "bars": spread.BARS, "labs": [
        {"number": lab["number"], "name": lab["name"],
         "cells": [spread.layout(by[(lab["number"], c)], scale) | {"config": c, "skipped": by[(lab["number"], c)]["skipped"]}
                   for c in configs]} for lab in _labs(results)]}


def _similar(results: dict, sid: dict[str, str]) -> dict:
    """The pairs to look at together, each student linked to their section of the page."""
    return {"rule": similarity.RULE, "pairs": [
        p | {"sids": [sid.get(s, "") for s in p["students"]], "percent": round(100 * p["similarity"])}
        for p in similarity.pairs(results)]}


def to_html(results: dict) -> str:
    """The class page: score distributions, a heat map per configuration, points, the bugs most hit, every test
    (labkit/grading/templates/)."""
    students, labs, configs = _students(results), _labs(results), _configs(results)
    index = _index(results)
    sid = {s: f"s{i}" for i, s in enumerate(students)}
    heatmaps = []
    for config in configs:
        rows = []
        for s in students:
            cells = []
            for lab in labs:
                row = index.get((s, lab["number"], config["name"]))
                cls, style, text = _heat(row)
                cells.append({"cls": cls, "style": style, "text": text, "lab": lab["number"],
                              "title": row["message"] if row and row["message"] else ""})
            rows.append({"student": s, "sid": sid[s], "cells": cells})
        heatmaps.append({"name": config["name"], "summary": config.get("summary", ""), "rows": rows})
    grades = policy.grades(results)
    points = {"rule": grades["rule"], "rows": [
        {"student": s, "cells": _points_cells(results, grades["students"][s]),
         "total": f"{grades['students'][s]['points']}/{grades['students'][s]['max_points']}"} for s in students]}
    bugs = [{"lab": b["lab"], "label": _label(b["test"]), "hidden": b["hidden"], "config": b["config"],
             "count": len(b["students"]), "message": b["message"]} for b in multi_device_bugs(results)]
    summary = (f"{len(students)} student{'s' if len(students) != 1 else ''} · labs "
               f"{', '.join(str(lab['number']) for lab in labs)} · configurations "
               f"{', '.join(c['name'] for c in configs)}")
    return _templates().get_template("scoreboard.html.j2").render(
        css=CSS + SPREAD_CSS, summary=summary, labs=labs, configs=configs, spread=_spread(results),
        failrates=[failrates.layout(lab) for lab in failrates.rates(results)], similar=_similar(results, sid),
        heatmaps=heatmaps, points=points, bugs=bugs, boards=leaderboard.boards(results),
        notes=results.get("notes", []), sections=[_section(results, s, sid[s], index) for s in students])


def feedback_html(results: dict, student: str) -> str:
    """One student's own page: the class page's rules, their labs only, hidden tests by name and outcome."""
    grades = policy.grades(results)
    mine = grades["students"].get(student)
    points = None
    if mine:
        points = {"total": f"{mine['points']}/{mine['max_points']}", "rule": grades["rule"],
                  "cells": _points_cells(results, mine)}
    boards = [board | {"yours": leaderboard.yours(results, lab, student)} for lab in _labs(results)
              if (board := leaderboard.board(results, lab)) is not None]
    return _templates().get_template("feedback.html.j2").render(
        css=CSS, labs=_labs(results), configs=_configs(results), points=points, boards=boards,
        s=_section(results, student, "s0", _index(results), hidden_messages=False))


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
    stems = {student.replace("/", "_"): student for student in _students(results)}
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


def merge(parts: list[dict]) -> dict:
    """One class's results from the results of its shards: the same as grading the class in one run."""
    if not parts:
        raise MergeError("nothing to merge")
    first = parts[0]
    for part in parts[1:]:
        for what in ("format", "labs", "configs", "policy", "provisional"):
            if part.get(what) != first.get(what):
                raise MergeError(f"the parts were graded with different {what}: grade every shard with the same "
                                 "--labs, --configs and --policy, with the same version of the kit")
    labs = [lab["number"] for lab in _labs(first)]
    configs = [c["name"] for c in _configs(first)]
    students, notes, rows = {}, [], {}
    for part in parts:
        students.update(part.get("students", {}))
        notes += [n for n in part.get("notes", []) if n not in notes]
        for r in part.get("rows", []):
            rows[(r["student"], r["lab"], r["config"])] = r
    ordered = sorted(rows.values(), key=lambda r: (r["student"], labs.index(r["lab"]) if r["lab"] in labs else 0,
                                                   configs.index(r["config"]) if r["config"] in configs else 0))
    drawn = {k: v for k, v in first.items() if k not in DRAWN}  # drawn again from the whole class
    return {**drawn, "students": {s: students[s] for s in sorted(students)}, "notes": notes, "rows": ordered}


def terminal(results: dict) -> Table:
    """The scoreboard on a terminal: for one student, lab by configuration; for a class, the pass rates."""
    configs, labs = _configs(results), _labs(results)
    students = _students(results)
    if len(students) == 1:
        index = _index(results)
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
            table.add_row(_lab_title(lab), *cells)
        return table
    table = Table(title=f"{len(students)} students: who passes every test, by lab and configuration",
                  title_justify="left")
    table.add_column("lab")
    for c in configs:
        table.add_column(c["name"], justify="center")
    by = {(r["lab"]["number"], r["config"]["name"]): r for r in rates(results)}
    for lab in labs:
        cells = []
        for c in configs:
            r = by[(lab["number"], c["name"])]
            cells.append(f"{r['ok']}/{r['students']}" if r["graded"] else "skipped")
        table.add_row(_lab_title(lab), *cells)
    return table
