"""Grade a class: every student, lab and device configuration, through the student loop's own pipeline.

    submissions/<student_id>/lab-<N>.ipynb   what the TA collected
    OUT/units/<student_id>/lab-<N>/<config>.json      one graded unit (student, lab, configuration)
    OUT/units/<student_id>/lab-<N>/<config>.run.json  its notebook run, kept as soon as the run ends
    OUT/work/<student_id>/lab-<N>/<config>/           the run's folder: executed notebook, log
    OUT/reference/...                                 the same for the reference solutions
    OUT/scoreboard.{csv,json,md,html}, OUT/feedback/  drawn by `scoreboard` from the graded units

Every unit runs its notebook with `execute.run_notebook` (a process of its own, on its
configuration) and is judged by `judge.judge` with the lab's public and hidden tests: the
same two stages as `make lab-N`. Runs go on `jobs` at a time; the main thread keeps each
run's record the moment it ends, and judges finished runs in batches, one pytest session
per lab for many students at once. Every file is written atomically, so a run stopped
half way keeps what it finished, and the next run grades only what is left.

Each unit has a key: a digest of the submission's bytes, the lab's tests and reference,
the configuration, the timeout, and the kit's grading code and locked environment. A unit
whose key has not changed is not graded again.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from labkit.course import catalog
from labkit.course.configs import DeviceConfig
from labkit.grading.classwide import similarity
from labkit.grading.intake import lms, writeups
from labkit.grading.intake.collect import (
    REFERENCE,
    GradeError,
    ReferenceBroken,
    Submissions,
    Unit,
    choose_configs,
    choose_labs,
    discover,
    parse_shard,
    shard_of,
)
from labkit.grading.publish import scoreboard
from labkit.grading.running.engine import Grader, StopRequest, default_jobs
from labkit.grading.running.store import FORMAT, Store, kit_digest
from labkit.grading.state import course as course_mod
from labkit.grading.state import history
from labkit.grading.state import policy as policy_mod
from labkit.grading.state import roster as roster_mod
from labkit.run import execute, modes
from labkit.run.allowance import DEFAULT_LIMITS, Limits

RETRIED = (
    "error",
    "timeout",
)  # the kept rows `--retry` grades again (a run that may go otherwise under less load)

# ----------------------------------------------------------------------------------------
# The command.
# ----------------------------------------------------------------------------------------


def check_reference(rows: list[dict], labs: dict[int, catalog.Lab]) -> None:
    """Every reference must pass every test on every configuration that ran; else say which test is broken."""
    broken = []
    for row in rows:
        if row["status"] in ("ok", "skipped"):
            continue
        lab = labs[row["lab"]]
        bad = [t for t in row["tests"] if t["status"] not in ("passed", "skipped")]
        if not bad or row["status"] in ("error", "timeout"):  # the run itself: one line, not one per test
            broken.append(
                f"{lab.reference.relative_to(lab.root)} on {row['config']}: {row['status']}: {row['message']}"
            )
            continue
        for t in bad:
            where = "hidden" if t["hidden"] else "public"
            broken.append(
                f"{lab.reference.relative_to(lab.root)} on {row['config']}: {t['test']} "
                f"({where}, {t['file']}) {t['status']}: {t['message']}"
            )
    if broken:
        raise ReferenceBroken(
            "the reference solution does not pass its own tests, so grading stops here:\n  "
            + "\n  ".join(broken)
        )


def check_isolation(limits: Limits, stream) -> None:
    """Before anything runs: the sandbox every run will get, or `modes.SandboxUnavailable` (fail closed).

    Only `--isolation limits-only`, asked for by name, grades without one; every row then says so.
    """
    if limits.isolation == modes.LIMITS_ONLY:
        print(
            "isolation: resource limits only, asked for by name (--isolation limits-only): a notebook can read "
            "what this user can read and use the network; every row says limits-only",
            file=stream,
            flush=True,
        )
        return
    if limits.isolation == modes.POD:
        modes.isolation(modes.POD)  # raises, with the reason, where this is no pod of the kit's design
        print(
            "isolation: no bubblewrap, the pod is the sandbox, asked for by name (--isolation pod); every row "
            "says pod",
            file=stream,
            flush=True,
        )
        return
    if limits.isolation != modes.SANDBOX:
        return
    found = modes.require_sandbox("nothing was graded")
    print(f"isolation: every notebook runs in a sandbox: {found.summary()}", file=stream, flush=True)
    for problem in found.problems:
        print(f"  not used: {problem.lines()[0]}", file=stream, flush=True)


def results_of(
    rows: list[dict],
    labs: list[catalog.Lab],
    chosen: list[DeviceConfig],
    subs: Submissions,
    students: list[str],
    *,
    ref_rows: list[dict] = (),
    grading: policy_mod.Policy | None = None,
    people: roster_mod.Roster | None = None,
) -> dict:
    """The plain data the scoreboard is drawn from (nothing in it depends on when or where it ran).

    Each lab carries its tests with their points and the configurations they ran on (from the
    reference), and the results carry the policy and the roster's columns, so that points and
    LMS exports are drawn from these results alone.
    """
    tests = policy_mod.lab_tests(list(ref_rows))
    labs_out = []
    for lab in labs:
        entry = {"number": lab.number, "name": lab.name, "title": lab.title}
        if ref_rows:
            mine = tests.get(lab.number, {})
            entry["tests"] = mine
            entry["reference_costs"] = {
                r["config"]: r["costs"] for r in ref_rows if r["lab"] == lab.number and r.get("costs")
            }
            entry["max_points"] = policy_mod.lab_points(grading or policy_mod.Policy(), mine, {})[1]
        if (
            lab.leaderboard is not None
        ):  # the class leaderboard the catalog gives it (labkit/grading/classwide/leaderboard.py)
            entry["leaderboard"] = lab.leaderboard.to_json()
        labs_out.append(entry)
    info = people.students if people else {}
    results = {
        "format": FORMAT,
        "labs": labs_out,
        "configs": [{"name": c.name, "summary": c.summary, "devices": c.devices} for c in chosen],
        "students": {s: {"notes": subs.notes.get(s, []), **info.get(s, {})} for s in students},
        "notes": list(subs.class_notes),
        "rows": rows,
    }
    if grading is not None:
        results["policy"] = grading.to_json()
    return results


def _with_roster(subs: Submissions, people: roster_mod.Roster) -> None:
    """Every roster student is in the class (a missing one with a note); a folder not on it is reported, not graded."""
    for student in list(subs.students):
        if student not in people.students:
            subs.class_notes.append(
                f"{student}: a submission folder not on the roster ({people.source}), not graded"
            )
            del subs.students[student]
            subs.notes.pop(student, None)
    for student in people.students:
        if student not in subs.students:
            subs.students[student] = {}
            subs.notes[student] = ["no submission: nothing was handed in for this student"]


@dataclass(frozen=True)
class Request:
    """What a grading run is asked to do: `grade`'s one argument, each field one flag of `labkit grade`.

    `inputs`: the TA's inputs by name (`course.INPUTS`: roster, policy, overrides, extensions, adjustments
    and the rest), kept in the course's state (`course`, default OUT/course: labkit/grading/state/course.py): one
    left out (None) is the kept one. `students`: ids graded again whatever was kept for them; `retry`: units
    whose kept row is an error or a timeout graded again. `runs_from` and `plan`: where the notebooks ran in
    pods of their own (labkit.grading.running.pods)."""

    submissions: Path
    out: Path
    labs: str | None = None
    configs: str | None = None
    jobs: int | None = None
    timeout: float = execute.DEFAULT_TIMEOUT
    shard: str | None = None
    limits: Limits | None = None
    start: str = "warm"
    runs_from: Path | None = None
    plan: Path | None = None
    inputs: Mapping[str, Path | None] = field(default_factory=dict)
    course: Path | None = None
    forget: str = ""
    change_policy: bool = False
    students: str | None = None
    retry: bool = False


def grade(request: Request, *, stream=None, terminal: bool | None = None) -> dict:
    """Grade the class in `request.submissions` into `request.out`; the results (also written as the scoreboard).

    The TA's inputs are all checked before anything is graded. Progress goes to `stream` (standard error),
    drawn as a live table where `terminal` says so (None: where `stream` is one).
    """
    stream = stream or sys.stderr
    # Absolute from here on: the warm server's socket, the kernels' connection files and the sandbox's binds
    # are all named by path, and a relative one (`make grade`'s default OUT=scoreboard) means nothing there.
    submissions, out = Path(request.submissions).absolute(), Path(request.out).absolute()
    _check_request(submissions, request.timeout, request.jobs)
    part = parse_shard(request.shard)
    chosen_labs, chosen = choose_labs(request.labs), choose_configs(request.configs)
    given = {name: path for name, path in request.inputs.items() if path is not None}
    state, context = _course_state(out, request.course, given, request.forget, request.change_policy)
    grading, people = state.values.get("policy") or policy_mod.Policy(), state.values.get("roster")
    provisional = _provisional(grading, [c.name for c in chosen])
    grader = _grader(request, out, chosen_labs, chosen, stream, terminal)
    grader.stop = stop = StopRequest()
    try:
        subs, times = _submissions(
            submissions, out, people, stream
        )  # an LMS download is checked before any run
        named = _class_checked(state, context, subs, request.students, stream)
        grader.again = _again(named, request.retry)
        if people is not None:
            roster_mod.credit_groups(people, subs.students, subs.notes, times)  # the roster's `group` column
        ref_rows = _grade_references(grader, out, chosen_labs, chosen)
        stop.check()
        graded = _students_of_shard(subs, part)
        handed = _keep_history(out, subs, graded, chosen_labs, times, grading)
        rows = _grade_students(grader, out, subs, graded, chosen_labs, chosen, ref_rows, handed)
        results = results_of(
            rows, chosen_labs, chosen, subs, graded, ref_rows=ref_rows, grading=grading, people=people
        )
        for (student, lab), info in sorted(handed.items()):
            results["students"][student].setdefault("submissions", {})[str(lab)] = info
        if provisional:
            results["provisional"] = provisional
        results.update(course_values(state, [lab.number for lab in chosen_labs]))
        results["kit"] = kit_digest()  # a merge refuses parts graded with another version of the kit
        scoreboard.write(results, out)
        for line in state.changes + state.notes:
            print(f"course state: {line}", file=stream, flush=True)
        stop.check()  # a stop asked for while the scoreboard was written: it is whole, and the run still ends as stopped
        return results
    finally:
        stop.restore()
        grader.close()  # the warm server, if one was started


def _grader(request: Request, out: Path, labs, configs, stream, terminal: bool | None) -> Grader:
    """The grader of this request's runs, its sandbox checked (`check_isolation` says what it is, or refuses)."""
    limits = request.limits or replace(DEFAULT_LIMITS, isolation=modes.SANDBOX)
    check_isolation(limits, stream)
    return Grader(
        out,
        labs,
        configs,
        jobs=request.jobs or default_jobs(),
        timeout=request.timeout,
        limits=limits,
        stream=stream,
        terminal=terminal,
        warm=request.start != "cold",
        pods=_pods(request.runs_from, request.plan),
    )


def _check_request(submissions: Path, timeout: float, jobs: int | None) -> None:
    """Refuse, before anything is read or graded, a folder that is not there and limits that mean nothing."""
    if not submissions.exists():
        raise GradeError(
            f"the submissions folder {submissions} does not exist "
            "(expected <student_id>/lab-<N>.ipynb inside it, or an LMS download)"
        )
    if timeout <= 0:
        raise GradeError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if jobs is not None and jobs < 1:
        raise GradeError(f"--jobs must be at least 1, got {jobs}")


def _pods(runs_from: Path | None, plan: Path | None) -> tuple[Path, Path] | None:
    """(RUNS, PLAN) where the notebooks ran in pods of their own (labkit.grading.running.pods), else None."""
    if (runs_from is None) != (plan is None):
        raise GradeError(
            "--runs-from and --plan go together: the pods' outputs and the plan that made their inputs"
        )
    return (
        (Path(runs_from).absolute(), Path(plan).absolute())
        if runs_from is not None and plan is not None
        else None
    )


def _grade_references(
    grader: Grader, out: Path, labs: list[catalog.Lab], chosen: list[DeviceConfig]
) -> list[dict]:
    """The reference solutions graded first: they must pass everything, or nothing else is worth grading."""
    units = [Unit(REFERENCE, lab.number, c.name, lab.reference, kit=True) for lab in labs for c in chosen]
    rows = grader.run(units, Store(out / "reference"), "reference solutions", fills_cache=True)
    check_reference(rows, grader.labs)
    return rows


def _students_of_shard(subs: Submissions, part: tuple[int, int] | None) -> list[str]:
    """The class's students, sorted; with `--shard K/N`, those of shard K alone."""
    students = sorted(subs.students)
    if part:
        students = [s for s in students if shard_of(s, part[1]) == part[0]]
    return students


def _grade_students(
    grader: Grader,
    out: Path,
    subs: Submissions,
    students: list[str],
    labs: list[catalog.Lab],
    chosen: list[DeviceConfig],
    ref_rows: list[dict],
    handed: dict[tuple[str, int], dict],
) -> list[dict]:
    """Every (student, lab, configuration) graded, each row scored against what the reference scored there
    and naming the digest of the notebook graded."""
    expected = {(r["lab"], r["config"]): (r["total"], r["max_points"]) for r in ref_rows}
    units = [
        Unit(s, lab.number, c.name, subs.students[s].get(lab.number), subs.refused.get((s, lab.number), ""))
        for s in students
        for lab in labs
        for c in chosen
    ]
    rows = grader.run(units, Store(out), f"grading {len(students)} students", expected)
    for row in rows:
        row["digest"] = handed.get((row["student"], row["lab"]), {}).get("digest", "")
    return rows


def _submissions(
    submissions: Path, out: Path, people: roster_mod.Roster | None, stream
) -> tuple[Submissions, dict]:
    """The class's notebooks: the kit's folder layout, or an LMS download read into OUT/collected first.

    Also (student, lab) -> what the LMS says of the submission (time, late mark), where it says it.
    """
    known = [lab.number for lab in catalog.labs()]
    if not lms.is_download(submissions):
        return discover(submissions, known), {}
    into = out / "collected"
    if into.exists():
        shutil.rmtree(into)  # the last import's files: this download alone says what is handed in
    try:
        found = lms.collect(submissions, people, into, known)
    except lms.LmsError as e:
        raise GradeError(str(e)) from None
    into.mkdir(parents=True, exist_ok=True)
    for line in found.notes():
        print(f"{submissions.name}: {line}", file=stream, flush=True)
    subs = discover(into, known)
    subs.class_notes[:0] = found.notes()
    for (student, lab), entry in sorted(found.files.items()):
        if entry["late"] and student in subs.notes:
            subs.notes[student].append(
                f"lab-{lab}: {entry['source'].capitalize()} marked it late ({entry['member']})"
            )
        subs.notes.setdefault(student, []).extend(f"lab-{lab}: {note}" for note in entry.get("notes", ()))
    return subs, {
        k: {
            "submitted_at": v["submitted_at"],
            "late": v["late"],
            "source": v["source"],
            "file": v["member"],
            "times": v.get("times", {}),
        }
        for k, v in found.files.items()
    }


def _keep_history(
    out: Path,
    subs: Submissions,
    students: list[str],
    labs: list[catalog.Lab],
    times: dict,
    grading: policy_mod.Policy,
) -> dict[tuple[str, int], dict]:
    """Keep every notebook about to be graded in OUT/history by digest; (student, lab) -> what the results say.

    The results name the digest graded, the fingerprint of its code (labkit/grading/classwide/similarity.py), the LMS's submission time and late flag, and every time
    known for the submission by source (`times`: the LMS's, or a plain folder's git commit, file
    modification time or Gradescope metadata; when the kit collected it stays in OUT/history, so that
    grading the same class again writes the same results); the policy
    decides which of them a late penalty may count from (labkit/grading/state/deadlines.py).
    """
    handed = {}
    handouts = {lab.number: similarity.starter(similarity.read_cells(lab.student) or []) for lab in labs}
    notes = {lab.number: writeups.extract(lab.student) for lab in labs}  # a lab whose handout asks for a note
    for student in students:
        for lab in labs:
            path = subs.students[student].get(lab.number)
            if path is None:
                continue
            lms_info = times.get((student, lab.number), {})
            entry = history.keep(
                out,
                student,
                lab.number,
                path,
                submitted_at=lms_info.get("submitted_at"),
                source=lms_info.get("source", ""),
                file=lms_info.get("file", ""),
            )
            if entry is None:
                continue
            known = dict(lms_info["times"]) if "times" in lms_info else history.folder_times(path)
            info = {
                "digest": entry["digest"],
                "submitted_at": lms_info.get("submitted_at"),
                "late": bool(lms_info.get("late")),
                "times": known,
            }
            code = similarity.fingerprint(path, handouts[lab.number])
            if code is not None:
                info["code"] = (
                    code  # what labkit/grading/classwide/similarity.py compares, the handout's own code left out
                )
            handed[student, lab.number] = info
            writeups.write(out, student, lab.number, path, notes[lab.number])  # for the TA's rubric
    return handed


def _course_state(
    out: Path, course: Path | None, given: dict, forget: str, change_policy: bool
) -> tuple[course_mod.State, course_mod.Context]:
    """The TA's inputs this run grades with (given, else kept), the roster and the policy checked already."""
    folder = Path(course).absolute() if course is not None else out / course_mod.FOLDER
    context = course_mod.Context(labs=[lab.number for lab in catalog.labs()])
    try:
        graded = json.loads((out / "scoreboard.json").read_text()).get("policy")
    except (OSError, ValueError, AttributeError):
        graded = None
    try:
        state = course_mod.read(
            folder, given, forget=forget, change_policy=change_policy, graded_policy=graded, labs=context.labs
        )
        state.check(context, needs_class=False)
    except course_mod.InputError as e:
        raise GradeError(str(e)) from None
    return state, context


def _class_checked(
    state: course_mod.State, context: course_mod.Context, subs: Submissions, students: str | None, stream
) -> set[str]:
    """The class made (the roster's students, or the folders), the inputs checked against it, the state kept.

    The ids `--students` names, each checked to be in the class.
    """
    people = state.values.get("roster")
    if people is not None:
        _with_roster(subs, people)
    context.students = set(subs.students)
    try:
        state.check(
            context, needs_class=True
        )  # overrides, extensions, ...: against the class, before any run
    except course_mod.InputError as e:
        raise GradeError(str(e)) from None
    named = _named_students(students, set(subs.students))
    state.save()
    for line in state.lines():
        print(line, file=stream, flush=True)
    return named


def prepare(
    submissions: Path,
    out: Path,
    *,
    inputs: dict[str, Path | None],
    course: Path | None = None,
    forget: str = "",
    change_policy: bool = False,
    students: str | None = None,
    labs: str | None = None,
    config_names: str | None = None,
    stream=None,
) -> course_mod.State:
    """Check and keep the course's state for runs that grade elsewhere (Slurm's shards), grading nothing.

    The same checks as `grade` makes before its first run; GradeError (exit 2) names the file and line.
    """
    stream = stream or sys.stderr
    submissions, out = Path(submissions).absolute(), Path(out).absolute()
    if not submissions.exists():
        raise GradeError(f"the submissions folder {submissions} does not exist")
    choose_labs(labs)
    chosen = choose_configs(config_names)
    state, context = _course_state(out, course, inputs, forget, change_policy)
    _provisional(state.values.get("policy") or policy_mod.Policy(), [c.name for c in chosen])
    subs, _ = _submissions(submissions, out, state.values.get("roster"), stream)
    _class_checked(state, context, subs, students, stream)
    return state


def course_values(state: course_mod.State, labs: list[int]) -> dict:
    """What the course's inputs put in the results: for the whole class (every shard the same), the labs graded."""
    out = {}
    for name, entry in course_mod.INPUTS.items():
        value = state.values.get(name)
        if entry.results_key is None or not value:
            continue
        if isinstance(value, list):  # lines, each of one student's lab
            value = [v for v in value if v.get("lab") in labs]
        elif isinstance(value, dict):  # student -> lab -> ...
            value = {s: {k: v for k, v in by.items() if int(k) in labs} for s, by in sorted(value.items())}
            value = {s: by for s, by in value.items() if by}
        if value:
            out[entry.results_key] = value
    return out


def _provisional(grading: policy_mod.Policy, chosen: list[str]) -> str:
    try:
        return policy_mod.check_required(grading, chosen)
    except policy_mod.PolicyError as e:
        raise GradeError(str(e)) from None


def _named_students(text: str | None, known: set[str]) -> set[str]:
    """`--students ID,ID`: each one in the class, or GradeError naming those that are not."""
    named = {s.strip() for s in (text or "").split(",") if s.strip()}
    unknown = sorted(named - known)
    if unknown:
        raise GradeError(
            f"--students names {', '.join(unknown)}: not in this class (no submission folder, or "
            "not on the roster); give the ids as the scoreboard names them, comma-separated"
        )
    return named


def _again(named: set[str], retry: bool):
    """Which kept units to grade again: the named students' every unit; with retry, errors and timeouts."""

    def again(unit: Unit, row: dict) -> bool:
        return unit.student in named or (retry and row.get("status") in RETRIED)

    return again
