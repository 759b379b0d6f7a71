"""The scoreboard in markdown: the class summary (pass rates, the multi-device bugs most often hit,
points, the leaderboards) and each student's feedback.
"""

from __future__ import annotations

import re

from markupsafe import Markup

from labkit.grading import context, leaderboard, policy, stats
from labkit.grading.results import (
    configs_of,
    lab_title,
    labs_of,
    multi_device_bugs,
    points_cell,
    rates,
    students_of,
    test_label,
)


def _md(text) -> str:
    """Text from a submission, safe inside a Markdown table cell: markup is escaped with backslashes, which
    Markdown shows as the characters themselves (an HTML entity would read as `&lt;` in a plain-text view)."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<").replace(">", "\\>")
            .replace("`", "\\`").replace("\r", " ").replace("\n", " "))


def _finalize(value) -> str:
    """Every {{ }} of a Markdown template: escaped, but for text a filter marked as already safe (Markup)."""
    if value is None:
        return ""
    return str(value) if isinstance(value, Markup) else _md(value)


def _code(text) -> Markup:
    """Text inside a ``` fence: shown as is, with no backtick that could close the fence."""
    return Markup(str(text).replace("`", "'"))


_TEMPLATES = None


def _templates():
    """The Markdown templates (labkit/grading/templates/*.md.j2): every value escaped for Markdown."""
    global _TEMPLATES
    if _TEMPLATES is None:
        from jinja2 import Environment, PackageLoader, StrictUndefined

        _TEMPLATES = Environment(loader=PackageLoader("labkit.grading", "templates"), autoescape=False,
                                 finalize=_finalize, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                                 keep_trailing_newline=True)
        _TEMPLATES.filters["code"] = _code
    return _TEMPLATES


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "–"


def to_markdown(results: dict) -> str:
    students, labs, configs = students_of(results), labs_of(results), configs_of(results)
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
        lines.append(f"| {_md(lab_title(lab))} | " + " | ".join(cells) + " |")
    lines += _points_markdown(results)
    lines += ["", *_templates().get_template("stats.md.j2").render(
        st=stats.final_points(results), labels=stats.bin_labels()).rstrip("\n").split("\n")]
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
            lines.append(f"| {b['lab']} | {_md(test_label(b['test']))}{hidden} | {b['config']} | {len(b['students'])} | "
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


def _points_markdown(results: dict) -> list[str]:
    g = policy.grades(results)
    labs = labs_of(results)
    lines = ["", "## Points", "", f"Rule: {_md(g['rule'])}.", "",
             "| student | " + " | ".join(_md(lab["name"]) for lab in labs) + " | total |",
             "| --- |" + " ---: |" * (len(labs) + 1)]
    for student, mine in g["students"].items():
        cells = []
        for lab in labs:
            cells.append(_md(points_cell(mine["labs"][str(lab["number"])])))
        lines.append(f"| {_md(student)} | " + " | ".join(cells) + f" | {mine['points']}/{mine['max_points']} |")
    return lines


def _board_markdown(board: dict) -> list[str]:
    """One leaderboard as a table (templates/leaderboard.md.j2, as each student's feedback draws it)."""
    return _templates().get_template("leaderboard.md.j2").render(b=board).rstrip("\n").split("\n")


def _leaderboards_markdown(results: dict) -> list[str]:
    lines = []
    for board in leaderboard.boards(results):
        lines += ["", f"## Leaderboard: {board['name']} · {board['title']}", "", *_board_markdown(board)]
    return lines


def feedback(results: dict, student: str) -> str:
    """What one student is told (labkit/grading/context.py's context, the HTML page's): public tests with their
    messages, hidden tests by name and outcome only, each lab's points, late penalty and adjustments."""
    text = _templates().get_template("feedback.md.j2").render(f=context.feedback(results, student))
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
