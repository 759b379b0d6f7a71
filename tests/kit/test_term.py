"""A term of a course, as one test: a class of 30 graded the way docs/grading.md says, again and again.

The class hands in lab 3 through a Gradescope export: right, wrong (the handout as it came), right on
one device only, late with and without an extension, overridden, a group of two, missing, malformed,
hostile. The TA gives a roster, a policy with a due date and a late rule, overrides, extensions and
adjustments once, in the first run of the guide's command (`make grade LABS=3`, every configuration
here; the whole-class crash over every lab has its own test in test_feedback.py). Then the term goes on with no flag but the one that changes: a resubmission and
an override added a week later, a unit that timed out under load kept as it was until `RETRY=1`,
and the class sharded in two and merged in both orders.

At every step the final `grades.csv` must equal the grades this module computes itself from the
rules the guide states (the tests each run passed, the policy's rule, the late penalty, the
extension, the override, the adjustments), and every student's feedback must show each lab's
points and late penalty. The outcomes themselves are held to what each submission is: the right
ones get everything, the wrong and the hostile ones nothing, the one-device design fails on eight.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = 3
REFERENCE = json.loads((ROOT / "reference" / f"lab-{LAB}.ipynb").read_text())
HANDOUT = json.loads((ROOT / "labs" / f"lab-{LAB}.ipynb").read_text())
ADVERSARIAL = ROOT / "tests" / "kit" / "adversarial"
ONE_DEVICE_MESH = (
    'Mesh(np.array(jax.devices()), ("data",))\n    double',
    'Mesh(np.array(jax.devices()[:1]), ("data",))\n    double',
)
DUE = "2026-03-01T23:59:00-08:00"
LATE = {"per_day": 0.1, "cap": 0.5, "grace_minutes": 15}
ON_TIME = "2026-03-01 10:00:00.000000000 -08:00"
TWO_DAYS_LATE = "2026-03-03 10:00:00.000000000 -08:00"


# ----------------------------------------------------------------------------------------
# The class.
# ----------------------------------------------------------------------------------------


def code(nb: dict) -> dict:
    return json.loads(json.dumps(nb))


def replaced(nb: dict, old: str, new: str) -> dict:
    nb = code(nb)
    hits = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and old in "".join(cell["source"]):
            cell["source"] = "".join(cell["source"]).replace(old, new)
            hits += 1
    assert hits, f"the reference no longer holds {old!r}"
    return nb


def with_cell(nb: dict, source: str) -> dict:
    """The handout with one cell added right after its exercise cell (tests/kit/adversarial/README.md)."""
    nb = code(nb)
    at = next(i for i, c in enumerate(nb["cells"]) if "def shard_map_double" in "".join(c["source"]))
    nb["cells"].insert(
        at + 1,
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source},
    )
    return nb


RIGHT = REFERENCE
WRONG = HANDOUT  # the exercise not written: every test `todo`
ONE_DEVICE = replaced(REFERENCE, *ONE_DEVICE_MESH)
FORGED = with_cell(HANDOUT, (ADVERSARIAL / "forge_host_data.py").read_text())
THIEF = with_cell(HANDOUT, (ADVERSARIAL / "steal_the_key.py").read_text())

# student -> (what they hand in first, when); None: nothing. Groups and resubmissions below.
KIND = {
    **{f"s{i:02d}": "right" for i in range(1, 9)},
    "s09": "wrong",
    "s10": "wrong",
    "s11": "wrong",
    "s12": "one-device",
    "s13": "one-device",
    "s14": "one-device",
    "s15": "late",
    "s16": "late-extended",
    "s17": "overridden",
    "s18": "group",
    "s19": "group",
    "s20": "missing",
    "s21": "missing",
    "s22": "missing",
    "s23": "not-json",
    "s24": "empty",
    "s25": "forged",
    "s26": "thief",
    "s27": "resubmits",
    "s28": "timed-out",
    "s29": "right",
    "s30": "right",
}
STUDENTS = sorted(KIND)


def notebook_of(kind: str) -> dict | bytes | None:
    return {
        "right": RIGHT,
        "late": RIGHT,
        "late-extended": RIGHT,
        "group": RIGHT,
        "timed-out": RIGHT,
        "wrong": WRONG,
        "resubmits": WRONG,
        "one-device": ONE_DEVICE,
        "overridden": ONE_DEVICE,
        "forged": FORGED,
        "thief": THIEF,
        "not-json": b"this is not a notebook {",
        "empty": b"",
        "missing": None,
    }[kind]


def sid(student: str) -> str:
    return str(9000 + int(student[1:]))


def roster_csv() -> str:
    lines = ["student,name,email,lms_id,section"]
    lines += [f"{s},Student {s[1:]},{s}@u.edu,{sid(s)},{'A' if int(s[1:]) % 2 else 'B'}" for s in STUDENTS]
    return "\n".join(lines) + "\n"


def policy_toml() -> str:
    text = (ROOT / "tests" / "policy.toml").read_text()
    return (
        text + f"\n[labs.{LAB}]\ndue = {DUE}\n\n[late]\n" + "".join(f"{k} = {v}\n" for k, v in LATE.items())
    )


OVERRIDES = "student,lab,points,test,status,comment\ns17,3,{points},,,regraded by hand after the dispute\n"
EXTENSIONS = "student,lab,days\ns16,3,3\n"
ADJUSTMENTS = (
    "student,lab,points,comment,item,max\n"
    "s01,3,-1,the explanation swaps the mesh axes,,\n"
    "s02,3,0.5,a clear explanation of the all-gather,,\n"
)


def ta_inputs() -> dict[str, str]:
    """Every input the TA gives in week 1, by the file name it is handed in: what a run keeps in OUT/course."""
    return {
        "roster.csv": roster_csv(),
        "policy.toml": policy_toml(),
        "overrides.csv": OVERRIDES.format(points=4),
        "extensions.csv": EXTENSIONS,
        "adjustments.csv": ADJUSTMENTS,
    }


def export(path: Path, *, week: int) -> Path:
    """A Gradescope export of lab 3: one submission folder per hand-in, with its submitters and time."""
    meta, files = [], {}
    n = 100
    for student in STUDENTS:
        kind = KIND[student]
        if kind in ("missing",) or (kind == "group" and student != "s18"):
            continue
        n += 1
        submitters = ["s18", "s19"] if kind == "group" else [student]
        when = TWO_DAYS_LATE if kind in ("late", "late-extended") else ON_TIME
        nb = notebook_of(kind)
        if kind == "resubmits" and week == 2:  # a week later, a right version handed in on time
            nb, when = RIGHT, "2026-03-01 20:00:00.000000000 -08:00"
        folder = f"submission_{n}"
        meta.append(
            f"{folder}:\n  :submitters:\n"
            + "".join(
                f"  - :name: Student {p[1:]}\n    :sid: '{sid(p)}'\n    :email: {p}@u.edu\n"
                for p in submitters
            )
            + f"  :created_at: {when}\n"
        )
        files[f"{folder}/lab-{LAB}.ipynb"] = nb if isinstance(nb, bytes) else json.dumps(nb)
    files["submission_metadata.yml"] = "".join(meta)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


# ----------------------------------------------------------------------------------------
# Running the kit as a TA does.
# ----------------------------------------------------------------------------------------


def make(*args: str, timeout: float = 3000) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="160", NO_COLOR="1")
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return done


def kit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="160", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "labkit", *args],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def said(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}"


def grades_of(out: Path) -> dict[tuple[str, str], dict]:
    text = (out / "grades.csv").read_text()
    return {(r["student"], r["lab"]): r for r in csv.DictReader(io.StringIO(text))}


# ----------------------------------------------------------------------------------------
# The grades, computed here from the rules the guide states.
# ----------------------------------------------------------------------------------------


def late_days(submitted: str, extension: float) -> int:
    """Whole days (or part of one) past the due date and the extension, as the guide's late policy counts."""
    day, clock, zone = submitted.split(" ")  # Gradescope's `2026-03-03 10:00:00.000000000 -08:00`
    when = datetime.fromisoformat(f"{day}T{clock[:8]}{zone}")
    over = when - (datetime.fromisoformat(DUE) + timedelta(days=extension))
    if over <= timedelta(minutes=LATE["grace_minutes"]):
        return 0
    return math.ceil(over / timedelta(days=1))


def expected_grades(
    results: dict, *, overrides: dict, extensions: dict, adjustments: list[tuple], submitted: dict
) -> dict[str, float]:
    """Each student's total under the course's rule, from the rows' test outcomes alone."""
    totals: dict[str, float] = {}
    rows = {(r["student"], r["lab"], r["config"]): r for r in results["rows"]}
    for student in STUDENTS:
        total = 0.0
        for graded in results["labs"]:
            lab, earned = graded["number"], 0.0
            for test, about in graded[
                "tests"
            ].items():  # each test: its points, and the configurations it runs on
                outcomes = [
                    next(
                        (t["status"] for t in rows[student, lab, config]["tests"] if t["test"] == test), None
                    )
                    if (student, lab, config) in rows
                    else None
                    for config in about["configs"]
                ]
                if outcomes and all(o == "passed" for o in outcomes):  # the course's rule: passed everywhere
                    earned += about["points"]
            if lab == LAB and student in submitted:
                days = late_days(submitted[student], extensions.get(student, 0))
                if days:
                    earned *= 1 - min(LATE["per_day"] * days, LATE["cap"])
            if (student, lab) in overrides:
                earned = overrides[student, lab]
            earned += sum(p for s, n, p in adjustments if (s, n) == (student, lab))
            total += max(earned, 0.0)
        totals[student] = total
    return totals


def submitted_times(week: int) -> dict[str, str]:
    times = {}
    for student, kind in KIND.items():
        if kind == "missing":
            continue
        times[student] = TWO_DAYS_LATE if kind in ("late", "late-extended") else ON_TIME
        if kind == "resubmits" and week == 2:
            times[student] = "2026-03-01 20:00:00.000000000 -08:00"
    return times


# ----------------------------------------------------------------------------------------
# The term.
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    """The whole term in order; each step's output folder (copied) and what the TA gave up to then."""
    base = tmp_path_factory.mktemp("term")
    inputs = base / "inputs"
    inputs.mkdir()
    (inputs / "roster.csv").write_text(roster_csv())
    (inputs / "policy.toml").write_text(policy_toml())
    (inputs / "extensions.csv").write_text(EXTENSIONS)
    (inputs / "adjustments.csv").write_text(ADJUSTMENTS)
    (inputs / "overrides.csv").write_text(OVERRIDES.format(points=4))
    week1, week2 = export(base / "week1.zip", week=1), export(base / "week2.zip", week=2)
    out = base / "scoreboard"
    steps = {}

    # Week 1: the default command, every input given once.
    first = make(
        "grade",
        f"LABS={LAB}",
        f"SUBMISSIONS={week1}",
        f"OUT={out}",
        f"ROSTER={inputs / 'roster.csv'}",
        f"POLICY={inputs / 'policy.toml'}",
        f"OVERRIDES={inputs / 'overrides.csv'}",
        f"EXTENSIONS={inputs / 'extensions.csv'}",
        f"ADJUSTMENTS={inputs / 'adjustments.csv'}",
    )
    steps["week 1"] = (first, snapshot(out, base / "after-week-1"))

    # Week 2: a resubmission in a new export, and one more override; no other flag.
    (inputs / "overrides-2.csv").write_text(
        OVERRIDES.format(points=4) + "s12,3,2,,,partial credit: the idea was right\n"
    )
    second = make(
        "grade",
        f"LABS={LAB}",
        f"SUBMISSIONS={week2}",
        f"OUT={out}",
        f"OVERRIDES={inputs / 'overrides-2.csv'}",
    )
    steps["week 2"] = (second, snapshot(out, base / "after-week-2"))

    # A unit that timed out under load: kept as it was by a plain regrade, graded again by RETRY=1.
    for kept in (out / "units").rglob("*.json"):
        if "s28" in kept.parts and not kept.name.endswith(".run.json"):
            data = json.loads(kept.read_text())
            data["row"] |= {
                "status": "timeout",
                "passed": 0,
                "points": 0,
                "message": "the notebook did not finish within 120 s",
                "tests": [t | {"status": "timeout"} for t in data["row"]["tests"]],
            }
            kept.write_text(json.dumps(data))
    plain = make("grade", f"LABS={LAB}", f"SUBMISSIONS={week2}", f"OUT={out}")
    steps["plain regrade"] = (plain, snapshot(out, base / "after-plain-regrade"))
    retried = make("grade", f"LABS={LAB}", f"SUBMISSIONS={week2}", f"OUT={out}", "RETRY=1")
    steps["retry"] = (retried, snapshot(out, base / "after-retry"))
    return base, inputs, steps, week2


def snapshot(out: Path, to: Path) -> Path:
    """A copy of a grading output as it stood (the warm server's socket, a run's own, left out)."""
    return shutil.copytree(out, to, ignore=shutil.ignore_patterns(".warm"))


def results_of(out: Path) -> dict:
    return json.loads((out / "scoreboard.json").read_text())


def check_grades(out: Path, *, week: int, overrides: dict) -> None:
    results = results_of(out)
    want = expected_grades(
        results,
        overrides=overrides,
        extensions={"s16": 3},
        adjustments=[("s01", LAB, -1.0), ("s02", LAB, 0.5)],
        submitted=submitted_times(week),
    )
    got = grades_of(out)
    wrong = {
        s: (float(got[s, "total"]["points"]), want[s])
        for s in STUDENTS
        if not math.isclose(float(got[s, "total"]["points"]), want[s], abs_tol=1e-6)
    }
    assert not wrong, f"grades.csv's totals differ from the rules' (got, expected): {wrong}"


def test_every_run_of_the_term_ends_with_exit_status_0(term):
    _, _, steps, _ = term
    for name, (done, _) in steps.items():
        assert done.returncode == 0, f"{name}: {said(done)}"


def test_the_guides_command_grades_the_lab_and_writes_every_students_feedback(term):
    _, _, steps, _ = term
    out = steps["week 1"][1]
    results = results_of(out)
    labs = {lab["number"] for lab in results["labs"]}
    assert labs == {LAB}, labs
    for student in STUDENTS:
        for kind in ("md", "html"):
            assert (out / "feedback" / f"{student}.{kind}").is_file(), (student, kind)


def test_each_submission_gets_what_it_is_worth(term):
    _, _, steps, _ = term
    results = results_of(steps["week 1"][1])
    rows = {(r["student"], r["config"]): r for r in results["rows"] if r["lab"] == LAB}
    for student, kind in KIND.items():
        one, eight = rows[student, "cpu-1"], rows[student, "cpu-8"]
        if kind in ("right", "late", "late-extended", "group", "timed-out"):
            assert (one["status"], eight["status"]) == ("ok", "ok"), (
                student,
                one["message"],
                eight["message"],
            )
            assert one["passed"] == one["total"] and eight["passed"] == eight["total"]
        elif kind in ("one-device", "overridden"):
            assert one["status"] == "ok" and eight["status"] == "failed", (student, eight["message"])
        elif kind in ("wrong", "resubmits", "forged", "thief"):
            assert one["points"] == eight["points"] == 0, (student, kind, one["points"], eight["points"])
        elif kind in ("not-json", "empty"):
            assert one["status"] == eight["status"] == "error", (student, one["status"])
        elif kind == "missing":
            assert one["status"] == eight["status"] == "missing"


def test_the_groups_partner_is_credited_with_a_note(term):
    _, _, steps, _ = term
    results = results_of(steps["week 1"][1])
    rows = {(r["student"], r["config"]): r for r in results["rows"] if r["lab"] == LAB}
    assert rows["s19", "cpu-8"]["status"] == "ok", rows["s19", "cpu-8"]["message"]
    notes = results["students"]["s19"].get("notes", []) + rows["s19", "cpu-1"].get("notes", [])
    assert any("s18" in n for n in notes), notes


def test_week_1_grades_are_the_rules_grades(term):
    _, _, steps, _ = term
    check_grades(steps["week 1"][1], week=1, overrides={("s17", LAB): 4.0})


def test_week_2_keeps_every_input_it_was_not_given_and_takes_the_new_one(term):
    _, _, steps, _ = term
    done, out = steps["week 2"]
    check_grades(out, week=2, overrides={("s17", LAB): 4.0, ("s12", LAB): 2.0})
    got = grades_of(out)
    assert float(got["s15", str(LAB)]["late_penalty"]) == pytest.approx(0.2)  # the policy kept
    assert got["s16", str(LAB)]["late_penalty"] in ("", "0")  # the extension kept
    assert (
        "the explanation swaps the mesh axes" in got["s01", str(LAB)]["adjustments"]
    )  # the adjustments kept
    assert "s21" in {s for s, _ in got}  # the roster kept: a student with nothing handed in is still listed
    assert "overrides" in done.stdout + done.stderr  # the run says what changed


def test_a_resubmission_replaces_the_first_version(term):
    _, _, steps, _ = term
    before = grades_of(steps["week 1"][1])["s27", str(LAB)]
    after = grades_of(steps["week 2"][1])["s27", str(LAB)]
    assert float(before["points"]) == 0 and float(after["points"]) == float(after["max_points"]), (
        before,
        after,
    )


def test_a_timeout_stays_until_a_retry_grades_it_again(term):
    _, _, steps, _ = term
    plain = {
        r["config"]: r["status"]
        for r in results_of(steps["plain regrade"][1])["rows"]
        if r["student"] == "s28" and r["lab"] == LAB
    }
    retried = {
        r["config"]: r["status"]
        for r in results_of(steps["retry"][1])["rows"]
        if r["student"] == "s28" and r["lab"] == LAB
    }
    assert set(plain.values()) == {"timeout"}, plain
    assert set(retried.values()) == {"ok"}, retried
    check_grades(steps["retry"][1], week=2, overrides={("s17", LAB): 4.0, ("s12", LAB): 2.0})


def test_every_students_feedback_shows_each_labs_points_and_late_penalty(term):
    _, _, steps, _ = term
    out = steps["retry"][1]
    got = grades_of(out)
    for student in STUDENTS:
        text = (out / "feedback" / f"{student}.md").read_text()
        for lab in (LAB,):
            row = got[student, str(lab)]
            assert f"Points: {row['points']}/{row['max_points']}" in text, (student, lab)
    assert "Late policy" in (out / "feedback" / "s15.md").read_text()


def test_the_class_sharded_and_merged_in_either_order_is_the_single_runs_scoreboard(term):
    base, _, steps, week2 = term
    single = steps["retry"][1]
    parts = []
    for i in (1, 2):
        part = snapshot(single, base / f"part-{i}")
        done = make("grade", f"LABS={LAB}", f"SUBMISSIONS={week2}", f"OUT={part}", f"SHARD={i}/2")
        assert done.returncode == 0, said(done)
        parts.append(part)
    merged = {}
    for order in (parts, parts[::-1]):
        into = base / f"merged-{order[0].name}"
        done = kit("scoreboard", "merge", *map(str, order), "--out", str(into))
        assert done.returncode == 0, said(done)
        merged[order[0].name] = into
    a, b = merged.values()
    names = [
        "scoreboard.csv",
        "scoreboard.json",
        "scoreboard.md",
        "scoreboard.html",
        "grades.csv",
        "class-anonymous.html",
    ] + [f"feedback/{s}.{k}" for s in STUDENTS for k in ("md", "html")]
    # every file of the course's state, the kept copies of replaced inputs (course/history/) included
    names += [str(p.relative_to(single)) for p in sorted((single / "course").rglob("*")) if p.is_file()]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), (
            f"{name}: the merge depends on the parts' order"
        )
        assert (a / name).read_bytes() == (single / name).read_bytes(), (
            f"{name}: the merge is not the single run's"
        )
