"""What a student's feedback says, as plain data: built once, drawn as Markdown and as HTML.

`feedback(results, student)` is the one context both renderings read (labkit/grading/publish/markdown.py
and labkit/grading/publish/pages.py, through templates/feedback.md.j2 and templates/feedback.html.j2), so
the two cannot say different things: each lab's points, late penalty, override and adjustments,
the lab's leaderboard, and every test on every configuration (hidden ones by name and outcome).
`section` is the same per-lab data for the class page's "Every test".

Text a student reads never names the TA's files: `scrub` turns an absolute path (the class's
folder, the kit's checkout, the Python installation) into a name relative to the submission or
the package, so that feedback written on one machine says nothing of it.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from labkit.grading.classwide import leaderboard
from labkit.grading.classwide.results import (
    MARK,
    configs_of,
    cost_card,
    index_of,
    lab_title,
    labs_of,
    points_cell,
    test_label,
)
from labkit.grading.state import adjustments, policy
from labkit.judge import timeline

# An absolute path: a `/` that starts a word (not inside a URL, a fraction or a relative path), then names.
_PATH = re.compile(r"(?<![\w:/.~\\-])(?:/[\w.@+~-]+){2,}/?")
_PACKAGES = ("site-packages/", "dist-packages/")


def scrub(text: str, student: str = "") -> str:
    """`text` with every absolute path made relative: to the student's folder where it is inside one, to the
    Python packages for an installed library's file, else its file name alone."""

    def relative(m: re.Match) -> str:
        path = m.group(0)
        for mark in _PACKAGES:
            if mark in path:
                return path.split(mark, 1)[1]
        parts = [p for p in path.split("/") if p]
        if student and student in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(student) :]) or student
        return parts[-1]

    return _PATH.sub(relative, str(text))


def _tests(configs: list[dict], rows: list[dict | None], hidden_messages: bool, clean) -> list[dict]:
    """Each test of a lab with its outcome on every configuration (None where it did not run there)."""
    tests: OrderedDict[str, dict] = OrderedDict()
    for c, r in zip(configs, rows):
        for t in (r or {}).get("tests", []):
            tests.setdefault(t["test"], {"hidden": t["hidden"]})[c["name"]] = t
    shown = []
    for test, by in tests.items():
        cells: list[dict | None] = []
        for c in configs:
            t = by.get(c["name"])
            if t is None:
                cells.append(None)
                continue
            say = t["message"] if t["message"] and t["status"] != "passed" else ""
            if by["hidden"] and not hidden_messages:
                say = ""
            cells.append(
                {
                    "config": c["name"],
                    "status": t["status"],
                    "mark": MARK.get(t["status"], t["status"]),
                    "message": clean(say),
                }
            )
        shown.append({"test": test, "label": test_label(test), "hidden": by["hidden"], "cells": cells})
    return shown


def _runs(configs: list[dict], rows: list[dict | None], tests: list[dict], clean) -> list[dict]:
    """Configuration by configuration: the run's outcome, why it did not finish, its tests, its cell errors, its card."""
    out = []
    for i, (c, r) in enumerate(zip(configs, rows)):
        if r is None:
            continue
        finished = r["status"] not in ("error", "timeout")
        mine = [t | {"cell": t["cells"][i]} for t in tests if t["cells"][i] is not None] if finished else []
        out.append(
            {
                "config": c["name"],
                "status": r["status"],
                "passed": r["passed"],
                "total": r["total"],
                "problem": clean(r["message"])
                if r["status"] in ("missing", "skipped", "error", "timeout")
                else "",
                "notes": [clean(n) for n in r.get("notes", [])],
                "public": [t for t in mine if not t["hidden"]],
                "hidden": [t for t in mine if t["hidden"]],
                "cell_errors": [
                    {"cell": e.get("cell"), "type": e.get("type", ""), "message": clean(e.get("message", ""))}
                    for e in r.get("cell_errors", [])
                ],
            }
        )
    return out


def timelines(results: dict, lab: dict, student: str, index: dict) -> list[dict]:
    """The pictures of a student's schedules on each configuration, beside the reference's of the same grading
    run (labkit.judge.timeline): the kit's own SVG, drawn from numbers with every word escaped, which the feedback
    page embeds as it is (`safe`)."""
    out = []
    for c in configs_of(results):
        row = index.get((student, lab["number"], c["name"])) or {}
        reference = (lab.get("reference_timelines") or {}).get(c["name"]) or {}
        drawn = timeline.pictures(row.get("timelines") or {}, reference)
        if drawn:
            out.append({"config": c["name"], "svg": timeline.page(drawn)})
    return out


def lab_part(
    results: dict, lab: dict, student: str, sid: str, index: dict, hidden_messages: bool, clean
) -> dict:
    """One lab of one student: the outcome on each configuration, test by test."""
    configs = configs_of(results)
    rows = [index.get((student, lab["number"], c["name"])) for c in configs]
    tests = _tests(configs, rows, hidden_messages, clean)
    first: dict = next((r for r in rows if r), {})
    runs = _runs(configs, rows, tests, clean)
    for run, row in zip(runs, [r for r in rows if r is not None]):
        run["card"] = "\n".join(cost_card(lab, run["config"], row)) if row.get("costs") else ""
    return {
        "number": lab["number"],
        "name": lab["name"],
        "anchor": f"{sid}-{lab['number']}",
        "title": lab_title(lab),
        "graded": any(rows),
        "summary": ", ".join(
            f"{c['name']} {r['status']} {r['passed']}/{r['total']}" for c, r in zip(configs, rows) if r
        ),
        "problems": [
            {"config": c["name"], "status": r["status"], "message": clean(r["message"])}
            for c, r in zip(configs, rows)
            if r and r["status"] in ("missing", "skipped", "error", "timeout")
        ],
        "tests": tests,
        "notes": [clean(n) for n in first.get("notes", [])],
        "cards": [
            {"config": c["name"], "text": "\n".join(cost_card(lab, c["name"], r))}
            for c, r in zip(configs, rows)
            if r and r.get("costs")
        ],
        "cell_errors": [
            {
                "config": c["name"],
                "cell": e.get("cell"),
                "type": e.get("type", ""),
                "message": clean(e.get("message", "")),
            }
            for c, r in zip(configs, rows)
            for e in (r or {}).get("cell_errors", [])
        ],
        "runs": runs,
    }


def section(results: dict, student: str, sid: str, index: dict) -> dict:
    """One student's labs for the class page (the TA's: hidden tests' messages shown, nothing scrubbed)."""
    labs = [lab_part(results, lab, student, sid, index, True, str) for lab in labs_of(results)]
    return {
        "student": student,
        "sid": sid,
        "notes": results["students"][student].get("notes", []),
        "labs": [lab for lab in labs if lab["graded"]],
    }


def points_of(p: dict) -> dict:
    """One lab's points as both renderings show them."""
    return {
        "points": p["points"],
        "max_points": p["max_points"],
        "text": points_cell(p),
        "late_note": p.get("late_note", ""),
        "overridden": p.get("overridden", ""),
        "adjustments": [adjustments.words(a) for a in p.get("adjustments", [])],
    }


def feedback(results: dict, student: str, grades: dict | None = None) -> dict:
    """Everything one student is told, as plain data: their points, and lab by lab their points, leaderboard
    place and tests (hidden ones by name and outcome only), with the TA's paths made relative."""
    grades = grades or policy.grades(results)
    mine = grades["students"].get(student)

    def clean(text) -> str:
        return scrub(text, student)

    index = index_of(results)
    labs = []
    for lab in labs_of(results):
        part = lab_part(results, lab, student, "s0", index, False, clean)
        part["points"] = points_of(mine["labs"][str(lab["number"])]) if mine else None
        # the pictures of the schedule: the feedback page's alone, never the class page's
        part["timelines"] = timelines(results, lab, student, index)
        board = leaderboard.board(results, lab, viewer=student)
        part["board"] = (
            board | {"yours": leaderboard.yours(results, lab, student)} if board is not None else None
        )
        labs.append(part)
    points = None
    if mine:
        points = {
            "total": f"{mine['points']}/{mine['max_points']}",
            "rule": _rule_for_students(results, grades["rule"], student),
            "cells": [
                {
                    "lab": lab["number"],
                    "name": lab["name"],
                    "text": part["points"]["text"],
                    "overridden": bool(part["points"]["overridden"]),
                }
                for lab, part in zip(labs_of(results), labs)
            ],
        }
    return {
        "student": student,
        "sid": "s0",
        "configs": configs_of(results),
        "points": points,
        "notes": [clean(n) for n in results.get("students", {}).get(student, {}).get("notes", [])],
        "labs": labs,
        "boards": [part["board"] for part in labs if part["board"] is not None],
    }


def _rule_for_students(results: dict, rule: str, student: str) -> str:
    """The rule as a student reads it: the policy named by its file's name, never where it lies on the TA's
    machine (an absolute or a relative path), and no other path either."""
    source = str((results.get("policy") or {}).get("source") or "")
    if source:
        rule = rule.replace(source, source.replace("\\", "/").rsplit("/", 1)[-1])
    return scrub(rule, student)


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "–"


def klass(results: dict, grades: dict | None = None) -> dict:
    """What the class pages say, as plain data (scoreboard.md and scoreboard.html draw it): the pass rates, each
    student's points, the final points' statistics, the leaderboards, the statuses, the multi-device bugs most
    often hit, the runs without a sandbox and the notes."""
    from labkit.grading.classwide import stats
    from labkit.grading.classwide.results import multi_device_bugs, rates, students_of

    grades = grades or policy.grades(results)
    students, labs, configs = students_of(results), labs_of(results), configs_of(results)
    found = rates(results)
    by = {(r["lab"]["number"], r["config"]["name"]): r for r in found}
    kinds = ("ok", "failed", "error", "timeout", "missing", "skipped")
    weak = sum(r.get("isolation") == "limits-only" for r in results.get("rows", []))
    return {
        "students": students,
        "labs": labs,
        "configs": configs,
        "passing": _passing(labs, configs, by),
        "points": _points(grades, students, labs),
        "stats": stats.final_points(results, grades),
        "labels": stats.bin_labels(),
        "boards": leaderboard.boards(results),
        "statuses": [
            {
                "lab": r["lab"]["number"],
                "config": r["config"]["name"],
                "counts": [r["statuses"].get(k, 0) for k in kinds],
            }
            for r in found
        ],
        "bugs": [_bug(b) for b in multi_device_bugs(results)],
        "limits_only": {"runs": weak, "of": len(results.get("rows", []))} if weak else None,
        "notes": list(results.get("notes", [])),
        "student_notes": [
            {"student": s, "note": n} for s in students for n in results["students"][s].get("notes", [])
        ],
    }


def _passing(labs: list[dict], configs: list[dict], by: dict) -> list[dict]:
    """Per lab, per configuration: how many students pass every test, and the share of tests passed."""
    return [
        {
            "number": lab["number"],
            "title": lab_title(lab),
            "cells": [
                (
                    f"{r['ok']}/{r['students']} students ({_pct(r['ok'], r['students'])}); tests {_pct(r['passed'], r['total'])}"
                    if (r := by[(lab["number"], c["name"])])["graded"]
                    else "skipped"
                )
                for c in configs
            ],
        }
        for lab in labs
    ]


def _points(grades: dict, students: list[str], labs: list[dict]) -> dict:
    """The rule, and each student's total and points per lab (an overridden lab marked)."""
    return {
        "rule": grades["rule"],
        "rows": [
            {
                "student": s,
                "total": f"{grades['students'][s]['points']}/{grades['students'][s]['max_points']}",
                "cells": [
                    {
                        "lab": lab["number"],
                        "text": points_cell(p := grades["students"][s]["labs"][str(lab["number"])]),
                        "overridden": bool(p.get("overridden")),
                    }
                    for lab in labs
                ],
            }
            for s in students
        ],
    }


def _bug(b: dict) -> dict:
    """One multi-device bug many students hit, as the class pages name it."""
    return {
        "lab": b["lab"],
        "label": test_label(b["test"]),
        "hidden": b["hidden"],
        "config": b["config"],
        "count": len(b["students"]),
        "message": b["message"],
    }
