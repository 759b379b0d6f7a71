"""A CPU share and a process cap for each run without root, in a cgroup v2 subtree handed to the kit.

Most tests play the kernel's part with a folder of the same files (the kit only reads and writes
them); the last one runs where this machine hands the kit a v2 cgroup with the cpu controller.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.run import allowance, cgroup, cgroup2, modes, sandbox


def kit_group(root: Path, controllers: str = "cpu pids memory", members: list[int] | None = None) -> Path:
    """A v2 cgroup as the kernel shows one handed to the kit: its controllers, its processes, none handed down."""
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    group = root / "user.slice" / "grading.scope"
    group.mkdir(parents=True)
    (group / "cgroup.controllers").write_text(controllers + "\n")
    (group / "cgroup.subtree_control").write_text("")
    (group / "cgroup.procs").write_text("\n".join(str(p) for p in (members or [os.getpid()])) + "\n")
    return group


def test_the_kits_own_cgroup_is_read_from_the_unified_line(tmp_path):
    group = kit_group(tmp_path)
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/user.slice/grading.scope\n")
    assert cgroup2.own(tmp_path, proc) == group


def test_a_hybrid_machine_without_the_unified_controllers_has_no_v2_cgroup(tmp_path):
    proc = tmp_path / "proc-cgroup"
    proc.write_text("4:memory:/x\n1:cpu:/\n0::/\n")
    assert cgroup2.own(tmp_path / "nothing-mounted", proc) is None


def test_the_kit_moves_its_processes_into_a_leaf_and_hands_cpu_and_pids_down(tmp_path):
    group = kit_group(tmp_path)
    assert cgroup2.prepare(group)
    assert (group / cgroup2.LEAF / "cgroup.procs").read_text() == str(os.getpid())
    assert (group / "cgroup.subtree_control").read_text().split() == ["+cpu", "+pids", "+memory"]


def test_where_the_controllers_cannot_be_handed_down_the_move_is_undone(tmp_path):
    group = kit_group(tmp_path)
    (group / "cgroup.subtree_control").unlink()
    (group / "cgroup.subtree_control").mkdir()  # a write there fails, as the kernel's EBUSY or EACCES would
    assert not cgroup2.prepare(group)
    assert (group / "cgroup.procs").read_text() == str(os.getpid())  # the kit is back where it was
    # (a real cgroup's leaf is removed with it; a folder holding a plain cgroup.procs file cannot be)


def test_without_the_cpu_controller_handed_to_the_kit_no_cgroup_is_made(tmp_path):
    group = kit_group(tmp_path, controllers="memory pids")
    assert not cgroup2.prepare(group)
    assert not (group / cgroup2.LEAF).exists()


def test_every_run_gets_the_same_cpu_weight_and_a_process_cap_of_its_own(tmp_path):
    group = kit_group(tmp_path)
    assert cgroup2.prepare(group)
    first, second = (cgroup2.run_group(group, 160, 3 << 30) for _ in range(2))
    assert first != second
    for run in (first, second):
        assert (run / "cpu.weight").read_text() == str(cgroup2.CPU_WEIGHT)
        assert (run / "pids.max").read_text() == "160"
        assert (run / "memory.max").read_text() == str(3 << 30)
        assert cgroup.counts_processes([run])  # so no RLIMIT_NPROC is needed beside it


def test_memory_is_capped_only_where_its_controller_was_handed_down(tmp_path):
    group = kit_group(tmp_path, controllers="cpu pids")
    assert cgroup2.prepare(group)
    run = cgroup2.run_group(group, 160, 3 << 30)
    assert (run / "pids.max").exists() and not (run / "memory.max").exists()


def test_whether_a_cgroup_is_usable_is_told_without_moving_anything(tmp_path):
    group = kit_group(tmp_path)
    assert cgroup2.usable(group)
    assert not (group / cgroup2.LEAF).exists() and (group / "cgroup.subtree_control").read_text() == ""
    (tmp_path / "other").mkdir()
    assert not cgroup2.usable(kit_group(tmp_path / "other", controllers="memory pids"))


def isolation_command(**env) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "isolation"],
        env=os.environ | env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    return done.stdout


@pytest.mark.skipif(
    os.geteuid() != 0
    or not (Path("/sys/fs/cgroup/cpu") / "cgroup.procs").exists()
    or modes.isolation()[0] != modes.BUBBLEWRAP,
    reason="needs root, a v1 cpu controller and a sandbox",
)
def test_the_isolation_command_says_which_cpu_share_runs_get_here():
    assert "CPU share: a v1 cpu cgroup per run (cpu.shares 1024), made as root" in isolation_command()
    # without cgroups, one autogroup per run where the kernel's autogroups hold here (labkit.run.sessions), else none
    share = "one scheduling group per run: the kernel's autogroups" if cgroup.autogroups() else "none"
    without = isolation_command(LABKIT_CGROUPS="off")
    assert f"CPU share: {share}" in without and "cgroups are turned off (LABKIT_CGROUPS=off)" in without, (
        without
    )


DELEGATED = os.geteuid() != 0 and cgroup.delegated_cgroup() is not None


@pytest.mark.skipif(
    not DELEGATED,
    reason="this machine hands the kit no v2 cgroup with the cpu controller "
    "(e.g. systemd-run --user --scope -p Delegate=yes)",
)
def test_a_run_launched_without_root_lives_in_a_cpu_weighted_cgroup_of_its_own(tmp_path):
    log = io.BytesIO()
    run = sandbox.launch(
        [sys.executable, "-c", "import time; time.sleep(3)"],
        sandbox.RunContext(tmp_path / "work", {}, log, allowance.Limits(processes=50)),
    )
    try:
        (group,) = run.cgroups
        deadline = time.monotonic() + 10
        while run.pid not in [int(p) for p in (group / "cgroup.procs").read_text().split()]:
            assert time.monotonic() < deadline, "the run never joined its cgroup"
            time.sleep(0.05)
        assert (group / "cpu.weight").read_text().strip() == str(cgroup2.CPU_WEIGHT)
        assert (group / "pids.max").read_text().strip() == "50"
    finally:
        run.kill()
        run.wait()
    assert not group.exists()
