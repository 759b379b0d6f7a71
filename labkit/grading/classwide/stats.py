"""Final points, class-wide: per lab and per section, the mean, median, spread and distribution.

Final points are those grades.csv gives (labkit/grading/state/policy.py's `grades`: the rule, late
penalties, overrides and a TA's adjustments), so these say how the class did, not how its tests
ran. A student's section is the roster's `section` column (labkit/grading/state/roster.py); without one
the class is a single group. Nothing here names a student: the same data draws the TA's pages and
the anonymised class page shown in lecture (class-anonymous.html).
"""

from __future__ import annotations

import statistics

from labkit.grading.classwide.results import labs_of
from labkit.grading.state import policy

BINS = 10  # the distribution: shares of the possible points, 0-10%, 10-20%, ..., 90-100%
NO_SECTION = "no section"


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 2)


def summary(points: list[float], most: float) -> dict:
    """mean, median, standard deviation, lowest and highest of `points` (of `most` possible), and how many fall in
    each tenth of `most` (the last tenth includes full points)."""
    if not points:
        return {
            "students": 0,
            "max_points": _num(most),
            "mean": None,
            "median": None,
            "stdev": None,
            "low": None,
            "high": None,
            "bins": [0] * BINS,
        }
    bins = [0] * BINS
    for p in points:
        share = p / most if most else 0
        bins[max(0, min(BINS - 1, int(share * BINS)))] += 1
    return {
        "students": len(points),
        "max_points": _num(most),
        "mean": _num(statistics.fmean(points)),
        "median": _num(statistics.median(points)),
        "stdev": _num(statistics.pstdev(points)),
        "low": _num(min(points)),
        "high": _num(max(points)),
        "bins": bins,
    }


def sections_of(results: dict) -> dict[str, list[str]]:
    """section -> its students, from the roster's `section` column; {} when no student has one."""
    students = results.get("students", {})
    if not any(info.get("section") for info in students.values()):
        return {}
    out: dict[str, list[str]] = {}
    for s in sorted(students):
        out.setdefault(students[s].get("section") or NO_SECTION, []).append(s)
    return dict(sorted(out.items()))


def final_points(results: dict, grades: dict | None = None) -> dict:
    """Per lab (and the total), for the class and for each section: `summary` of the students' final points."""
    grades = grades or policy.grades(results)
    by = grades["students"]

    def groups(students: list[str]) -> list[dict]:
        out = []
        for lab in labs_of(results):
            key = str(lab["number"])
            points = [by[s]["labs"][key]["points"] for s in students if s in by]
            most = max((by[s]["labs"][key]["max_points"] for s in students if s in by), default=0)
            out.append({"lab": lab["number"], "name": lab["name"]} | summary(points, most))
        totals = [by[s]["points"] for s in students if s in by]
        out.append(
            {"lab": "total", "name": "total"}
            | summary(totals, max((by[s]["max_points"] for s in students if s in by), default=0))
        )
        return out

    return {
        "bins": BINS,
        "rule": grades["rule"],
        "class": groups(sorted(by)),
        "sections": [
            {"section": name, "students": len(members), "labs": groups(members)}
            for name, members in sections_of(results).items()
        ],
    }


def bin_labels() -> list[str]:
    step = 100 // BINS
    return [f"{i * step}–{(i + 1) * step}%" for i in range(BINS)]
