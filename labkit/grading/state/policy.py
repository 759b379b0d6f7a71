"""The course's grading policy: lab weights, the configurations a grade needs, and how they combine.

The policy is a TOML file kept with the tests (tests/policy.toml), so every TA grades with the same
rule::

    [grading]
    combine = "all"               # a test earns its points only if it passes on every configuration graded
    required = ["cpu-1", "cpu-8"] # no final grades where one of these cannot run

    [labs.3]
    weight = 2                    # lab 3 counts twice (default 1)

    [leaderboard]
    names = false                 # each student's leaderboards name classmates "classmate N" (true: by id)
    canvas_id = 123456            # the Canvas assignment its column updates (exports)

`combine` is one of COMBINE. A test's points come from `@check(points=...)`; a lab's points are
those its tests earn under `combine`, and a student's total is the sum of lab points times lab
weights. `grades()` is a pure function of the graded results (scoreboard.json), which carry the
policy they were graded with, so exports and regrades need no second look at the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from labkit.course import catalog, configs
from labkit.grading.state import adjustments, deadlines

DEFAULT_PATH = catalog.ROOT / "tests" / "policy.toml"
COMBINE = {
    "all": "a test earns its points only if it passes on every configuration graded",
    "any": "a test earns its points if it passes on at least one configuration graded",
    "mean": "a test earns its points times the share of configurations graded it passes on",
}
_TOP = {"grading", "labs", "late", "leaderboard"}
_LEADERBOARD = {"names"}
_GRADING = {"combine", "required", "counts"}
COUNTS_DEFAULT = "latest"
COUNTS = {
    "latest": "the last one handed in",
    "last-on-time": "the last one handed in by the due date (with the student's extension), else the latest",
}
NOT_YET = {"best": "grading every kept version and taking the one with the most points is not built yet"}
_LAB = {"weight", "title", "due", "canvas_id", "extra_credit", "counts"}
_LATE = {"per_day", "cap", "grace_minutes", "accept"}


class PolicyError(ValueError):
    """The policy file cannot be used: the message names the file and the key."""


@dataclass(frozen=True)
class Policy:
    combine: str = "all"
    required: tuple[str, ...] = ()
    weights: dict[int, float] = field(default_factory=dict)  # lab number -> weight; absent: 1
    source: str = "the kit's default policy"
    late: dict = field(
        default_factory=dict
    )  # per_day, cap, grace_minutes (see labkit/grading/state/deadlines.py)
    due: dict[int, str] = field(default_factory=dict)  # lab number -> ISO 8601 due date
    canvas: dict[int, int] = field(default_factory=dict)  # lab number -> Canvas assignment id (exports)
    names: bool = (
        False  # [leaderboard] names: students see classmates' ids on the leaderboards (else "classmate N")
    )
    extra: dict[int, float] = field(default_factory=dict)  # lab -> points an override may give above its own
    counts: dict[int, str] = field(default_factory=dict)  # lab -> which submission counts; absent: `counted`
    counted: str = COUNTS_DEFAULT  # [grading] counts: the course's rule (labkit/grading/intake/counted.py)

    def weight(self, lab: int) -> float:
        return self.weights.get(lab, 1)

    def counts_for(self, lab: int) -> str:
        """Which of a student's submissions of `lab` counts: latest, last-on-time or best."""
        return self.counts.get(lab, self.counted)

    def to_json(self) -> dict:
        return (
            {
                "combine": self.combine,
                "required": list(self.required),
                "weights": {str(k): v for k, v in sorted(self.weights.items())},
                "source": self.source,
                "late": dict(self.late),
                "due": {str(k): v for k, v in sorted(self.due.items())},
                "canvas": {str(k): v for k, v in sorted(self.canvas.items())},
                "leaderboard": {"names": self.names},
            }
            | ({"extra_credit": {str(k): v for k, v in sorted(self.extra.items())}} if self.extra else {})
            | (
                {"counts": {"course": self.counted} | {str(k): v for k, v in sorted(self.counts.items())}}
                if self.counts or self.counted != COUNTS_DEFAULT
                else {}
            )
        )

    @classmethod
    def from_json(cls, data: dict | None) -> Policy:
        if not data:
            return cls()
        return cls(
            combine=data.get("combine", "all"),
            required=tuple(data.get("required", ())),
            weights={int(k): v for k, v in data.get("weights", {}).items()},
            source=data.get("source", ""),
            late=dict(data.get("late", {})),
            due={int(k): v for k, v in data.get("due", {}).items()},
            canvas={int(k): v for k, v in data.get("canvas", {}).items()},
            names=data.get("leaderboard", {}).get("names") is True,
            extra={int(k): v for k, v in data.get("extra_credit", {}).items()},
            counts={int(k): v for k, v in data.get("counts", {}).items() if k != "course"},
            counted=data.get("counts", {}).get("course", COUNTS_DEFAULT),
        )


def _unknown(where: str, keys, allowed: set[str], path) -> None:
    extra = sorted(set(keys) - allowed)
    if extra:
        raise PolicyError(
            f"{path}: unknown key{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} "
            f"in {where} (known: {', '.join(sorted(allowed))})"
        )


def _number(value, what: str, path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(f"{path}: {what} must be a number, got {value!r}")
    if value < 0:
        raise PolicyError(f"{path}: {what} must not be negative, got {value!r}")
    return value


def parse(text: str, path: str | Path = "policy.toml", known_labs: list[int] | None = None) -> Policy:
    """A policy from TOML text; PolicyError names `path` and the key for anything it cannot use."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{path}: not valid TOML ({e})") from None
    _unknown("the file", data, _TOP, path)
    combine, required = _grading(data.get("grading", {}), path)
    counted = _counts(data.get("grading", {}).get("counts", COUNTS_DEFAULT), "[grading] counts", path)
    known = known_labs if known_labs is not None else [lab.number for lab in catalog.labs()]
    weights, due, canvas, extra = _labs(data.get("labs", {}), known, path)
    counts = {
        int(k): _counts(t["counts"], f"[labs.{k}] counts", path)
        for k, t in data.get("labs", {}).items()
        if isinstance(t, dict) and "counts" in t
    }
    late = _late(data.get("late", {}), path)
    board = data.get("leaderboard", {})
    if not isinstance(board, dict):
        raise PolicyError(f"{path}: [leaderboard] must be a table, e.g. names = false")
    _unknown("[leaderboard]", board, _LEADERBOARD, path)
    names = board.get("names", False)
    if not isinstance(names, bool):
        raise PolicyError(f"{path}: [leaderboard] names must be true or false, got {names!r}")
    return Policy(
        combine=combine,
        required=tuple(required),
        weights=weights,
        source=str(path),
        late=late,
        due=due,
        canvas=canvas,
        names=names,
        extra=extra,
        counts=counts,
        counted=counted,
    )


def _counts(value, where: str, path) -> str:
    """Which of a student's submissions counts: one of COUNTS."""
    if not isinstance(value, str):
        raise PolicyError(f"{path}: {where} must be one of {', '.join(COUNTS)}, got {value!r}")
    if value in NOT_YET:
        raise PolicyError(f"{path}: {where} = {value!r}: {NOT_YET[value]}; use one of {', '.join(COUNTS)}")
    if value not in COUNTS:
        raise PolicyError(f"{path}: {where} = {value!r} is not one of {', '.join(COUNTS)}")
    return str(value)


def _grading(grading, path) -> tuple[str, list[str]]:
    """[grading]: how a test's outcomes on the configurations combine, and the configurations required."""
    if not isinstance(grading, dict):
        raise PolicyError(f"{path}: [grading] must be a table")
    _unknown("[grading]", grading, _GRADING, path)
    combine = grading.get("combine", "all")
    if combine not in COMBINE:
        raise PolicyError(f"{path}: [grading] combine = {combine!r} is not one of {', '.join(COMBINE)}")
    required = grading.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise PolicyError(f"{path}: [grading] required must be a list of configuration names")
    for name in required:
        if name not in configs.CONFIGS:
            raise PolicyError(
                f"{path}: [grading] required names the unknown configuration {name!r} "
                f"(known: {', '.join(configs.CONFIGS)})"
            )
    return combine, required


def _labs(
    labs, known: list[int], path
) -> tuple[dict[int, float], dict[int, str], dict[int, int], dict[int, float]]:
    """[labs.N]: each lab's weight, due date, Canvas assignment and extra credit, by lab number."""
    extra: dict[int, float] = {}
    weights: dict[int, float] = {}
    due: dict[int, str] = {}
    canvas: dict[int, int] = {}
    if not isinstance(labs, dict):
        raise PolicyError(f"{path}: [labs] must be a table of [labs.N] tables")
    for key, table in labs.items():
        if not str(key).isdigit() or int(key) not in known:
            raise PolicyError(
                f"{path}: [labs.{key}] names no lab of this course (labs: {', '.join(map(str, known))})"
            )
        if not isinstance(table, dict):
            raise PolicyError(f"{path}: [labs.{key}] must be a table, e.g. weight = 1")
        _unknown(f"[labs.{key}]", table, _LAB, path)
        if "weight" in table:
            weights[int(key)] = _number(table["weight"], f"[labs.{key}] weight", path)
        if "extra_credit" in table:  # the points a TA's override may give above the lab's own, by name
            extra[int(key)] = _number(table["extra_credit"], f"[labs.{key}] extra_credit", path)
        if "canvas_id" in table:
            value = table["canvas_id"]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise PolicyError(
                    f"{path}: [labs.{key}] canvas_id must be the assignment's number in Canvas, got {value!r}"
                )
            canvas[int(key)] = value
        if "due" in table:
            value = table["due"]
            if not hasattr(value, "isoformat") or not hasattr(value, "tzinfo") or value.tzinfo is None:
                raise PolicyError(
                    f"{path}: [labs.{key}] due must be a date and time with its offset, "
                    f"e.g. 2026-03-01T23:59:00Z; got {value!r}"
                )
            due[int(key)] = value.isoformat()
    return weights, due, canvas, extra


def _late(late, path) -> dict:
    """[late]: the penalty per day and its cap (fractions of the points), and the time sources accepted."""
    if not isinstance(late, dict):
        raise PolicyError(f"{path}: [late] must be a table")
    _unknown("[late]", late, _LATE, path)
    accept = late.get("accept")
    out: dict = {k: _number(v, f"[late] {k}", path) for k, v in late.items() if k != "accept"}
    if accept is not None:
        out["accept"] = _accepted_sources(accept, path)
    for k in ("per_day", "cap"):
        if out.get(k, 0) > 1:
            raise PolicyError(f"{path}: [late] {k} is a fraction of the points, at most 1; got {out[k]!r}")
    return out


def _accepted_sources(accept, path) -> list[str]:
    """[late] accept: the submission-time sources a late penalty may count from (labkit/grading/state/deadlines.py)."""
    if not isinstance(accept, list) or not all(isinstance(a, str) for a in accept):
        raise PolicyError(
            f"{path}: [late] accept must be a list of time sources, e.g. {list(deadlines.ACCEPT_DEFAULT)}"
        )
    for name in accept:
        if name in deadlines.NEVER_ACCEPTED:
            raise PolicyError(
                f"{path}: [late] accept names {name!r}, which a late penalty can never count from: "
                f"{deadlines.NEVER_ACCEPTED[name]}"
            )
        if name not in deadlines.SOURCES:
            raise PolicyError(
                f"{path}: [late] accept names the unknown time source {name!r} (known: "
                f"{', '.join(s for s in deadlines.SOURCES if s not in deadlines.NEVER_ACCEPTED)})"
            )
    return list(accept)


def load(path: Path | None = None) -> Policy:
    """The policy in `path`, or tests/policy.toml when there is one, or the default (combine all, weight 1)."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return Policy()
        path = DEFAULT_PATH
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(f"{path}: cannot be read ({e.strerror or e})") from None
    shown = path.relative_to(catalog.ROOT) if path.resolve().is_relative_to(catalog.ROOT) else path
    return parse(text, shown)


def check_required(policy: Policy, chosen: list[str]) -> str:
    """Refuse final grades when a configuration the policy requires cannot run here (PolicyError).

    One that runs here but that --configs leaves out gives provisional grades: the reason is
    returned ("" for final grades), carried in the results, and stated wherever the grades are shown;
    LMS exports refuse them.
    """
    left_out = []
    for name in policy.required:
        ok, reason = configs.CONFIGS[name].availability()
        if not ok:
            raise PolicyError(
                f"{policy.source} requires {name}, which cannot run here ({reason}): no final "
                "grades without it; grade on a machine that has it"
            )
        if name not in chosen:
            left_out.append(name)
    if left_out:
        return f"provisional: {policy.source} requires {', '.join(left_out)}, which --configs left out"
    return ""


# ----------------------------------------------------------------------------------------
# From graded results to points: pure functions of scoreboard.json-shaped data.
# ----------------------------------------------------------------------------------------


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 4)


def lab_tests(rows: list[dict]) -> dict[int, dict[str, dict]]:
    """lab -> test -> {points, hidden, configs it ran on}: what a lab is worth, from the reference's rows."""
    out: dict[int, dict[str, dict]] = {}
    for r in rows:
        for t in r.get("tests", []):
            entry = out.setdefault(r["lab"], {}).setdefault(
                t["test"], {"points": t.get("points", 1), "hidden": t.get("hidden", False), "configs": []}
            )
            if t["status"] != "skipped" and r["config"] not in entry["configs"]:
                entry["configs"].append(r["config"])
    return out


def rule(policy: Policy, config_names: list[str]) -> str:
    weights = ", ".join(f"lab {n} x{_num(w)}" for n, w in sorted(policy.weights.items()))
    return (
        f"{COMBINE[policy.combine]} ({', '.join(config_names) or 'none'}); total = the sum of lab points "
        f"times lab weights ({weights or 'every lab x1'}); policy: {policy.source}"
    )


def lab_points(policy: Policy, tests: dict[str, dict], rows: dict[str, dict]) -> tuple[float, float]:
    """(points earned, points possible) of one student's lab: `rows` maps a configuration to its row."""
    possible = sum(t["points"] for t in tests.values() if t["configs"])
    earned = 0.0
    for name, t in tests.items():
        where = t["configs"]
        if not where:
            continue
        passed = []
        for config in where:
            row = rows.get(config)
            mine = next((u for u in (row or {}).get("tests", []) if u["test"] == name), None)
            passed.append(bool(mine and mine["status"] == "passed"))
        if policy.combine == "all":
            earned += t["points"] if all(passed) else 0
        elif policy.combine == "any":
            earned += t["points"] if any(passed) else 0
        else:
            earned += t["points"] * sum(passed) / len(passed)
    return _num(earned), _num(possible)


def _with_test_overrides(rows: dict[str, dict], changes: dict[str, str]) -> dict[str, dict]:
    """The rows with the overridden tests' outcomes changed on every configuration they ran on."""
    if not changes:
        return rows
    out = {}
    for config, row in rows.items():
        tests = [
            t | {"status": changes[t["test"]]} if t["test"] in changes and t["status"] != "skipped" else t
            for t in row.get("tests", [])
        ]
        out[config] = row | {"tests": tests}
    return out


@dataclass
class _TAInputs:
    """What a TA changed, by (student, lab): tests overridden, points set, each override's comment, adjustments
    and rubric items (by lab), and extensions (by student, then lab)."""

    test_changes: dict[tuple[str, int], dict[str, str]] = field(default_factory=dict)
    set_points: dict[tuple[str, int], dict] = field(default_factory=dict)
    comments: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    adjusted: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    items: dict = field(default_factory=dict)
    extensions: dict = field(default_factory=dict)

    @classmethod
    def of(cls, results: dict) -> _TAInputs:
        inputs = cls(
            items=adjustments.items_of(results.get("adjustments", [])),
            extensions=results.get("extensions", {}),
        )
        for o in results.get("overrides", []):
            key = (o["student"], o["lab"])
            if "test" in o:
                inputs.test_changes.setdefault(key, {})[o["test"]] = o["status"]
            else:
                inputs.set_points[key] = o
            inputs.comments.setdefault(key, []).append(o.get("comment") or "overridden")
        for a in results.get("adjustments", []):
            inputs.adjusted.setdefault((a["student"], a["lab"]), []).append(a)
        return inputs


def grades(results: dict) -> dict:
    """Each student's points per lab and total, under the policy the results carry, and the rule that made them.

    A lab's possible points come from the reference's tests (results' labs[].tests); results without
    them (a student's own runs) use the tests in the student's rows. Then, in order: a TA's test
    overrides change outcomes before the rule combines them, a late penalty (due dates, [late],
    extensions, counted only from a time source that [late] accept lists) takes its share, and a
    TA's points override sets the lab's points, and last a TA's adjustments and rubric items
    (labkit/grading/state/adjustments.py) add theirs. Overridden, adjusted and late labs say so, and each
    lab names the source of its submission time.
    """
    policy = Policy.from_json(results.get("policy"))
    config_names = [c["name"] for c in results.get("configs", [])]
    rows: dict[tuple[str, int], dict[str, dict]] = {}
    for r in results.get("rows", []):
        rows.setdefault((r["student"], r["lab"]), {})[r["config"]] = r
    inputs = _TAInputs.of(results)
    provisional = results.get("provisional", "")
    out = {
        "rule": (
            provisional.upper().split(":")[0] + ":" + provisional.split(":", 1)[1] + "; "
            if provisional
            else ""
        )
        + rule(policy, config_names),
        "combine": policy.combine,
        "provisional": provisional,
        "students": {},
    }
    for student in sorted(results.get("students", {})):
        labs, total, possible = {}, 0.0, 0.0
        handed = results["students"][student].get("submissions", {})
        for lab in results.get("labs", []):
            entry, most = _lab_entry(policy, lab, student, rows, inputs, handed.get(str(lab["number"])))
            labs[str(lab["number"])] = entry
            total += policy.weight(lab["number"]) * entry["points"]
            possible += policy.weight(lab["number"]) * most
        out["students"][student] = {"labs": labs, "points": _num(total), "max_points": _num(possible)}
    return out


def _lab_entry(
    policy: Policy, lab: dict, student: str, rows: dict, inputs: _TAInputs, handed
) -> tuple[dict, float]:
    """One student's entry for one lab, and the points it could have earned (`grades` says in which order the
    TA's inputs apply)."""
    number, key = lab["number"], (student, lab["number"])
    mine = _with_test_overrides(rows.get(key, {}), inputs.test_changes.get(key, {}))
    tests = lab.get("tests") or lab_tests(list(mine.values())).get(number, {})
    earned, most = lab_points(policy, tests, mine)
    statuses = {r["status"] for r in mine.values()}
    status = "missing" if not mine or statuses == {"missing"} else "graded"
    entry: dict = {
        "points": earned,
        "max_points": most,
        "weight": _num(policy.weight(number)),
        "status": status,
    }
    charged = deadlines.charge(
        handed,
        policy.due.get(number),
        policy.late,
        inputs.extensions.get(student, {}).get(str(number), 0),
    )
    entry.update(charged)
    if charged.get("late_days"):
        entry.update(
            points=_num(earned * (1 - charged["late_penalty"])),
            late_penalty=_num(charged["late_penalty"]),
        )
    if key in inputs.set_points:
        entry["points"] = _num(inputs.set_points[key]["points"])
    if key in inputs.comments:
        entry["overridden"] = "; ".join(inputs.comments[key])
    if key in inputs.adjusted or number in inputs.items:
        entry.update(
            adjustments.applied(
                entry["points"], most, inputs.adjusted.get(key, []), inputs.items.get(number, {})
            )
        )
        entry["points"], most = _num(entry["points"]), _num(entry["max_points"])
    return entry, most
