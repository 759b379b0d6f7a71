"""Grade a class on a Slurm cluster: an array job of shards, then one merge job, and a way to follow both.

    python -m labkit slurm-grade --out DIR --shards N [--submissions DIR] [--labs ..] [--configs ..]
                                 [--partition P] [--account A] [--jobs J] [--no-wait]

Array task i grades shard i/N of the class exactly as `grade --shard i/N` does on one machine, in the
kit's sandbox, into OUT/shards/<i>/. It is given no --submissions: it grades the term kept in the course's
folder (labkit/grading/state/term.py, checked and kept by `grade.prepare` before anything is submitted), so
its OUT/shards/<i>/collected adds up the term's downloads in their order, as a local run's does, and the
bare command means "the same again" here too; its exit status goes to OUT/slurm/shard-<i>.exit. The merge job
runs after every task has ended, however it ended (`--dependency=afterany`), merges the shards that
finished into OUT (the same scoreboard as one local run), and names any shard that did not. The kit
must be at the same path on every node (a clone on a shared file system, set up once with
`make setup`): the jobs run its `.venv` from there. Everything the jobs write lies under OUT, which
must be shared too.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.course import catalog, configs
from labkit.grading.publish import merge as merge_mod
from labkit.grading.running import progress
from labkit.grading.state.files import write_atomic
from labkit.run.allowance import DEFAULT_LIMITS, GiB

KIT_MEMORY = 1 * GiB  # what the kit's own grading process needs beside its notebooks' runs


class SlurmError(RuntimeError):
    """Slurm cannot be used as asked; the message says why and what to do."""


@dataclass
class Request:
    submissions: Path | None  # added to the term by `grade.prepare`; None: the term's kept sources
    out: Path
    shards: int
    labs: str | None = None
    configs: str | None = None
    jobs: int = 2
    timeout: float = 120.0
    partition: str | None = None
    account: str | None = None
    extra: tuple[
        str, ...
    ] = ()  # more `grade` arguments, passed to every shard as they are (--course, --students ..)
    term_configs: str | None = None  # the term's configurations, where --configs is not given


def resources(request: Request) -> list[str]:
    """sbatch options for one shard: a CPU per parallel notebook, their memory, a GPU for the gpu configuration."""
    names = request.configs or request.term_configs
    chosen = [configs.CONFIGS[n.strip()] for n in names.split(",")] if names else []
    if any(c.platform == "tpu" for c in chosen):
        raise SlurmError(
            "the tpu configuration cannot be graded through Slurm (TPU VMs are not Slurm nodes): "
            "grade it on the TPU VM with `make grade CONFIGS=tpu`"
        )
    memory = request.jobs * DEFAULT_LIMITS.memory + KIT_MEMORY
    options = [f"--cpus-per-task={request.jobs}", f"--mem={memory // (1 << 20)}M"]
    if any(c.platform == "gpu" for c in chosen):
        options.append("--gres=gpu:1")
    if request.partition:
        options.append(f"--partition={request.partition}")
    if request.account:
        options.append(f"--account={request.account}")
    return options


def _grade_command(request: Request, python: Path) -> list[str]:
    args = [
        str(python),
        "-m",
        "labkit",
        "grade",
        "--jobs",
        str(request.jobs),
        "--timeout",
        f"{request.timeout:g}",
    ]
    if request.labs:
        args += ["--labs", request.labs]
    if request.configs:
        args += ["--configs", request.configs]
    return args + list(request.extra)


def scripts(request: Request, kit: Path = catalog.ROOT) -> dict[str, str]:
    """The two batch scripts, by name: the array job's and the merge job's."""
    python = kit / ".venv" / "bin" / "python"
    out, logs = request.out, request.out / "slurm"
    head = ["#!/bin/bash", f"cd {shlex.quote(str(kit))} || exit 1"]
    grade = " ".join(shlex.quote(a) for a in _grade_command(request, python))
    shard = [
        *head,
        'i="$SLURM_ARRAY_TASK_ID"',
        # In the background, so that a scancel's SIGTERM (sent to every process of the step, this shell too) runs
        # the trap and the shard's status is still written: the shell waits for the grade to end, however it ends.
        f'{grade} --out {shlex.quote(str(out))}/shards/"$i" --shard "$i"/{request.shards} &',
        "child=$!",
        "trap 'kill -TERM \"$child\" 2>/dev/null' TERM",
        'while kill -0 "$child" 2>/dev/null; do wait "$child"; done',
        'wait "$child"',  # its own status (a wait the trap ended returns 143), which the shell keeps once it ended
        "status=$?",
        f'echo "$status" > {shlex.quote(str(logs))}/shard-"$i".exit',
        'exit "$status"',
    ]
    merge = [
        *head,
        (
            f"exec {shlex.quote(str(python))} -m labkit slurm-merge --out {shlex.quote(str(out))} "
            f"--shards {request.shards}"
        ),
    ]
    return {"shard.sh": "\n".join(shard) + "\n", "merge.sh": "\n".join(merge) + "\n"}


def _sbatch(args: list[str]) -> str:
    """Run sbatch --parsable and return the job id; SlurmError with sbatch's own words otherwise."""
    done = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def submit(request: Request, kit: Path = catalog.ROOT) -> tuple[str, str]:
    """Submit the array job and the merge job; (array job id, merge job id)."""
    if shutil.which("sbatch") is None:
        raise SlurmError(
            "sbatch is not on the PATH: run this on a Slurm login node (or install Slurm's client)"
        )
    if request.shards < 1:
        raise SlurmError(f"--shards must be at least 1, got {request.shards}")
    if not (kit / ".venv" / "bin" / "python").exists():
        raise SlurmError(
            f"{kit}/.venv does not exist: run `make setup` in the kit once (on the shared file system)"
        )
    if request.submissions is not None and not request.submissions.exists():
        raise SlurmError(f"the submissions folder {request.submissions} does not exist")
    logs = request.out / "slurm"
    logs.mkdir(parents=True, exist_ok=True)
    for name, text in scripts(request, kit).items():
        write_atomic(logs / name, text)
    for stale in logs.glob("shard-*.exit"):  # a previous submission's statuses would read as this one's
        stale.unlink()
    for stale in (request.out / "shards").glob(
        "*/progress.json"
    ):  # and its counts as this one's (`progress`)
        stale.unlink()
    submitted = time.time()
    common = ["--job-name=labkit-grade", f"--chdir={kit}"]
    array = _sbatch(
        [
            *common,
            *resources(request),
            f"--array=1-{request.shards}",
            f"--output={logs}/shard-%a.log",
            str(logs / "shard.sh"),
        ]
    )
    merge = _sbatch(
        [
            *common,
            "--cpus-per-task=1",
            f"--mem={KIT_MEMORY // (1 << 20)}M",
            f"--dependency=afterany:{array}",
            f"--output={logs}/merge.log",
            *([f"--partition={request.partition}"] if request.partition else []),
            *([f"--account={request.account}"] if request.account else []),
            str(logs / "merge.sh"),
        ]
    )
    write_atomic(
        logs / "jobs.json",
        json.dumps({"array": array, "merge": merge, "shards": request.shards, "submitted": submitted}),
    )
    return array, merge


def shard_exits(out: Path, shards: int) -> dict[int, int | None]:
    """Each shard's exit status as its task recorded it (None: not ended, or killed before it could say)."""
    exits: dict[int, int | None] = {}
    for i in range(1, shards + 1):
        try:
            exits[i] = int((Path(out) / "slurm" / f"shard-{i}.exit").read_text().strip())
        except (OSError, ValueError):
            exits[i] = None
    return exits


def merge(out: Path, shards: int) -> tuple[dict, list[int]]:
    """Merge the shards that wrote a scoreboard into OUT; (results, the shards that did not)."""
    out = Path(out)
    exits = shard_exits(out, shards)
    found, failed = [], []
    for i in range(1, shards + 1):
        folder = out / "shards" / str(i)
        if exits[i] == 0 and (folder / "scoreboard.json").is_file():
            found.append(folder)
        else:
            failed.append(i)
    if not found:
        raise SlurmError(f"no shard finished: see {out / 'slurm'}/shard-*.log")
    notes = []
    for i in failed:
        why = f"exit status {exits[i]}" if exits[i] is not None else "it was ended before it could finish"
        notes.append(
            f"shard {i} of {shards} did not finish ({why}; its log: {out / 'slurm'}/shard-{i}.log): its "
            f"students are not in this scoreboard; grade them again with `grade --shard {i}/{shards}`"
        )
    return merge_mod.merge_folders(found, out, notes), failed


def check_out(out: Path, course: Path | None = None) -> None:
    """Refuse an OUT that holds a local grading run: the merge would write its scoreboard over that one's."""
    out = Path(out)
    if (out / "units").is_dir() and not (out / "slurm").is_dir():
        kept = out / "course"
        raise SlurmError(
            f"{out} holds a grading run made here (its units/ and scoreboard): a Slurm run writes its "
            f"own scoreboard into OUT and would replace it. Give another OUT= on the shared file "
            f"system"
            + (
                f"; the class's inputs kept in {kept} come along with COURSE={kept}"
                if (kept / "manifest.json").is_file() and course is None
                else ""
            )
        )


def queued(job_ids: list[str]) -> bool:
    """Whether any of these jobs is still pending or running (squeue lists it)."""
    done = subprocess.run(
        ["squeue", "--noheader", "--format=%i", "--jobs", ",".join(job_ids)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0 and bool(done.stdout.strip())


def parts_with_exits(out: Path, shards: int, *, ended: bool = False) -> list[progress.Part]:
    """Each shard's progress with the exit status its task recorded. `ended`: its jobs have left the queue, so a
    shard that recorded no exit status (cancelled, or killed before it could say), whether or not it began, has
    failed (-1), as the merge counts it."""
    found = progress.parts(out)
    exits = shard_exits(out, shards)
    for part in found:
        part.exit = exits.get(int(part.name)) if part.name.isdigit() else None
    if ended:
        found += [
            progress.Part(str(i)) for i in range(1, shards + 1) if str(i) not in {p.name for p in found}
        ]
        for part in found:
            if part.name.isdigit() and part.exit is None:
                part.exit = -1
    return found


def follow(out: Path, array: str, merge_id: str, shards: int, stream=None, every: float = 5.0) -> int:
    """Show progress until the merge job has ended; 0 when every shard finished, 1 otherwise."""
    stream = stream or sys.stderr
    while queued([array, merge_id]):
        print(progress.summary(parts_with_exits(out, shards)), file=stream, flush=True)
        time.sleep(every)
    print(progress.summary(parts_with_exits(out, shards, ended=True)), file=stream, flush=True)
    if not (Path(out) / "scoreboard.json").is_file():
        print(
            f"error: the merge job wrote no scoreboard: see {Path(out) / 'slurm' / 'merge.log'}", file=stream
        )
        return 1
    failed = [i for i, status in shard_exits(out, shards).items() if status != 0]
    print(
        f"scoreboard: {Path(out) / 'scoreboard.csv'}"
        + (f" (shards that did not finish: {', '.join(map(str, failed))})" if failed else ""),
        file=stream,
    )
    return 1 if failed else 0
