"""The commands that grade a class beyond one machine's one run: `slurm-grade` (an array job of shards and a
merge job, followed until they end), `slurm-merge` (that merge job) and `progress` (how far a run's shards
have got, on any engine). `labkit.cli` adds them with `add_parser`; the work is `slurm`'s and `progress`'.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.exitcodes import ExitCode, Stop
from labkit.grading.state import course as course_mod
from labkit.run import execute

if TYPE_CHECKING:
    from labkit.grading import slurm


def _slurm_grade(args) -> int:
    """Submit the class to Slurm as an array job of shards and a merge job; follow it unless --no-wait."""
    from labkit.grading import slurm

    _refuse_inputs_after_the_dashes(args.grade_args)
    course = (args.course or args.out / "course").absolute()
    request = _request(args, course)
    array, merge = _submit(args, request, course)
    print(
        f"submitted: array job {array} ({args.shards} shards), merge job {merge} after it; "
        f"logs in {request.out / 'slurm'}",
        flush=True,
    )
    if args.no_wait:
        print(
            f"follow it with: python -m labkit progress {request.out} --watch    "
            f"(cancel: scancel {array} {merge})"
        )
        return ExitCode.OK
    try:
        return slurm.follow(request.out, array, merge, args.shards, every=args.every)
    except KeyboardInterrupt:
        raise Stop(
            ExitCode.INTERRUPTED, f"stopped following; the jobs go on (scancel {array} {merge} ends them)"
        ) from None


def _refuse_inputs_after_the_dashes(grade_args: list[str]) -> None:
    """The TA's inputs go to slurm-grade itself, which checks and keeps them; after `--` every shard would."""
    kept = {f"--{n}" for n in course_mod.INPUTS} | {
        "--submissions",
        "--labs",
        "--configs",
        "--course",
        "--forget",
        "--change-policy",
        "--students",
        "--retry",
    }
    passed = sorted({a.split("=")[0] for a in grade_args} & kept)
    if passed:
        raise Stop(
            ExitCode.REFUSED,
            f"error: give {', '.join(passed)} to slurm-grade itself, not after --: it checks them before any "
            "job is submitted and keeps them in the course's state and the term that every shard reads",
        )


def _request(args, course: Path) -> slurm.Request:
    """The jobs to submit: every shard grades the term and the course's state kept in `course`."""
    from labkit.grading import slurm

    extra = (
        ["--course", str(course)]
        + (["--students", args.students] if args.students else [])
        + (["--retry"] if args.retry else [])
    )
    return slurm.Request(
        args.submissions.absolute() if args.submissions is not None else None,
        args.out.absolute(),
        args.shards,
        labs=args.labs,
        configs=args.configs,
        jobs=args.jobs,
        timeout=args.timeout,
        partition=args.partition,
        account=args.account,
        extra=tuple(extra + args.grade_args),
    )


def _submit(args, request: slurm.Request, course: Path) -> tuple[str, str]:
    """Check and keep the TA's inputs and the term, then submit: the array job's id and the merge job's."""
    from labkit.grading import grade, slurm

    try:
        slurm.check_out(request.out, args.course)
        # the TA's inputs and the term checked and kept before any job is submitted; every shard reads them
        inputs = course_mod.request_fields(args) | {"course": course}
        term = grade.prepare(
            request.submissions,
            request.out,
            students=args.students,
            labs=args.labs,
            config_names=args.configs,
            **inputs,
        )
        request.term_configs = ",".join(term.configs)  # what the shards ask Slurm for (a GPU)
        return slurm.submit(request)
    except KeyError as e:  # a configuration or lab the course does not have, named by the key
        raise Stop(ExitCode.REFUSED, f"error: {e}") from e


def _slurm_merge(args) -> int:
    from labkit.grading import slurm
    from labkit.grading.publish import scoreboard

    try:
        _, failed = slurm.merge(args.out, args.shards)
    except (slurm.SlurmError, scoreboard.MergeError) as e:  # the merge job: a shard's results are missing
        raise Stop(ExitCode.FAILED, f"error: {e}") from e
    print(
        f"merged {args.shards - len(failed)} of {args.shards} shards into {args.out / 'scoreboard.csv'}"
        + (f"; not finished: shard {', '.join(map(str, failed))}" if failed else "")
    )
    return ExitCode.FAILED if failed else ExitCode.OK


def _progress(args) -> int:
    from labkit.grading.running import progress

    if args.watch:
        progress.watch(args.out, args.every, sys.stdout)
    else:
        print(progress.summary(progress.parts(args.out)))
    return ExitCode.OK


def add_parser(sub) -> None:
    """`slurm-grade`, `slurm-merge` and `progress`."""
    sl = sub.add_parser(
        "slurm-grade", help="grade a class on a Slurm cluster: an array job of shards, then a merge"
    )
    sl.add_argument(
        "--submissions",
        type=Path,
        default=None,
        help="a download or folder added to the term (default: the term's kept sources, or submissions/)",
    )
    sl.add_argument(
        "--out", type=Path, default=Path("scoreboard"), help="default %(default)s (a shared folder)"
    )
    sl.add_argument("--shards", type=int, required=True, help="how many array tasks share the class")
    sl.add_argument("--labs", default=None)
    sl.add_argument("--configs", default=None)
    sl.add_argument(
        "--jobs", type=int, default=2, help="notebooks each shard runs at once: its CPUs (default 2)"
    )
    sl.add_argument("--timeout", type=float, default=execute.DEFAULT_TIMEOUT)
    sl.add_argument("--partition", default=None)
    sl.add_argument("--account", default=None)
    sl.add_argument("--no-wait", action="store_true", help="submit and return at once")
    sl.add_argument("--every", type=float, default=10.0, help="seconds between progress lines (default 10)")
    # the same TA inputs as `grade`, checked here and kept in OUT/course for every shard
    course_mod.add_arguments(sl)
    sl.add_argument(
        "grade_args", nargs="*", help="after --: more `grade` arguments for every shard (--roster ..)"
    )
    sl.set_defaults(func=_slurm_grade)
    mg = sub.add_parser(
        "slurm-merge", help="(the merge job) merge OUT/shards/* into OUT, naming shards that failed"
    )
    mg.add_argument("--out", type=Path, required=True)
    mg.add_argument("--shards", type=int, required=True)
    mg.set_defaults(func=_slurm_merge)
    pr = sub.add_parser("progress", help="how far a grading run (or its shards, on any engine) has got")
    pr.add_argument("out", type=Path, help="the grading run's --out folder")
    pr.add_argument(
        "--watch", action="store_true", help="print a line every few seconds until every shard is done"
    )
    pr.add_argument("--every", type=float, default=10.0)
    pr.set_defaults(func=_progress)
