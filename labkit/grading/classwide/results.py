"""Reading graded results (the plain data `grade` writes, or `ownresults.student_results` makes from a
student's own runs): the questions every drawing of them asks, answered once.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from labkit import cost, statuses
from labkit.grading.state import adjustments, deadlines

MARK = statuses.TEST_MARKS


STATUS_STYLE = {
    "ok": "green",
    "failed": "red",
    "error": "red",
    "timeout": "red",
    "missing": "dim",
    "skipped": "dim",
}


def labs_of(results: dict) -> list[dict]:
    return results.get("labs", [])


def configs_of(results: dict) -> list[dict]:
    return results.get("configs", [])


def students_of(results: dict) -> list[str]:
    return sorted(results.get("students", {}))


def index_of(results: dict) -> dict[tuple, dict]:
    return {(r["student"], r["lab"], r["config"]): r for r in results.get("rows", [])}


def test_label(test: str) -> str:
    return test.removeprefix("test_").replace("_", " ")


def lab_title(lab: dict) -> str:
    title = lab.get("title") or lab["name"]
    if title.lower().replace("-", " ").startswith(lab["name"].replace("-", " ")):
        return title  # "Lab 3 · shard_map basics" already says which lab
    return f"{lab['name']} · {title}"


def is_multi(config: dict) -> bool:
    return config.get("devices") != 1


def rates(results: dict) -> list[dict]:
    """Per lab and configuration: students ok, tests passed, and how many rows had each status."""
    out = []
    rows = results.get("rows", [])
    for lab in labs_of(results):
        for config in configs_of(results):
            mine = [r for r in rows if r["lab"] == lab["number"] and r["config"] == config["name"]]
            graded = [r for r in mine if r["status"] != "skipped"]
            out.append(
                {
                    "lab": lab,
                    "config": config,
                    "students": len(mine),
                    "ok": sum(r["status"] == "ok" for r in mine),
                    "graded": len(graded),
                    "passed": sum(r["passed"] for r in graded),
                    "total": sum(r["total"] for r in graded),
                    "statuses": Counter(r["status"] for r in mine),
                }
            )
    return out


def multi_device_bugs(results: dict, top: int = 10) -> list[dict]:
    """Tests failed on a multi-device configuration by students who pass them on one device, most hit first.

    When the run had no one-device configuration, every failure on several devices counts.
    """
    configs = {c["name"]: c for c in configs_of(results)}
    singles = [n for n, c in configs.items() if not is_multi(c)]
    index = index_of(results)
    hits: OrderedDict[tuple, dict] = OrderedDict()
    for row in results.get("rows", []):
        config = configs.get(row["config"])
        if config is None or not is_multi(config):
            continue
        for t in row["tests"]:
            if t["status"] not in ("failed", "error"):
                continue
            if singles:
                alone = [index.get((row["student"], row["lab"], s)) for s in singles]
                if not any(
                    a and any(u["test"] == t["test"] and u["status"] == "passed" for u in a["tests"])
                    for a in alone
                ):
                    continue
            entry = hits.setdefault(
                (row["lab"], t["test"], row["config"]),
                {
                    "lab": row["lab"],
                    "test": t["test"],
                    "config": row["config"],
                    "hidden": t["hidden"],
                    "students": set(),
                    "messages": Counter(),
                },
            )
            entry["students"].add(row["student"])
            entry["messages"][t["message"]] += 1
    found = sorted(hits.values(), key=lambda e: (-len(e["students"]), e["lab"], e["test"], e["config"]))
    return [
        e
        | {
            "students": sorted(e["students"]),
            "message": min(e["messages"].items(), key=lambda kv: (-kv[1], kv[0]))[0],
        }
        for e in found[:top]
    ]


def cost_card(lab: dict, config: str, row: dict) -> list[str]:
    """The cost card of a row's examined calls, each compared with the reference's in the same grading run."""
    reference = cost.from_json(lab.get("reference_costs", {}).get(config, {}))
    chip_list = [cost.chips()[k] for k in cost.SHOWN]
    out = []
    for cid, entry in cost.from_json(row.get("costs") or {}).items():
        for label, c in entry.runs.items():
            out += cost.lines(
                entry.function, label, c, chip_list, reference.get(cid, cost.Examined("")).runs.get(label)
            )
    return out


def points_cell(p: dict) -> str:
    """A lab's points as shown: `missing`, or points/max, with a late penalty and a TA's override marked."""
    shown = "overridden" in p or any(a["comment"] != "not graded" for a in p.get("adjustments", []))
    text = "missing" if p["status"] == "missing" and not shown else f"{p['points']}/{p['max_points']}"
    if p.get("late_days"):
        source = deadlines.SOURCES.get(p.get("time_source", ""), "an unknown source")
        text += f" (late {p['late_days']}d, -{round(100 * p['late_penalty'])}%, by {source})"
    if p.get("overridden"):
        text += f" (overridden: {p['overridden']})"
    if p.get("adjustments"):
        text += f" (adjusted: {'; '.join(adjustments.words(a) for a in p['adjustments'])})"
    return text
