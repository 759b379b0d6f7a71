"""Grade a class: every student, lab and device configuration, through the student loop's own pipeline.

    submissions/<student_id>/lab-<N>.ipynb   what the TA collected
    OUT/units/<student_id>/lab-<N>/<config>.json      one graded unit (student, lab, configuration)
    OUT/units/<student_id>/lab-<N>/<config>.run.json  its notebook run, kept as soon as the run ends
    OUT/work/<student_id>/lab-<N>/<config>/           the run's folder: executed notebook, log
    OUT/reference/...                                 the same for the reference solutions
    OUT/scoreboard.{csv,json,md,html}, OUT/feedback/  drawn by `scoreboard` from the graded units

The run is a sequence of the stages' calls (labkit/grading/*/__init__.py says what each reads and
writes): the course's state read and checked (`state.inputs`), the class read from the submissions
and checked against it (`intake.handin`), the references and then the students' units run and judged
(`running.units`), the class's results gathered with each notebook's fingerprint (`classwide`), and the
scoreboard and feedback drawn (`publish.scoreboard`).

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

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from labkit.course import catalog
from labkit.grading.classwide import gathered, similarity
from labkit.grading.intake import counted, handin, lms
from labkit.grading.intake.collect import choose_configs, choose_labs, parse_shard
from labkit.grading.publish import scoreboard
from labkit.grading.running import held, units
from labkit.grading.running.engine import Grader, StopRequest
from labkit.grading.state import course as course_mod
from labkit.grading.state import inputs as inputs_mod
from labkit.grading.state import policy as policy_mod
from labkit.grading.state import term as term_mod
from labkit.grading.state.errors import GradeError
from labkit.run import execute
from labkit.run.allowance import Limits


@dataclass(frozen=True)
class Request:
    """What a grading run is asked to do: `grade`'s one argument, each field one flag of `labkit grade`.

    `inputs`: the TA's inputs by name (`course.INPUTS`: roster, policy, overrides, extensions, adjustments
    and the rest), kept in the course's state (`course`, default OUT/course: labkit/grading/state/course.py): one
    left out (None) is the kept one. `submissions`, `labs` and `configs` are the term's
    (labkit/grading/state/term.py): None is the kept one; one given adds to the term and narrows the run to it,
    every other unit held as the last run left it (labkit/grading/running/held.py). `students`: ids graded
    again whatever was kept for them, the only students this run grades; `retry`: units whose kept row is an
    error or a timeout graded again. `runs_from` and `plan`: where the notebooks ran in
    pods of their own (labkit.grading.running.pods)."""

    submissions: Path | None
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
    out = Path(request.out).absolute()
    _check_request(request.timeout, request.jobs)
    part = parse_shard(request.shard)
    given = {name: path for name, path in request.inputs.items() if path is not None}
    term_forget, course_forget = _split_forget(request.forget)
    state, context = inputs_mod.read(out, request.course, given, course_forget, request.change_policy)
    term = _term(request, out, term_forget)
    labs, chosen = choose_labs(",".join(map(str, term.labs))), choose_configs(",".join(term.configs))
    grading, people = state.values.get("policy") or policy_mod.Policy(), state.values.get("roster")
    provisional = inputs_mod.provisional(grading, [c.name for c in chosen])
    grader = _grader(request, out, labs, chosen, stream, terminal)
    grader.stop = stop = StopRequest()
    try:
        klass = _class_of(term, out, state, context, request.students, grading, stream)
        grader.again = units.again(klass.named, request.retry)
        graded = handin.students_of_shard(klass.subs, part)
        selection = held.Selection(set(term.run_labs), set(term.run_configs), klass.named, held.previous(out))
        todo = selection.units(graded, labs, chosen)
        ref_rows = units.grade_references(
            grader, out, [lab for lab in labs if lab.number in todo.labs], chosen
        )
        stop.check()
        handed = handin.keep(out, todo.handed_in(klass.subs), graded, labs, klass.times)
        similarity.add_fingerprints(handed, klass.subs.students, labs)
        rows = units.grade_students(
            grader, out, klass.subs, graded, labs, chosen, ref_rows, handed, only=selection.grades
        )
        results = gathered.of_class(
            selection.rows(rows, graded, labs, chosen),
            labs,
            chosen,
            klass.subs,
            graded,
            ref_rows=ref_rows,
            grading=grading,
            people=people,
            handed=handed | selection.held_submissions(todo, graded, labs),
            provisional=provisional,
            course_values=inputs_mod.course_values(state, [lab.number for lab in labs]),
        )
        selection.hold_labs(results, todo.labs)
        scoreboard.write(results, out)
        for line in state.changes + state.notes + term.changes:
            print(f"course state: {line}", file=stream, flush=True)
        stop.check()  # a stop asked for while the scoreboard was written: it is whole, and the run still ends as stopped
        return results
    finally:
        stop.restore()
        grader.close()  # the warm server, if one was started


def _class_of(term, out: Path, state, context, students, grading, stream):
    """The class this run grades (labkit/grading/intake/handin.py), each lab at the version that counts (the
    policy's rule, or a TA's pin); the term's scope kept, and said."""
    klass = handin.the_class(
        term,
        out,
        state,
        context,
        students,
        stream,
        check=lambda k: counted.check_pins(out, k, _pins(state)),
    )
    counted.choose(out, klass, grading, _pins(state), state.values.get("extensions") or {}, term.labs, stream)
    _keep(term, stream)
    return klass


def _keep(term: term_mod.Term, stream) -> None:
    """Keep the term's scope in the course's folder and say it."""
    term.save()
    for line in term.lines():
        print(line, file=stream, flush=True)


def _grader(request: Request, out: Path, labs, configs, stream, terminal: bool | None) -> Grader:
    """The grader of this request's runs (labkit/grading/running/units.py), its sandbox checked."""
    return units.grader(
        out,
        labs,
        configs,
        jobs=request.jobs,
        timeout=request.timeout,
        limits=request.limits,
        start=request.start,
        runs_from=request.runs_from,
        plan=request.plan,
        stream=stream,
        terminal=terminal,
    )


def _check_request(timeout: float, jobs: int | None) -> None:
    """Refuse, before anything is read or graded, limits that mean nothing."""
    if timeout <= 0:
        raise GradeError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if jobs is not None and jobs < 1:
        raise GradeError(f"--jobs must be at least 1, got {jobs}")


def _pins(state: course_mod.State) -> dict:
    """The TA's pins, once the class-dependent inputs are checked (labkit/grading/state/pins.py)."""
    return state.values.get("pins") or {}


def _split_forget(forget: str) -> tuple[list[str], str]:
    """`--forget`'s names of the term (submissions, labs, configs), and the rest for the course's inputs."""
    try:
        return term_mod.split_forget(forget, list(course_mod.INPUTS))
    except term_mod.TermError as e:
        raise GradeError(str(e)) from None


def _term(request: Request, out: Path, forget: list[str]) -> term_mod.Term:
    """The term this run grades (labkit/grading/state/term.py): the kept sources, labs and configurations, with
    what the request gives added; the labs and configurations given checked first."""
    labs = [lab.number for lab in choose_labs(request.labs)] if request.labs else None
    configs = [c.name for c in choose_configs(request.configs)] if request.configs else None
    folder = Path(request.course).absolute() if request.course is not None else out / course_mod.FOLDER
    try:
        return term_mod.resolve(
            folder,
            submissions=request.submissions,
            labs=labs,
            configs=configs,
            forget=forget,
            all_labs=[lab.number for lab in catalog.labs()],
            default_configs=[c.name for c in choose_configs(None)],
            is_download=lms.is_download,
        )
    except term_mod.TermError as e:
        raise GradeError(str(e)) from None


def prepare(
    submissions: Path | None,
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
) -> term_mod.Term:
    """Check and keep the course's state and the term for runs that grade elsewhere (Slurm's shards), grading
    nothing; the term kept, which every shard reads from the course's folder as the bare `grade` does.

    The same checks as `grade` makes before its first run, on the same class: the term's sources (`submissions`
    added, None: the kept ones), its downloads added up in OUT/collected. GradeError (exit 2) names the file
    and line.
    """
    stream = stream or sys.stderr
    out = Path(out).absolute()
    term_forget, course_forget = _split_forget(forget)
    state, context = inputs_mod.read(out, course, inputs, course_forget, change_policy)
    request = Request(submissions, out, labs=labs, configs=config_names, course=course)
    term = _term(request, out, term_forget)
    chosen = choose_configs(",".join(term.configs))
    inputs_mod.provisional(state.values.get("policy") or policy_mod.Policy(), [c.name for c in chosen])
    handin.the_class(
        term, out, state, context, students, stream, check=lambda k: counted.check_pins(out, k, _pins(state))
    )  # before any shard is submitted
    _keep(term, stream)
    return term
