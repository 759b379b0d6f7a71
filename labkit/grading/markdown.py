"""The scoreboard in markdown: the class summary (pass rates, the multi-device bugs most often hit,
points, the leaderboards) and each student's feedback.
"""

from __future__ import annotations

from labkit.grading import leaderboard, policy
from labkit.grading.results import (
    MARK,
    configs_of,
    cost_card,
    index_of,
    lab_title,
    labs_of,
    multi_device_bugs,
    points_cell,
    rates,
    students_of,
    test_label,
)


def _md(text) -> str:
    """Text from a submission, safe inside a markdown table cell."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("`", "\\`").replace("\r", " ").replace("\n", " "))


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
    index = index_of(results)
    points = policy.grades(results)
    mine = points["students"].get(student)
    lines = [f"# Feedback: {_md(student)}", ""]
    for note in results.get("students", {}).get(student, {}).get("notes", []):
        lines.append(f"- {_md(note)}")
    if lines[-1] != "":
        lines.append("")
    if mine:
        lines += [f"Points: {mine['points']}/{mine['max_points']} ({_md(points['rule'])}).", ""]
    for lab in labs_of(results):
        lines += [f"## {_md(lab_title(lab))}", ""]
        if mine:
            p = mine["labs"][str(lab["number"])]
            lines += [f"Points: {p['points']}/{p['max_points']}", ""]
            if p.get("late_note"):
                lines += [f"Late policy: {_md(p['late_note'])}", ""]
        board, told = leaderboard.board(results, lab), leaderboard.yours(results, lab, student)
        if board is not None and told is not None:
            lines += [_md(told), "", f"### Leaderboard: {board['title']}", "", *_board_markdown(board), ""]
        for config in configs_of(results):
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
                    lines.append(f"- {MARK.get(t['status'], t['status'])} {_md(test_label(t['test']))}{say}")
                lines.append("")
            if hidden and row["status"] not in ("error", "timeout"):
                lines.append("Hidden tests (names and outcomes only):")
                lines.append("")
                for t in hidden:
                    lines.append(f"- {MARK.get(t['status'], t['status'])} {_md(test_label(t['test']))}")
                lines.append("")
            for e in row.get("cell_errors", []):
                lines += [(f"Cell {e.get('cell')} of your notebook raised {_md(e.get('type', ''))}: "
                           f"{_md(e.get('message', ''))}"), ""]
            card = cost_card(lab, config["name"], row)
            if card:
                lines += ["Cost card (a model: see the kit's docs/student.md, 'The cost card'):", "", "```", *card, "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
