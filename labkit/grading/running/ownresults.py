"""A student's own results: their last `make lab-N` runs (build/lab-N/report.json), as results the class
scoreboard takes, so that `labkit scoreboard --mine` draws them the way a TA's grading run is drawn."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.course import catalog, configs
from labkit.grading.running.rows import ScoreRow, make_row
from labkit.grading.running.store import FORMAT
from labkit.grading.state import policy as policy_mod
from labkit.judge import judge
from labkit.run import execute


def student_results(build: Path, student: str = "you") -> dict:
    """Results (as the class scoreboard takes them) from build/lab-N/report.json of `make lab-N`."""
    build = Path(build)
    rows: list[ScoreRow] = []
    labs: list[catalog.Lab] = []
    seen: dict[str, configs.DeviceConfig | None] = {}  # each run's label -> its configuration
    for lab in catalog.labs():
        path = build / lab.name / "report.json"
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        labs.append(lab)
        outcomes = [
            judge.Outcome(**{k: o[k] for k in judge.Outcome.__dataclass_fields__ if k in o})
            for o in report.get("outcomes", [])
        ]
        for label, rec in report.get("runs", {}).items():
            record = execute.RunRecord.from_json(rec | {"results": {}})
            config = configs.by_name(record.config or label)
            seen.setdefault(label, config)
            mine = [o for o in outcomes if o.run == label]
            rows.append(make_row(student, lab.number, label, record, mine))
    order = list(configs.CONFIGS)
    rows.sort(key=lambda r: (r["lab"], order.index(r["config"]) if r["config"] in order else len(order)))
    names = sorted(seen, key=lambda n: order.index(n) if n in order else len(order))
    return {
        "format": FORMAT,
        "labs": [{"number": lab.number, "name": lab.name, "title": lab.title} for lab in labs],
        "configs": [
            {"name": n, "summary": c.summary if c else "", "devices": c.devices if c else None}
            for n in names
            for c in [seen[n]]
        ],
        "students": {student: {"notes": []}} if rows else {},
        "notes": [],
        "rows": rows,
        "policy": _course_policy().to_json(),
    }


def _course_policy() -> policy_mod.Policy:
    """The course's policy for a student's own scoreboard; the default where the file cannot be used."""
    try:
        return policy_mod.load()
    except policy_mod.PolicyError:
        return policy_mod.Policy()
