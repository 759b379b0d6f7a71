"""`python -m labkit COMMAND`: the commands behind the Makefile and the nox sessions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from labkit.course import authoring, catalog, configs
from labkit.exitcodes import ExitCode, Stop
from labkit.run import allowance, cgroup, execute, modes, mounts


def _lab(args) -> int:
    from labkit.student.loop import run_lab

    ok = run_lab(
        args.lab,
        notebook=args.notebook,
        config_names=args.configs,
        timeout=args.timeout,
        hidden=args.hidden,
        limits=allowance.limits_from_args(args),
        record_costs=args.record_costs,
        keep_scratch=args.keep_scratch,
    )
    return ExitCode.OK if ok else ExitCode.FAILED


def _list(args) -> int:
    console = Console()
    for lab in catalog.reading_order():
        after = catalog.READ_AFTER.get(lab.number)
        console.print(f"{lab.number:>3}  {lab.title}" + (f"  (read it after lab {after})" if after else ""))
    return ExitCode.OK


def _configs(args) -> int:
    for c in configs.CONFIGS.values():
        ok, reason = c.availability()
        print(f"{c.name:<8} {c.summary}" + ("" if ok else f"  [unavailable here: {reason}]"))
    return ExitCode.OK


def _isolation(args) -> int:
    """Which bwrap makes the sandbox here; or each check that failed, with its fix (exit 1)."""
    found = modes.finding()
    if found.program:
        print(f"sandbox: {found.summary()}")
        for problem in found.problems:
            print("\n".join(["not used:", *("  " + line for line in problem.lines())]))
        print(f"/tmp and /dev/shm: {mounts.tmpfs_sizes()}")
        print(f"CPU share: {cgroup.cpu_share()}")
        return ExitCode.OK
    print(f"no sandbox can be made here:\n  {found.report().replace(chr(10), chr(10) + '  ')}")
    return ExitCode.FAILED


def _doctor(args) -> int:
    from labkit.machine import doctor

    return doctor.main(["--for", args.purposes])


def _student_notebooks(args) -> int:
    """Generate labs/lab-N.ipynb from reference/ (or, with --check, fail when labs/ is out of date)."""
    stale = []
    for lab in catalog.labs():
        if not lab.reference.exists():
            continue
        if args.check:
            if authoring.stale(lab.reference, lab.student):
                stale.append(lab.student)
            continue
        if authoring.generate(lab.reference, lab.student, force=args.force):
            print(f"wrote {lab.student.relative_to(catalog.ROOT)}")
    if stale:
        raise Stop(
            ExitCode.FAILED,
            "out of date with reference/ (run `make student-notebooks`): "
            + ", ".join(str(p.relative_to(catalog.ROOT)) for p in stale),
        )
    return ExitCode.OK


def _grade(args) -> int:
    from labkit.grading import grade
    from labkit.grading.publish import scoreboard
    from labkit.grading.state import course

    try:
        request = grade.Request(
            args.submissions,
            args.out,
            labs=args.labs,
            configs=args.configs,
            jobs=args.jobs,
            timeout=args.timeout,
            shard=args.shard,
            limits=allowance.limits_from_args(args),
            start=args.start,
            runs_from=args.runs_from,
            plan=args.plan,
            students=args.students,
            retry=args.retry,
            **course.request_fields(args),
        )
        results = grade.grade(request)
    except KeyboardInterrupt:
        raise Stop(
            ExitCode.INTERRUPTED,
            f"stopped: what was graded is kept in {args.out}; the same command grades the rest",
        ) from None
    Console().print(scoreboard.terminal(results))
    print(f"scoreboard: {args.out / 'scoreboard.csv'} (and .json, .md, .html; feedback/ for each student)")
    return ExitCode.OK


def _export(args) -> int:
    """`scoreboard export`: an LMS gradebook file from a graded --out folder, with no regrade."""
    from labkit.grading.publish import gradebook, scoreboard
    from labkit.grading.state.files import write_atomic

    results = scoreboard.read(args.folder)
    text = gradebook.export(results, args.format, args.missing)
    write_atomic(args.export_out, text)
    print(f"wrote {args.export_out} ({args.format}: {len(results.get('students', {}))} students)")
    return ExitCode.OK


def _scoreboard(args) -> int:
    from labkit.grading.publish import scoreboard
    from labkit.student.loop import BUILD

    if args.action == "export":
        return _export(args)
    if args.action == "merge":
        from labkit.grading.publish import merge

        results = merge.merge_folders(args.parts, args.out)
        Console().print(scoreboard.terminal(results))
        print(f"merged {len(args.parts)} parts into {args.out / 'scoreboard.csv'}")
        return ExitCode.OK
    # a student's own: what their `make lab-N` runs ran, skipped and left out (labkit/student/report.py)
    from labkit.student import report as own

    build = args.build or BUILD
    if own.show_scoreboard(Path(build), args.out) is None:
        raise Stop(ExitCode.FAILED, f"no results yet in {build}: run `make lab-N` first")
    return ExitCode.OK


def _release(args) -> int:
    """Build the student release: a folder and a .tar.gz with no reference solution and no hidden test."""
    from labkit.course import release
    from labkit.student.loop import BUILD

    out = args.out or BUILD / "student-release"
    archive = release.build(out)
    print(f"wrote {out}/ and {archive}")
    return ExitCode.OK


def _gradescope(args) -> int:
    """Build the Gradescope autograder zip of one lab."""
    from labkit.grading.publish import gradescope

    path = gradescope.build(args.lab, args.out, isolation=args.isolation or "", course_policy=args.policy)
    print(f"wrote {path}")
    return ExitCode.OK


def _gradescope_run(args) -> int:
    from labkit.grading.publish import gradescope

    return gradescope.main_run(args)


def _add_gradescope(sub) -> None:
    gs = sub.add_parser("gradescope", help="the Gradescope autograder zip of one lab (TAs)")
    gs.add_argument("lab", help="the lab number, e.g. 3")
    gs.add_argument("--out", type=Path, default=None, help="the zip (default build/gradescope/lab-N.zip)")
    gs.add_argument(
        "--isolation",
        choices=["limits-only"],
        default=None,
        help="grade without the kit's sandbox where Gradescope refuses it (said in every result)",
    )
    gs.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="the course's policy (TOML), checked and shipped in the zip (default: the kit's tests/policy.toml)",
    )
    gs.set_defaults(func=_gradescope)
    gsr = sub.add_parser(
        "gradescope-run", help="inside the autograder: grade ROOT/submission into ROOT/results/results.json"
    )
    gsr.add_argument("lab", help="the lab number")
    gsr.add_argument("--root", type=Path, default=Path("/autograder"), help="default %(default)s")
    gsr.add_argument(
        "--isolation",
        choices=["limits-only"],
        default=None,
        help="without the sandbox, asked for by name when the zip was built",
    )
    gsr.set_defaults(func=_gradescope_run)


def parser() -> argparse.ArgumentParser:
    """Every command of `labkit`, each added by the function named for it (the nox sessions are tested
    against this parser: tests/kit/test_noxfile.py)."""
    p = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    _add_lab(sub)
    _add_course_tools(sub)
    _add_grade(sub)
    from labkit.grading import cluster
    from labkit.grading.publish import canvas
    from labkit.grading.review import command as review
    from labkit.grading.running import pods

    pods.add_parser(sub)
    canvas.add_parser(sub)
    review.add_parser(sub)
    _add_scoreboard(sub)
    _add_release(sub)
    _add_gradescope(sub)
    cluster.add_parser(sub)
    return p


def _add_lab(sub) -> None:
    """`labkit lab N`: the student loop."""
    lab = sub.add_parser("lab", help="run one lab on each device configuration and show what passed where")
    lab.add_argument("lab", help="the lab number, e.g. 3")
    lab.add_argument("--notebook", type=Path, help="the notebook to run (default: labs/lab-N.ipynb)")
    lab.add_argument("--configs", default=None, help=f"comma-separated, from: {', '.join(configs.CONFIGS)}")
    lab.add_argument(
        "--timeout",
        type=float,
        default=execute.DEFAULT_TIMEOUT,
        help="seconds one notebook may run on one configuration (default %(default)s)",
    )
    lab.add_argument("--hidden", action="store_true", help="also run the hidden tests (course staff)")
    lab.add_argument(
        "--keep-scratch",
        action="store_true",
        help="keep each run's scratch folder (build/lab-N/<config>/scratch/), to look at what it wrote",
    )
    lab.add_argument(
        "--record-costs",
        action="store_true",
        help="write the runs' cost cards as the lab's reference cards (course staff, with the reference)",
    )
    allowance.add_arguments(lab)
    modes.add_isolation_argument(lab, modes.AUTO)
    lab.set_defaults(func=_lab)


def _add_course_tools(sub) -> None:
    """What the course is and what this machine can do: list, configs, isolation, doctor, student-notebooks."""
    sub.add_parser("list", help="the labs, in the order the course reads them").set_defaults(func=_list)
    sub.add_parser("configs", help="the device configurations").set_defaults(func=_configs)
    sub.add_parser(
        "isolation", help="whether notebooks run in a sandbox here: which bwrap, or why none and the fix"
    ).set_defaults(func=_isolation)
    doc = sub.add_parser(
        "doctor", help="what this machine can do for the kit, what is missing, and the fixes"
    )
    doc.add_argument(
        "--for", dest="purposes", default="lab", help="lab, grade, test, docker, browser (comma-separated)"
    )
    doc.set_defaults(func=_doctor)

    gen = sub.add_parser("student-notebooks", help="generate labs/ from reference/")
    gen.add_argument("--check", action="store_true", help="only check that labs/ is up to date")
    gen.add_argument("--force", action="store_true", help="overwrite notebooks that were edited")
    gen.set_defaults(func=_student_notebooks)


def _add_grade(sub) -> None:
    """`labkit grade`: a class graded into a scoreboard (each flag one field of `grade.Request`)."""
    grd = sub.add_parser("grade", help="grade a class on every device configuration into a scoreboard (TAs)")
    grd.add_argument(
        "--submissions",
        type=Path,
        default=None,
        help="folder of <student_id>/lab-<N>.ipynb, or an LMS download: added to the term's sources, kept in "
        "OUT/course/term.json (default: the kept ones, else submissions)",
    )
    grd.add_argument(
        "--out", type=Path, default=Path("scoreboard"), help="where results go (default %(default)s)"
    )
    grd.add_argument(
        "--labs",
        default=None,
        help="comma-separated lab numbers: added to the term's and the only ones graded this run (default: the "
        "term's, else every lab)",
    )
    grd.add_argument(
        "--configs",
        default=None,
        help=f"comma-separated, from: {', '.join(configs.CONFIGS)}: added to the term's and the only ones "
        "graded this run (default: the term's, else every one available here)",
    )
    grd.add_argument("--jobs", type=int, default=None, help="notebooks run at once (default: one per core)")
    grd.add_argument(
        "--timeout",
        type=float,
        default=execute.DEFAULT_TIMEOUT,
        help="seconds one notebook may run on one configuration (default %(default)s)",
    )
    grd.add_argument("--shard", default=None, help="i/N: grade only the i-th of N parts of the class")
    from labkit.grading.state import course

    course.add_arguments(grd)  # --roster, --policy, --overrides, --extensions, ...: kept in OUT/course
    grd.add_argument(
        "--start",
        choices=("warm", "cold"),
        default="warm",
        help="warm: one server imports JAX once and forks each one-process CPU run's kernel, each in a "
        "sandbox of its own (cold where that cannot be had); cold: a fresh kernel per run "
        "(default %(default)s)",
    )
    grd.add_argument(
        "--runs-from",
        type=Path,
        default=None,
        help="the notebooks ran in pods of their own (`pods run`): read each unit's output from "
        "RUNS/<i>/ as untrusted data instead of running it (with --plan)",
    )
    grd.add_argument(
        "--plan", type=Path, default=None, help="the folder `pods plan` wrote (with --runs-from)"
    )
    allowance.add_arguments(grd)
    modes.add_isolation_argument(grd, modes.SANDBOX)
    grd.set_defaults(func=_grade)


def _add_scoreboard(sub) -> None:
    """`labkit scoreboard`, with `merge` and `export` for TAs."""
    board = sub.add_parser("scoreboard", help="your results across labs and configurations; `merge` for TAs")
    board.add_argument(
        "--build", type=Path, default=None, help="the build folder of `make lab-N` (default build/)"
    )
    board.add_argument("--out", type=Path, default=None, help="where to write it (default BUILD/scoreboard)")
    board.set_defaults(func=_scoreboard, action=None)
    actions = board.add_subparsers(dest="action")
    merge = actions.add_parser(
        "merge", help="merge the --out folders of sharded grading runs into one scoreboard"
    )
    merge.add_argument("parts", nargs="+", type=Path, help="the --out folders of the shards")
    merge.add_argument("--out", type=Path, required=True, help="where the merged scoreboard goes")
    export = actions.add_parser(
        "export", help="an LMS gradebook file (Canvas, or a plain wide CSV) from a graded --out folder"
    )
    export.add_argument("folder", type=Path, help="the --out folder of a grading run (SCOREBOARD_DIR)")
    export.add_argument("--format", choices=("canvas", "wide"), required=True)
    export.add_argument("--out", dest="export_out", type=Path, required=True, help="the file to write")
    export.add_argument(
        "--missing",
        choices=("blank", "excused"),
        default="blank",
        help="canvas: a lab not handed in is left blank, so Canvas keeps what it has, or marked EX "
        "(excused); never 0 (default %(default)s)",
    )


def _add_release(sub) -> None:
    """`labkit release`: the student release."""
    rel = sub.add_parser("release", help="build the student release (no solutions, no hidden tests)")
    rel.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the release folder; OUT.tar.gz is written next to it (default build/student-release)",
    )
    rel.set_defaults(func=_release)


def _endings() -> list[tuple[tuple[type[Exception], ...], ExitCode, str]]:
    """The kit's exceptions that end a command, the first match first: (types, status, the message's start).

    Imported only when a command ends with an exception, so that a quick command loads no grading module.
    """
    from labkit.course import release
    from labkit.grading import slurm
    from labkit.grading.intake import lms
    from labkit.grading.publish import canvas, gradescope, scoreboard
    from labkit.grading.running import pods
    from labkit.grading.state import adjustments, course, deadlines, errors, overrides, policy, roster
    from labkit.judge import judge

    return [
        ((modes.SandboxUnavailable,), ExitCode.NO_SANDBOX, "error: "),
        (
            (errors.ReferenceBroken,),
            ExitCode.FAILED,
            "error: ",
        ),  # the kit's own reference fails: not an input
        ((judge.KitError,), ExitCode.FAILED, "error: the kit could not grade: "),
        ((authoring.EditedNotebook, release.ReleaseError), ExitCode.FAILED, "error: "),
        (
            (
                catalog.UnknownLab,
                configs.UnknownConfig,
                errors.GradeError,
                course.InputError,
                scoreboard.MergeError,
                lms.LmsError,
                gradescope.GradescopeError,
                slurm.SlurmError,
                pods.PodError,
                canvas.CanvasError,
                roster.RosterError,
                policy.PolicyError,
                overrides.OverrideError,
                deadlines.DeadlineError,
                adjustments.AdjustmentError,
            ),
            ExitCode.REFUSED,
            "error: ",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run one command; the one place its exceptions become a message and an exit status (`ExitCode`)."""
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except Stop as e:
        print(e.message, file=sys.stderr)
        return int(e.status)
    except Exception as e:
        for types, status, start in _endings():
            if isinstance(e, types):
                print(f"{start}{e}", file=sys.stderr)
                return int(status)
        raise
