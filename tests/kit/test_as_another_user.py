"""The kit run by a user other than root: unprivileged bubblewrap, RLIMIT_NPROC, a shared private network.

Most machines that grade run the kit as an ordinary user; CI runs as root. When the tests run as
root, this module re-runs the tests whose code takes another path for other users as the user
`nobody` (65534), in a mount namespace of their own where the interpreter is reachable by others
(an interpreter under root's home would not be), and requires every one of them to pass.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from labkit.run import modes

pytestmark = pytest.mark.machine_wide  # see conftest.py: one worker runs such modules in turn

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534

# The battery's tricks whose reach depends on the user: through the bundled bwrap, in a user namespace.
BATTERY_TESTS = (
    "test_the_battery_runs_in_the_bwrap_that_setup_brings",
    "test_the_honest_submission_passes_everything_beside_the_tricks",
    "test_killing_the_parent_processes_reaches_nothing_outside_the_run",
    "test_the_reference_hidden_tests_other_runs_and_the_network_are_out_of_reach",
    "test_a_process_left_behind_neither_forges_the_results_nor_outlives_the_run",
)
# The tests whose code paths differ for a user other than root.
TESTS = [
    "tests/kit/test_multihost.py::test_the_processes_share_one_private_network_that_reaches_nothing_of_the_host",
    "tests/kit/test_sandbox.py::test_without_cgroups_a_fork_bomb_in_the_sandbox_stops_at_the_process_limit",
    "tests/kit/test_sandbox.py::test_a_fork_bomb_in_a_notebook_run_without_cgroups_is_refused_forks_not_timed_out",
    "tests/kit/test_sandbox.py::test_inside_the_sandbox_the_repository_and_network_are_absent_and_only_the_workdir_is_writable",
    "tests/kit/test_sandbox.py::test_the_memory_limit_stops_an_allocation",
    "tests/kit/test_execute.py::test_the_kernel_runs_in_the_sandbox_and_papermill_does_not",
    "tests/kit/test_execute.py::test_a_run_returns_the_signed_results_of_every_call",
    "tests/kit/test_isolation.py::test_without_a_system_bwrap_the_bundled_one_is_used",
    # no cgroup per run for that user here: one autogroup per run, its sessions held by the seccomp filter
    "tests/kit/test_fair_share.py::test_a_neighbour_keeps_its_share_beside_a_hog_as_the_kit_runs_here",
    # as in the course container (an ordinary user): the warm server starts before OUT/work exists
    "tests/kit/test_warm.py::test_grading_forks_every_kernel_from_a_warm_server_by_default",
    *(f"tests/kit/test_sandbox.py::{name}" for name in BATTERY_TESTS),
]
# Only those tricks run in the battery as that user (the full battery already ran as root). Not the fork
# bomb: for a user other than root RLIMIT_NPROC counts all of that user's tasks, so beside the battery's
# other runs its bound is theirs too; the bare and notebook fork bomb tests above check that limit alone.
BATTERY = "kill_parents,read_secrets,forge_results_later"
# The battery's tests run twice, with cold and with warm starts (see test_sandbox.battery).
EXPECTED = len(TESTS) + len(BATTERY_TESTS)


def _closed_to_others(path: Path) -> Path | None:
    """The highest folder above `path` that other users may not enter, if any."""
    for folder in reversed(path.parents):
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the tests already run as a user other than root"
    if not all(shutil.which(t) for t in ("unshare", "setpriv")):
        return "needs unshare and setpriv (util-linux)"
    if modes.isolation()[0] != modes.BUBBLEWRAP:
        return "bubblewrap does not work here"
    if (
        _closed_to_others(ROOT / "labkit")
        or not os.stat(ROOT / "labkit" / "__init__.py").st_mode & stat.S_IROTH
    ):
        return "the repository is not readable by other users"
    return None


def in_a_namespace_where_others_reach_the_interpreter(
    home: Path, command: list[str], timeout: float
) -> subprocess.CompletedProcess:
    """Run `command` (as root) in a mount namespace of the test's own: a fresh root-owned tmpfs (open to
    others) over the folder that closes the interpreter's prefix to others, with the prefix bound back
    in its place (staged under `home`)."""
    prefix = Path(sys.base_prefix).resolve()
    closed = _closed_to_others(prefix)
    staged, prefix_q = shlex.quote(f"{home}/prefix"), shlex.quote(str(prefix))
    reopen = (
        ""
        if closed is None
        else (
            f"mkdir -p {staged} && mount --bind {prefix_q} {staged} && "
            f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(closed))} && mkdir -p {prefix_q} && "
            f"mount --move {staged} {prefix_q} && "
        )
    )
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-ec",
            reopen + "exec " + shlex.join(command),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


WHY_NOT = _why_not()  # once: whether bubblewrap works is found by running it


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_as_an_ordinary_user_the_sandbox_limits_and_shared_network_hold():
    home = Path(tempfile.mkdtemp(prefix="labkit-nobody-"))
    try:
        os.chown(home, NOBODY, NOBODY)
        pytest_cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={home}/pt",
            "-o",
            "addopts=",
            *TESTS,
        ]
        as_nobody = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "env",
            "-i",
            f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
            f"HOME={home}",
            f"LABKIT_BATTERY={BATTERY}",
            *pytest_cmd,
        ]
        done = in_a_namespace_where_others_reach_the_interpreter(home, as_nobody, timeout=1800)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and f"{EXPECTED} passed" in summary, done.stdout[-4000:] + done.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# Slurm for an ordinary user: the user submits, slurmd runs the shards and the merge as that user.


def _slurm_missing() -> str | None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import slurm_cluster

    return slurm_cluster.missing()


@pytest.mark.skipif(
    WHY_NOT is not None or _slurm_missing() is not None, reason=str(WHY_NOT or _slurm_missing())
)
def test_as_an_ordinary_user_a_class_graded_through_slurm_equals_a_local_run():
    import csv
    import json

    from labkit.grading.intake import collect

    names = [f"student{i}" for i in range(20)]
    students = [n for n in names if collect.shard_of(n, 2) == 1][:2] + [
        n for n in names if collect.shard_of(n, 2) == 2
    ][:1]
    home = Path(tempfile.mkdtemp(prefix="labkit-nobody-slurm-"))
    try:
        os.chmod(home, 0o755)
        submissions = home / "submissions"
        for i, student in enumerate(students):
            (submissions / student).mkdir(parents=True)
            shutil.copy(
                ROOT / ("reference" if i == 0 else "labs") / "lab-1.ipynb",
                submissions / student / "lab-1.ipynb",
            )
        out = home / "out"
        out.mkdir()
        for path in (home, out, *submissions.rglob("*"), submissions):
            os.chown(path, NOBODY, NOBODY)
        helper = [
            sys.executable,
            str(Path(__file__).resolve().parent / "slurm_as_user.py"),
            str(home / "slurm"),
            str(submissions),
            str(out),
            str(home),
            str(NOBODY),
        ]
        done = in_a_namespace_where_others_reach_the_interpreter(home, helper, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["returncode"] == 0, result["stdout"][-3000:] + result["stderr"][-3000:]
        assert "shards finished 2/2" in result["stderr"], result["stderr"][-2000:]
        assert result["queued_by"] == []
        with open(out / "scoreboard.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert {r["student"] for r in rows} == set(students)
        assert {r["isolation"] for r in rows} == {"bubblewrap"}
        passed = {r["student"]: r["passed"] == r["total"] for r in rows}
        assert passed == {s: i == 0 for i, s in enumerate(students)}, rows
        # the shards and the merge ran as that user: every file they wrote is the user's
        assert [str(p) for p in out.rglob("*") if p.lstat().st_uid != NOBODY] == []
    finally:
        shutil.rmtree(home, ignore_errors=True)
