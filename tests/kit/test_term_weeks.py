"""The term test, grown: three weeks of a course whose class comes in LMS downloads, one after another, by the
lines of docs/grading.md's walk-through ("The term"), typed as written with this module's files.

Week 1: a Canvas download of lab 3 and every TA input once (a roster with a group, the policy's due dates
and late rule, an extension, manual points). Week 2: a Canvas download of lab 5 alone (lab 3's grades must
stay), a regrade request answered with points as the review page answers it, one override added with
`OVERRIDES=+FILE`, and the bare `make grade` ("the same again": nothing graded, nothing lost). Week 3: a
Gradescope download for lab 5 holding one student's late resubmission (it replaces the Canvas version,
said with both times, and is charged by Gradescope's time), a roster without the student who dropped the
course (their override kept but inactive, named), and the bare command again.

After each week the totals in grades.csv must equal the totals this module computes from the rules the
guide states, from the rows' test outcomes alone: a test's points where it passed on every configuration,
the late penalty (a Canvas `_LATE` flag one day, Gradescope's time by the day, an extension moving the due
date), an override replacing a lab's points, adjustments added. Canvas and Gradescope downloads are made
here as the LMSs write them (tests/kit/test_lms.py has their formats).
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import subprocess
import zipfile
from datetime import datetime, timedelta
from pathlib import Path

import doc_commands
import pytest

from labkit.grading.review import regrades

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = {lab: (ROOT / "reference" / f"lab-{lab}.ipynb").read_text() for lab in (3, 5)}
HANDOUT = {lab: (ROOT / "labs" / f"lab-{lab}.ipynb").read_text() for lab in (3, 5)}
DUE = {3: "2026-03-01T23:59:00-08:00", 5: "2026-03-15T23:59:00-08:00"}
LATE = {"per_day": 0.1, "cap": 0.5, "grace_minutes": 15}
CONFIGS = "cpu-1,cpu-8"
CANVAS_ID = {"ana": 4401, "ben": 4402, "cy": 4403, "dee": 4404, "eve": 4405, "fay": 4406}
BEN_RESUBMITTED = "2026-03-17 09:00:00.000000000 -07:00"  # lab 5, about a day and a half late: 2 days


def distinct(text: str, who: str) -> str:
    """A notebook with a comment naming its student in its first code cell, as a real class's copies differ."""
    nb = json.loads(text)
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["source"] = f"# {who}\n" + "".join(cell["source"])
    return json.dumps(nb)


def roster(without: tuple[str, ...] = ()) -> str:
    lines = ["student,name,email,lms_id,section,group"]
    for s, n in CANVAS_ID.items():
        if s not in without:
            lines.append(f"{s},{s.title()},{s}@u.edu,{n},A,{'g1' if s in ('cy', 'dee') else ''}")
    return "\n".join(lines) + "\n"


def policy() -> str:
    text = (ROOT / "tests" / "policy.toml").read_text()
    for lab, due in DUE.items():
        text += f"\n[labs.{lab}]\ndue = {due}\n"
    return text + "\n[late]\n" + "".join(f"{k} = {v}\n" for k, v in LATE.items())


def canvas(
    path: Path, lab: int, handed: dict[str, tuple[str, bool]], also: dict[str, str] | None = None
) -> Path:
    """A Canvas bulk download: `login_[LATE_]userid_submissionid_file`, one file per student (and `also`'s)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i, (student, (text, late)) in enumerate(sorted(handed.items())):
            flag = "LATE_" if late else ""
            z.writestr(f"{student}{student}_{flag}{CANVAS_ID[student]}_{7000 + i}_lab-{lab}.ipynb", text)
        for name, text in (also or {}).items():
            z.writestr(name, text)
    return path


def gradescope(path: Path, lab: int, handed: dict[str, tuple[str, str]]) -> Path:
    """A Gradescope export: a folder per submission, its submitters and time in submission_metadata.yml."""
    meta = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i, (student, (text, when)) in enumerate(sorted(handed.items())):
            folder = f"submission_{500 + i}"
            meta.append(
                f"{folder}:\n  :submitters:\n  - :name: {student.title()}\n    :sid: '{CANVAS_ID[student]}'\n"
                f"    :email: {student}@u.edu\n  :created_at: {when}\n"
            )
            z.writestr(f"{folder}/lab-{lab}.ipynb", text)
        z.writestr("submission_metadata.yml", "".join(meta))
    return path


def make(words: list[str]) -> subprocess.CompletedProcess:
    """A `make ...` line of docs/grading.md as a TA types it, in the kit's folder."""
    env = dict(doc_commands.user_environment(), COLUMNS="160", NO_COLOR="1")
    return subprocess.run(
        [words[0], "--no-print-directory", "-C", str(ROOT), *words[1:]],
        env=env,
        text=True,
        capture_output=True,
        timeout=3000,
        check=False,
    )


def graded_now(done: subprocess.CompletedProcess) -> list[str]:
    """The units a run graded, as its progress lines name them (`[3/12] ana lab-5 cpu-8: ...`)."""
    lines = [ln.split("] ", 1)[1] for ln in done.stderr.splitlines() if ln.startswith("[") and "] " in ln]
    return [ln.split(":")[0] for ln in lines if ln.split(" ")[0] in CANVAS_ID]


def said(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stderr\n{done.stderr[-8000:]}\n--- stdout\n{done.stdout[-3000:]}"


# ----------------------------------------------------------------------------------------
# The grades, from the rules.
# ----------------------------------------------------------------------------------------


def factor(days: int) -> float:
    return 1 - min(LATE["per_day"] * days, LATE["cap"])


def gradescope_days_late(when: str, lab: int, extension: float = 0) -> int:
    day, clock, zone = when.split(" ")
    over = datetime.fromisoformat(f"{day}T{clock[:8]}{zone}") - (
        datetime.fromisoformat(DUE[lab]) + timedelta(days=extension)
    )
    return 0 if over <= timedelta(minutes=LATE["grace_minutes"]) else math.ceil(over / timedelta(days=1))


def earned(results: dict, student: str, lab: int) -> float:
    """A lab's points from its rows: each test's points where it passed on every configuration it runs on."""
    rows = {(r["student"], r["lab"], r["config"]): r for r in results["rows"]}
    graded = next(g for g in results["labs"] if g["number"] == lab)
    total = 0.0
    for test, about in graded["tests"].items():
        outcomes = [
            next((t["status"] for t in rows[student, lab, c]["tests"] if t["test"] == test), None)
            if (student, lab, c) in rows
            else None
            for c in about["configs"]
        ]
        if outcomes and all(o == "passed" for o in outcomes):
            total += about["points"]
    return total


def expected(out: Path, week: dict) -> dict[str, float]:
    """Every student's total this week, as the guide's rules make it."""
    results = json.loads((out / "scoreboard.json").read_text())
    totals = {}
    for student in week["students"]:
        total = 0.0
        for lab in week["labs"]:
            points = earned(results, student, lab) * factor(week["late_days"].get((student, lab), 0))
            points = week["overrides"].get((student, lab), points)
            points += sum(p for s, n, p in week["adjustments"] if (s, n) == (student, lab))
            total += max(points, 0.0)
        totals[student] = total
    return totals


def grades(out: Path) -> dict[tuple[str, str], dict]:
    return grades_of_text((out / "grades.csv").read_text())


def grades_of_text(text: str) -> dict[tuple[str, str], dict]:
    return {(r["student"], r["lab"]): r for r in csv.DictReader(io.StringIO(text))}


def check_week(out: Path, week: dict) -> None:
    got, want = grades(out), expected(out, week)
    assert {s for s, lab in got if lab == "total"} == set(week["students"])
    wrong = {
        s: (got[s, "total"]["points"], w)
        for s, w in want.items()
        if not math.isclose(float(got[s, "total"]["points"]), w, abs_tol=1e-6)
    }
    assert not wrong, f"grades.csv's totals against the rules' (got, expected): {wrong}"


# ----------------------------------------------------------------------------------------
# The term.
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def weeks(tmp_path_factory):
    """The three weeks in order: each step's run, a copy of the output after it, and the week's rules."""
    base = tmp_path_factory.mktemp("weeks")
    out, ins = base / "scoreboard", base / "inputs"
    ins.mkdir()
    right = {lab: {s: distinct(REFERENCE[lab], s) for s in CANVAS_ID} for lab in (3, 5)}
    (ins / "roster.csv").write_text(roster())
    (ins / "policy.toml").write_text(policy())
    (ins / "extensions.csv").write_text("student,lab,days\neve,5,3\n")
    (ins / "adjustments.csv").write_text(
        "student,lab,points,comment,item,max\nana,3,0.5,a clear write-up,,\n"
    )
    steps: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}

    def step(name: str, words: list[str]) -> None:
        done = make([*words, f"OUT={out}"])
        steps[name] = (done, shutil.copytree(out, base / name.replace(" ", "-"), ignore=_warm))

    # Week 1: lab 3 from Canvas; fay hands in the handout untouched, dee is cy's group partner.
    lab3 = {s: (right[3][s], False) for s in ("ana", "ben", "cy", "eve")} | {"fay": (HANDOUT[3], False)}
    step(
        "week 1",
        doc_commands.with_values(
            "make grade SUBMISSIONS=canvas-lab3.zip ROSTER=roster.csv POLICY=policy.toml "
            "EXTENSIONS=extensions.csv ADJUSTMENTS=adjustments.csv LABS=3 CONFIGS=cpu-1,cpu-8",
            SUBMISSIONS=str(canvas(base / "canvas-lab3.zip", 3, lab3)),
            ROSTER=str(ins / "roster.csv"),
            POLICY=str(ins / "policy.toml"),
            EXTENSIONS=str(ins / "extensions.csv"),
            ADJUSTMENTS=str(ins / "adjustments.csv"),
        ),
    )
    # Week 2: lab 5 from Canvas (ben's is the handout; eve's and fay's marked late), then a regrade request
    # answered with points as the review page answers it, an override added on its own, and the bare command.
    lab5 = {s: (right[5][s], s in ("eve", "fay")) for s in ("ana", "cy", "eve", "fay")}
    lab5["ben"] = (HANDOUT[5], False)
    step(
        "week 2",
        doc_commands.with_values(
            "make grade SUBMISSIONS=canvas-lab5.zip LABS=5",
            # cy's lab 7 came with it, early: a lab the term does not grade yet
            SUBMISSIONS=str(
                canvas(base / "canvas-lab5.zip", 5, lab5, {"cycy_4403_7100_lab-7.ipynb": HANDOUT[3]})
            ),
        ),
    )
    course = out / "course"
    request = regrades.add(course, "ta", "fay", 3, "test_doubles_every_element", "I wrote most of it")
    regrades.answer(
        course, "ta", regrades.load(course)[request - 1], "the idea was there: 2 points", 2.0, set(CANVAS_ID)
    )
    (ins / "one-override.csv").write_text(
        "student,lab,points,test,status,comment\nfay,5,3,,,agreed by email\n"
    )
    step(
        "week 2 override",
        doc_commands.with_values(
            "make grade OVERRIDES=+one-override.csv", OVERRIDES=f"+{ins / 'one-override.csv'}"
        ),
    )
    step("week 2 bare", doc_commands.with_values("make grade"))
    # Week 3: ben resubmits lab 5 through Gradescope, late; fay has dropped the course.
    (ins / "roster-week-3.csv").write_text(roster(without=("fay",)))
    step(
        "week 3",
        doc_commands.with_values(
            "make grade SUBMISSIONS=gradescope-lab5.zip ROSTER=roster-week-3.csv",
            SUBMISSIONS=str(
                gradescope(base / "gradescope-lab5.zip", 5, {"ben": (right[5]["ben"], BEN_RESUBMITTED)})
            ),
            ROSTER=str(ins / "roster-week-3.csv"),
        ),
    )
    step("week 3 bare", doc_commands.with_values("make grade"))
    return steps


def _warm(folder, names):
    return [".warm"] if ".warm" in names else []


WEEK_1 = {
    "students": sorted(CANVAS_ID),
    "labs": [3],
    "late_days": {},
    "overrides": {},
    "adjustments": [("ana", 3, 0.5)],
}
WEEK_2 = WEEK_1 | {
    "labs": [3, 5],
    "late_days": {("fay", 5): 1},  # Canvas's _LATE flag: one day; eve's is within her extension
    "adjustments": [("ana", 3, 0.5), ("fay", 3, 2.0)],
}
WEEK_2_OVERRIDE = WEEK_2 | {"overrides": {("fay", 5): 3.0}}
WEEK_3 = WEEK_2_OVERRIDE | {
    "students": sorted(set(CANVAS_ID) - {"fay"}),
    "late_days": {("ben", 5): gradescope_days_late(BEN_RESUBMITTED, 5)},
}


def test_every_step_of_the_term_ends_with_exit_status_0(weeks):
    for name, (done, _) in weeks.items():
        assert done.returncode == 0, f"{name}: {said(done)}"


def test_week_1_grades_are_the_rules_and_the_group_partner_is_credited(weeks):
    out = weeks["week 1"][1]
    check_week(out, WEEK_1)
    assert grades(out)["dee", "3"]["points"] == grades(out)["cy", "3"]["points"] != "0"


def test_a_second_download_adds_its_lab_and_keeps_the_first_ones_grades(weeks):
    first, second = grades(weeks["week 1"][1]), grades(weeks["week 2"][1])
    for s in CANVAS_ID:
        assert second[s, "3"]["points"] == first[s, "3"]["points"], s
        assert second[s, "3"]["status"] != "missing", s
    check_week(weeks["week 2"][1], WEEK_2 | {"adjustments": WEEK_1["adjustments"]})
    feedback = (weeks["week 2"][1] / "feedback" / "ana.md").read_text()
    assert "was not handed in" not in feedback
    # a lab the term does not grade is said, with how to add it, and graded by no one
    done = weeks["week 2"][0]
    assert "lab 7: 1 notebook handed in, and the term does not grade lab 7" in done.stderr, said(done)
    assert "LABS=7" in done.stderr and not any(lab == "7" for _, lab in grades(weeks["week 2"][1]))


def test_a_regrade_answer_and_an_added_override_reach_the_grades_and_feedback(weeks):
    done, out = weeks["week 2 override"]
    assert graded_now(done) == [], said(done)
    check_week(out, WEEK_2_OVERRIDE)
    feedback = (out / "feedback" / "fay.md").read_text()
    assert "the idea was there: 2 points" in feedback and "agreed by email" in feedback


def test_the_bare_command_is_the_same_again(weeks):
    done, out = weeks["week 2 bare"]
    assert graded_now(done) == [], said(done)
    assert (out / "grades.csv").read_text() == (weeks["week 2 override"][1] / "grades.csv").read_text()


def test_a_late_resubmission_from_another_lms_replaces_the_version_and_is_charged_by_its_time(weeks):
    done, out = weeks["week 3"]
    assert "ben lab-5" in done.stderr and "replaced" in done.stderr, said(done)
    check_week(out, WEEK_3)
    assert WEEK_3["late_days"][("ben", 5)] == 2
    assert "2 days late" in (out / "feedback" / "ben.md").read_text()


def test_a_dropped_students_override_is_kept_inactive_and_named(weeks):
    done, out = weeks["week 3"]
    assert "fay" in done.stderr and "inactive" in done.stderr, said(done)
    assert "fay,5,3" in (out / "course" / "overrides.csv").read_text()
    assert not any(s == "fay" for s, _ in grades(out))


def test_the_bare_command_after_week_3_changes_nothing(weeks):
    done, out = weeks["week 3 bare"]
    assert graded_now(done) == [], said(done)
    check_week(out, WEEK_3)
    assert (out / "grades.csv").read_text() == (weeks["week 3"][1] / "grades.csv").read_text()
