"""The scoreboard: graded results drawn as csv, json, markdown, html and per-student feedback.

Everything here is a pure function of the results (the plain data `grade` produces, or
`grade.student_results` makes from a student's own `make lab-N` runs): the same results
always give the same files, byte for byte, which is what lets `merge` put the shards of a
class back together into exactly the scoreboard a single run would have written.

    scoreboard.csv     student,lab,config,passed,total,status,message,isolation: one row per unit
    scoreboard.json    the results themselves: every test's outcome and message
    scoreboard.md      the class summary: pass rates, and the multi-device bugs most often hit
    scoreboard.html    one self-contained page: a student x lab heat map per configuration, every test
    feedback/<id>.md   for each student: public tests with their messages, hidden tests by name and outcome
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections import Counter, OrderedDict
from pathlib import Path

from rich.table import Table
from rich.text import Text

from labkit import policy
from labkit.files import write_atomic

CSV_COLUMNS = ("student", "lab", "config", "passed", "total", "status", "points", "max_points", "message",
               "isolation")
GRADE_COLUMNS = ("student", "lab", "points", "max_points", "weight", "status", "late_days", "late_penalty",
                 "overridden", "rule")
MARK = {"passed": "✓", "failed": "✗", "todo": "todo", "error": "error", "timeout": "timeout", "skipped": "skip"}
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
                             lab.get("late_days", ""), lab.get("late_penalty", ""), _cell(lab.get("overridden", "")),
                             g["rule"]])
        writer.writerow([_cell(student), "total", mine["points"], mine["max_points"], "", "", "", "", "", g["rule"]])
    return buf.getvalue()


def to_json(results: dict) -> str:
    return json.dumps(results, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


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
                  "reach the network. See the README, \"Isolation and limits\"."]
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
        text += f" (late {p['late_days']}d, -{round(100 * p['late_penalty'])}%)"
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
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------
# html: one page, no external assets, every string from a submission escaped.
# ----------------------------------------------------------------------------------------

def _h(text) -> str:
    return html.escape(str(text), quote=True)


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
.hidden-tag{font-size:.75rem;color:#6b747c;border:1px solid #c5ccd3;border-radius:3px;padding:0 .25rem;margin-left:.3rem}
details{margin:.2rem 0 .6rem} summary{cursor:pointer;font-weight:600}
.notes{color:#6b4f00}
"""


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


def to_html(results: dict) -> str:
    students, labs, configs = _students(results), _labs(results), _configs(results)
    index = _index(results)
    sid = {s: f"s{i}" for i, s in enumerate(students)}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>Scoreboard</title>", f"<style>{CSS}</style></head><body>",
           "<h1>Scoreboard</h1>",
           (f"<p id=\"summary\">{len(students)} student{'s' if len(students) != 1 else ''} · labs "
            f"{_h(', '.join(str(lab['number']) for lab in labs))} · configurations "
            f"{_h(', '.join(c['name'] for c in configs))}</p>"),
           ('<p class="legend"><span style="background:hsl(120,62%,72%)">all tests pass</span>'
            '<span style="background:hsl(60,62%,78%)">some pass</span><span style="background:hsl(0,62%,78%)">'
            'none pass</span><span class="status-error">error / timeout</span><span class="status-missing">'
            'missing</span><span class="status-skipped">skipped</span></p>')]
    for config in configs:
        out.append(f'<h2 id="heat-{_h(config["name"])}">{_h(config["name"])}'
                   f'{" · " + _h(config["summary"]) if config.get("summary") else ""}</h2>')
        out.append(f'<table class="heatmap" data-config="{_h(config["name"])}"><thead><tr><th>student</th>')
        out += [f'<th data-lab="{lab["number"]}">{_h(lab["name"])}</th>' for lab in labs]
        out.append("</tr></thead><tbody>")
        for s in students:
            out.append(f'<tr data-student="{_h(s)}"><th><a href="#{sid[s]}">{_h(s)}</a></th>')
            for lab in labs:
                row = index.get((s, lab["number"], config["name"]))
                cls, style, text = _heat(row)
                title = f' title="{_h(row["message"])}"' if row and row["message"] else ""
                out.append(f'<td class="cell {cls}" style="{style}" data-lab="{lab["number"]}"{title}>'
                           f'<a href="#{sid[s]}-{lab["number"]}">{_h(text)}</a></td>')
            out.append("</tr>")
        out.append("</tbody></table>")
    grades = policy.grades(results)
    out.append(f'<h2 id="points">Points</h2><p class="rule">{_h(grades["rule"])}</p>'
               '<table id="points-table"><thead><tr><th>student</th>'
               + "".join(f'<th data-lab="{lab["number"]}">{_h(lab["name"])}</th>' for lab in labs)
               + "<th>total</th></tr></thead><tbody>")
    for s in students:
        mine = grades["students"][s]
        out.append(f'<tr data-student="{_h(s)}"><th>{_h(s)}</th>')
        for lab in labs:
            p = mine["labs"][str(lab["number"])]
            mark = ' class="overridden"' if p.get("overridden") else ""
            out.append(f'<td data-lab="{lab["number"]}"{mark}>{_h(_points_cell(p))}</td>')
        out.append(f'<td class="total">{_h(mine["points"])}/{_h(mine["max_points"])}</td></tr>')
    out.append("</tbody></table>")
    bugs = multi_device_bugs(results)
    if bugs:
        out.append('<h2>Multi-device bugs most often hit</h2><table id="bugs"><thead><tr><th>lab</th><th>test</th>'
                   "<th>configuration</th><th>students</th><th>most common message</th></tr></thead><tbody>")
        for b in bugs:
            tag = '<span class="hidden-tag">hidden</span>' if b["hidden"] else ""
            out.append(f"<tr><td>{b['lab']}</td><td>{_h(_label(b['test']))}{tag}</td><td>{_h(b['config'])}</td>"
                       f"<td>{len(b['students'])}</td><td>{_h(b['message'])}</td></tr>")
        out.append("</tbody></table>")
    if results.get("notes"):
        out.append('<h2>Notes on the submissions</h2><ul class="notes">')
        out += [f"<li>{_h(n)}</li>" for n in results["notes"]]
        out.append("</ul>")
    out.append("<h2>Every test</h2>")
    for s in students:
        out.append(f'<section class="student" id="{sid[s]}" data-student="{_h(s)}"><h3>{_h(s)}</h3>')
        notes = results["students"][s].get("notes", [])
        if notes:
            out.append('<ul class="notes">' + "".join(f"<li>{_h(n)}</li>" for n in notes) + "</ul>")
        for lab in labs:
            rows = [index.get((s, lab["number"], c["name"])) for c in configs]
            if not any(rows):
                continue
            summary = ", ".join(f"{c['name']} {r['status']} {r['passed']}/{r['total']}"
                                for c, r in zip(configs, rows) if r)
            out.append(f'<details id="{sid[s]}-{lab["number"]}" data-lab="{lab["number"]}" open>'
                       f"<summary>{_h(_lab_title(lab))}: {_h(summary)}</summary>")
            tests: OrderedDict[str, dict] = OrderedDict()
            for c, r in zip(configs, rows):
                for t in (r or {}).get("tests", []):
                    tests.setdefault(t["test"], {"hidden": t["hidden"]})[c["name"]] = t
            problems = [(c["name"], r) for c, r in zip(configs, rows)
                        if r and r["status"] in ("missing", "skipped", "error", "timeout")]
            for name, r in problems:
                out.append(f'<p class="msg">{_h(name)}: {_h(r["status"])}: {_h(r["message"])}</p>')
            if tests:
                out.append('<table class="tests"><thead><tr><th>test</th>'
                           + "".join(f"<th>{_h(c['name'])}</th>" for c in configs) + "</tr></thead><tbody>")
                for test, by in tests.items():
                    tag = '<span class="hidden-tag">hidden</span>' if by["hidden"] else ""
                    out.append(f'<tr data-test="{_h(test)}"><td>{_h(_label(test))}{tag}</td>')
                    for c in configs:
                        t = by.get(c["name"])
                        if t is None:
                            out.append("<td></td>")
                            continue
                        msg = f'<span class="msg">{_h(t["message"])}</span>' if t["message"] and t["status"] != "passed" else ""
                        out.append(f'<td data-config="{_h(c["name"])}"><span class="t-{_h(t["status"])}">'
                                   f"{_h(MARK.get(t['status'], t['status']))}</span>{msg}</td>")
                    out.append("</tr>")
                out.append("</tbody></table>")
            first = next(r for r in rows if r)
            out += [f'<p class="notes">{_h(note)}</p>' for note in first.get("notes", [])]
            for c, r in zip(configs, rows):
                for e in (r or {}).get("cell_errors", []):
                    out.append(f'<p class="msg">{_h(c["name"])}: cell {_h(e.get("cell"))} raised '
                               f'{_h(e.get("type", ""))}: {_h(e.get("message", ""))}</p>')
            out.append("</details>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


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
    names = {f"{student.replace('/', '_')}.md": student for student in _students(results)}
    for name, student in names.items():
        write_atomic(out / "feedback" / name, feedback(results, student))
    for old in (out / "feedback").glob("*.md"):
        if old.name not in names:
            old.unlink()  # a student of an earlier run in this folder, no longer in these results


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
    return {**first, "students": {s: students[s] for s in sorted(students)}, "notes": notes, "rows": ordered}


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
