"""How a class's scores spread: for each lab and configuration of a graded run, a small histogram.

A student's score on one lab and one configuration is the share of that lab's tests that passed
there (passed / total, the number the heat map shows). Each histogram puts every student of the run
in one bar:

    missing      no notebook was handed in
    no result    the run ended in an error or a timeout, or no test ran: no test could pass
    0%           every test ran and failed
    1-24% ... 75-99%   some passed, by quarter (1 of 3 tests is 33%: the 25-49% bar)
    100%         every test passed

A configuration that could not run here (its rows are `skipped`) draws no bars and says so. Every
histogram of a run is drawn on one scale (the number of students), so bars of the same height mean
the same number of students in every lab and configuration: a class that passes on cpu-1 and fails
on cpu-8 shows a tall 100% bar in one and a bar further left in the other.

`distributions(results)` is the data: which students fall in which bar, a pure function of the
results. `layout(d, scale)` turns one into the bars' rectangles, which the scoreboard's page draws as
inline SVG (labkit/grading/publish/templates/spread.html.j2); every string in it, a student id in a bar's tooltip
included, goes through the template's autoescaping.
"""

from __future__ import annotations

# (key, label) of each bar, left to right.
BARS = (
    ("missing", "missing"),
    ("no-result", "no result"),
    ("0", "0%"),
    ("1-24", "1-24%"),
    ("25-49", "25-49%"),
    ("50-74", "50-74%"),
    ("75-99", "75-99%"),
    ("100", "100%"),
)
_QUARTERS = ("1-24", "25-49", "50-74", "75-99")

BAR_WIDTH, BAR_GAP, HEIGHT, TOP, BOTTOM = 12, 3, 44, 12, 4
NAMES_SHOWN = 25  # a bar's tooltip names at most this many students, then says how many more


def bar_of(row: dict) -> str | None:
    """Which bar a row falls in (a key of BARS), or None for a configuration that did not run here."""
    status = row["status"]
    if status == "skipped":
        return None
    if status == "missing":
        return "missing"
    if status not in ("ok", "failed") or not row["total"]:
        return "no-result"
    passed, total = row["passed"], row["total"]
    if passed >= total:
        return "100"
    if passed == 0:
        return "0"
    return _QUARTERS[4 * passed // total]


def distributions(results: dict) -> list[dict]:
    """Per lab and configuration, in the results' order: the students in each bar.

    Each entry: lab (number), lab_name, config (name), students (how many rows it has), skipped
    (True when no row of it ran here) and bars: [{key, label, students: [ids, sorted]}], one per BARS.
    """
    out = []
    rows = results.get("rows", [])
    for lab in results.get("labs", []):
        for config in results.get("configs", []):
            mine = [r for r in rows if r["lab"] == lab["number"] and r["config"] == config["name"]]
            placed: dict[str, list[str]] = {key: [] for key, _ in BARS}
            for r in mine:
                key = bar_of(r)
                if key is not None:
                    placed[key].append(r["student"])
            out.append(
                {
                    "lab": lab["number"],
                    "lab_name": lab["name"],
                    "config": config["name"],
                    "students": len(mine),
                    "skipped": bool(mine) and all(bar_of(r) is None for r in mine),
                    "bars": [
                        {"key": key, "label": label, "students": sorted(placed[key])} for key, label in BARS
                    ],
                }
            )
    return out


def _tooltip(d: dict, label: str, students: list[str]) -> str:
    who = ", ".join(students[:NAMES_SHOWN])
    if len(students) > NAMES_SHOWN:
        who += f" and {len(students) - NAMES_SHOWN} more"
    return f"{d['lab_name']} on {d['config']}, {label}: {len(students)} student{'s' if len(students) != 1 else ''}: {who}"


def layout(d: dict, scale: int) -> dict:
    """One histogram's geometry: the picture's size and, for each bar with students in it, its rectangle.

    `scale` is the number of students a bar of full height stands for (the same for every histogram of
    a page). A bar with anyone in it is at least 2 pixels high, so that one student is never lost.
    """
    scale = max(scale, 1)
    bars = []
    for k, bar in enumerate(d["bars"]):
        count = len(bar["students"])
        x = BAR_GAP + k * (BAR_WIDTH + BAR_GAP)
        height = 0 if count == 0 else max(2, round(HEIGHT * count / scale))
        bars.append(
            {
                "key": bar["key"],
                "label": bar["label"],
                "count": count,
                "x": x,
                "width": BAR_WIDTH,
                "y": TOP + HEIGHT - height,
                "height": height,
                "colour": _colour(bar["key"]),
                "title": _tooltip(d, bar["label"], bar["students"]) if count else "",
            }
        )
    width = BAR_GAP + len(d["bars"]) * (BAR_WIDTH + BAR_GAP)
    return {
        "width": width,
        "height": TOP + HEIGHT + BOTTOM,
        "baseline": TOP + HEIGHT,
        "bars": bars,
        "title": f"{d['lab_name']} on {d['config']}: scores of {d['students']} students",
    }


def _colour(key: str) -> str:
    """The heat map's colours: grey for missing, red for no result, red to green as more tests pass."""
    if key == "missing":
        return "#b0b8bf"
    if key == "no-result":
        return "#d9534f"
    share = {"0": 0, "1-24": 0.125, "25-49": 0.375, "50-74": 0.625, "75-99": 0.875, "100": 1}[key]
    return f"hsl({round(120 * share)},55%,{45 if share == 1 else 55}%)"
