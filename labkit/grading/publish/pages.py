"""The scoreboard and each student's feedback as html: one self-contained page each, no external
assets, drawn from jinja2 templates (templates/) that escape every string a submission wrote.
"""

from __future__ import annotations

from labkit.grading.classwide import failrates, similarity, spread, stats
from labkit.grading.classwide.results import (
    configs_of,
    index_of,
    labs_of,
    students_of,
)
from labkit.grading.publish import context

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
SPREAD_CSS = (
    "#spread td{text-align:center;vertical-align:bottom} svg.spread{display:block;margin:0 auto}\n"
    "svg.failrate{display:block} table.failrates caption{text-align:left;font-weight:600;padding:.2rem 0} "
    "tr.several-only th{background:#fbe3df} "
    ".several-tag{font-size:.75rem;color:#8e2a1e;border:1px solid #d9a49b;border-radius:3px;padding:0 .25rem;"
    "margin-left:.3rem}\n"
)


def _heat(row: dict | None) -> tuple[str, str, str]:
    """(css class, inline style, text) of one heat map cell."""
    if row is None:
        return "status-missing", "", "–"
    status = row["status"]
    if status in ("ok", "failed") and row["total"]:
        frac = row["passed"] / row["total"]
        hue = round(120 * frac)
        return (
            f"status-{status}",
            f"background:hsl({hue},62%,{78 if frac < 1 else 72}%)",
            f"{row['passed']}/{row['total']}",
        )
    return f"status-{status}", "", status


_TEMPLATES = None


def _templates():
    """The pages' jinja2 templates (labkit/grading/publish/templates/), autoescaping everything they are given."""
    global _TEMPLATES
    if _TEMPLATES is None:
        from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

        _TEMPLATES = Environment(
            loader=PackageLoader("labkit.grading.publish", "templates"),
            autoescape=select_autoescape(["html", "j2"], default_for_string=True),
            undefined=StrictUndefined,
            keep_trailing_newline=True,
        )
    return _TEMPLATES


def _spread(results: dict) -> dict:
    """The score distributions laid out for the page: a row per lab, a histogram per configuration, one scale."""
    found = spread.distributions(results)
    scale = max((d["students"] for d in found), default=1)
    by = {(d["lab"], d["config"]): d for d in found}
    configs = [c["name"] for c in configs_of(results)]
    return {
        "configs": configs,
        "scale": scale,
        "bars": spread.BARS,
        "labs": [
            {
                "number": lab["number"],
                "name": lab["name"],
                "cells": [
                    spread.layout(by[(lab["number"], c)], scale)
                    | {"config": c, "skipped": by[(lab["number"], c)]["skipped"]}
                    for c in configs
                ],
            }
            for lab in labs_of(results)
        ],
    }


def _similar(results: dict, sid: dict[str, str]) -> dict:
    """The pairs to look at together, each student linked to their section of the page."""
    return {
        "rule": similarity.RULE,
        "pairs": [
            p | {"sids": [sid.get(s, "") for s in p["students"]], "percent": round(100 * p["similarity"])}
            for p in similarity.pairs(results)
        ],
    }


def to_html(results: dict) -> str:
    """The class page: score distributions, a heat map per configuration, points, the bugs most hit, every test
    (labkit/grading/publish/templates/)."""
    students, labs, configs = students_of(results), labs_of(results), configs_of(results)
    index = index_of(results)
    sid = {s: f"s{i}" for i, s in enumerate(students)}
    heatmaps = []
    for config in configs:
        rows = []
        for s in students:
            cells = []
            for lab in labs:
                row = index.get((s, lab["number"], config["name"]))
                cls, style, text = _heat(row)
                cells.append(
                    {
                        "cls": cls,
                        "style": style,
                        "text": text,
                        "lab": lab["number"],
                        "title": row["message"] if row and row["message"] else "",
                    }
                )
            rows.append({"student": s, "sid": sid[s], "cells": cells})
        heatmaps.append({"name": config["name"], "summary": config.get("summary", ""), "rows": rows})
    k = context.klass(results)
    summary = (
        f"{len(students)} student{'s' if len(students) != 1 else ''} · labs "
        f"{', '.join(str(lab['number']) for lab in labs)} · configurations "
        f"{', '.join(c['name'] for c in configs)}"
    )
    return (
        _templates()
        .get_template("scoreboard.html.j2")
        .render(
            css=CSS + SPREAD_CSS,
            summary=summary,
            labs=labs,
            configs=configs,
            spread=_spread(results),
            failrates=[failrates.layout(lab) for lab in failrates.rates(results)],
            similar=_similar(results, sid),
            heatmaps=heatmaps,
            points=k["points"],
            bugs=k["bugs"],
            boards=k["boards"],
            stats=k["stats"],
            labels=k["labels"],
            notes=results.get("notes", []),
            sections=[context.section(results, s, sid[s], index) for s in students],
        )
    )


def feedback_html(results: dict, student: str) -> str:
    """One student's own page, from the context their Markdown feedback is drawn from (labkit/grading/publish/context.py):
    the class page's rules, their labs only, hidden tests by name and outcome."""
    f = context.feedback(results, student)
    return (
        _templates()
        .get_template("feedback.html.j2")
        .render(
            css=CSS, labs=labs_of(results), configs=f["configs"], points=f["points"], boards=f["boards"], s=f
        )
    )


def anonymous_html(results: dict) -> str:
    """The class page to show in a lecture: final points per lab and section, the score distributions and each
    test's failure rate, with no student's id, name or message (the bars' tooltips give counts only)."""
    shown = _spread(results)
    for lab in shown["labs"]:
        for cell in lab["cells"]:
            for bar in cell.get("bars", []):
                if bar["count"]:
                    bar["title"] = (
                        f"{lab['name']} on {cell['config']}, {bar['label']}: {bar['count']} "
                        f"student{'s' if bar['count'] != 1 else ''}"
                    )
    rates = [failrates.layout(lab) for lab in failrates.rates(results)]
    for lab in rates:
        for row in lab["rows"]:
            for c in row["cells"]:
                said = "nothing judged here" if c["rate"] is None else f"{c['text']} failed"
                if c["several_only"]:
                    said += f"; {c['several_only']} of them pass it on one device"
                c["title"] = f"{row['label']} on {c['config']}: {said}"
    count = len(students_of(results))
    summary = (
        f"{count} student{'s' if count != 1 else ''} · labs "
        f"{', '.join(str(lab['number']) for lab in labs_of(results))} · configurations "
        f"{', '.join(c['name'] for c in configs_of(results))}"
    )
    return (
        _templates()
        .get_template("anonymous.html.j2")
        .render(
            css=CSS + SPREAD_CSS,
            summary=summary,
            spread=shown,
            failrates=rates,
            stats=stats.final_points(results),
            labels=stats.bin_labels(),
        )
    )
