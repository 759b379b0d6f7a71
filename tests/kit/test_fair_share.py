"""One run cannot take the processors from the run beside it by starting many busy processes.

A hostile run starts 24 processes that spin, each trying to leave for a session of its own (with the
kernel's autogroups, a session is a scheduling group weighing as much as a whole run); an honest
neighbour, started beside it, spins until it has used a fixed amount of CPU time. Both are real
launches (`sandbox.launch`), and each run's CPU time is read from `/proc` over the same window,
so what is checked is the share, not the speed of a busy machine: the neighbour must get at least
a third of what both runs got, and finish its work well within its timeout. Without a CPU share per
run it gets about one part in 25.

The mechanism differs by machine (a cgroup per run as root, else one autogroup per run, see
docs/sandbox.md, 'Limits'); each case names the one it expects, which the run's handle states.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from labkit.run import cgroup, modes, processes, sandbox, sessions
from labkit.run.allowance import Limits

HOG = """import os, time
for _ in range(24):
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            pass
        while True:
            pass
time.sleep(300)
"""
WORK = 1.5  # CPU seconds the neighbour must use; alone on a core, about as many seconds
NEIGHBOUR = f"""import time
while time.process_time() < {WORK}:
    pass
print("done", flush=True)
time.sleep(30)
"""
TIMEOUT = (
    12.0  # the neighbour's: a fair half of a core, even beside other work on the machine, needs far less
)
FAIR = (
    1 / 3
)  # the neighbour's least part of the CPU time both runs got (an even share: 1/2; none: about 1/25)
TICKS = os.sysconf("SC_CLK_TCK")
LIMITS = Limits(processes=200)


def _cpu_seconds(run: sandbox.Sandboxed) -> float:
    """The CPU time (user and system) of the run's processes that are alive now."""
    total = 0
    for pid in [run.pid, *processes.descendants(run.pid)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def _launch(folder: Path, code: str, limits: Limits) -> tuple[sandbox.Sandboxed, Path]:
    """The run of `code`, and the file its output goes to (open until the run has ended)."""
    log = folder / "log"
    out = open(log, "wb")  # noqa: SIM115 - closed by the run's end (`_end`)
    run = sandbox.launch(
        [sys.executable, "-c", code],
        sandbox.RunContext(folder / "work", {"PATH": os.environ["PATH"]}, out, limits),
    )
    run.log_file = out
    return run, log


def _end(run: sandbox.Sandboxed) -> None:
    run.kill()
    run.wait()
    run.log_file.close()


def _beside_a_hog(tmp_path: Path, limits: Limits) -> tuple[float, float | None, list[str]]:
    """(the neighbour's part of both runs' CPU time, its seconds to finish or None, both runs' mechanisms)."""
    (tmp_path / "hog").mkdir()
    (tmp_path / "neighbour").mkdir()
    hog, _ = _launch(tmp_path / "hog", HOG, limits)
    neighbour = None
    try:
        deadline = time.monotonic() + 30
        while len(processes.descendants(hog.pid)) < 24 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the hog's processes are all spinning
        neighbour, log = _launch(tmp_path / "neighbour", NEIGHBOUR, limits)
        began = time.monotonic()
        time.sleep(0.5)  # past the interpreter's start, which is not the neighbour's work
        n0, h0 = _cpu_seconds(neighbour), _cpu_seconds(hog)
        finished = None
        while time.monotonic() - began < TIMEOUT:
            n1, h1 = _cpu_seconds(neighbour), _cpu_seconds(hog)
            if b"done" in log.read_bytes():
                finished = time.monotonic() - began
                break
            time.sleep(0.1)
        part = (n1 - n0) / max((n1 - n0) + (h1 - h0), 1e-9)
        return part, finished, [hog.cpu_share, neighbour.cpu_share]
    finally:
        for run in (hog, neighbour):
            if run is not None:
                _end(run)


def _fair(tmp_path: Path, limits: Limits, mechanism: str) -> None:
    part, finished, mechanisms = _beside_a_hog(tmp_path, limits)
    assert part >= FAIR, f"the neighbour got {part:.0%} of the CPU time beside a hog of 24 processes"
    assert finished is not None, f"the neighbour did not finish {WORK} CPU seconds of work within {TIMEOUT} s"
    assert mechanisms == [mechanism, mechanism]


AUTOGROUPS = pytest.mark.skipif(
    not cgroup.autogroups(),
    reason="the kernel's autogroups do not hold for the kit "
    "here (off, or the kit is in a cpu cgroup below the root)",
)


def _as_the_kit_runs_here() -> str:
    groups = cgroup.make_cgroups(LIMITS)
    for g in groups:
        cgroup.remove_cgroup(g)
    return cgroup.share_of(groups, sessions.available())


@pytest.mark.skipif(
    _as_the_kit_runs_here() == cgroup.NO_SHARE, reason="runs get no CPU share of their own here"
)
def test_a_neighbour_keeps_its_share_beside_a_hog_as_the_kit_runs_here(tmp_path):
    _fair(tmp_path, LIMITS, _as_the_kit_runs_here())


@AUTOGROUPS
@pytest.mark.skipif(modes.isolation()[0] != modes.BUBBLEWRAP, reason="bubblewrap cannot make a sandbox here")
def test_without_cgroups_a_sandboxed_neighbour_keeps_its_share_as_one_autogroup(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")  # as for a user other than root, handed no v2 cgroup
    _fair(tmp_path, LIMITS, sessions.AUTOGROUP)


@AUTOGROUPS
def test_without_cgroups_or_a_sandbox_a_neighbour_keeps_its_share_as_one_autogroup(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")
    _fair(tmp_path, Limits(processes=200, isolation=modes.LIMITS_ONLY), sessions.AUTOGROUP)


@AUTOGROUPS
@pytest.mark.parametrize("isolation", [modes.AUTO, modes.LIMITS_ONLY])
def test_a_run_may_not_start_a_session_of_its_own(tmp_path, monkeypatch, isolation):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")
    code = (
        "import os, subprocess\nif os.fork() == 0:\n    try:\n        os.setsid()\n    except OSError as e:\n"
        "        print('setsid:', e.strerror, flush=True)\n    os.setpgid(0, 0)\n"
        "    print('own group:', os.getpgid(0) == os.getpid(), flush=True)\n    os._exit(0)\nos.wait()\n"
        "try:\n    subprocess.run(['true'], start_new_session=True)\nexcept OSError as e:\n"
        "    print('new session:', e.strerror)\n"
    )
    run, log = _launch(tmp_path, code, Limits(isolation=isolation))
    run.wait(60)
    _end(run)
    said = log.read_text()
    assert "setsid: Operation not permitted" in said and "new session: Operation not permitted" in said, said
    assert "own group: True" in said, (
        said
    )  # process groups (job control, jupyter's signals) are still allowed


def _machine(tmp_path: Path, cgroup: str, mounts: list[str], enabled: str = "1") -> dict:
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "mountinfo").write_text("".join(line + "\n" for line in mounts))
    (tmp_path / "enabled").write_text(enabled + "\n")
    return {"proc": tmp_path / "cgroup", "mounts": tmp_path / "mountinfo", "enabled": tmp_path / "enabled"}


V1_CPU = "32 31 0:29 {root} /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"


def test_autogroups_hold_in_the_root_of_a_v1_cpu_hierarchy_and_only_when_on(tmp_path):
    here = _machine(tmp_path, "2:cpuacct:/\n1:cpu:/\n0::/\n", [V1_CPU.format(root="/")])
    assert sessions.in_effect(**here)
    assert not sessions.in_effect(**_machine(tmp_path, "1:cpu:/\n", [V1_CPU.format(root="/")], enabled="0"))


def test_autogroups_do_not_hold_in_a_cpu_cgroup_or_a_containers_view_of_one(tmp_path):
    assert not sessions.in_effect(**_machine(tmp_path, "1:cpu:/docker/abc\n", [V1_CPU.format(root="/")]))
    # a cgroup namespace shows its own cgroup as "/": the mount's root says where it really is
    assert not sessions.in_effect(**_machine(tmp_path, "1:cpu:/\n", [V1_CPU.format(root="/docker/abc")]))


def test_under_cgroup_v2_autogroups_hold_only_where_the_root_hands_the_cpu_controller_to_no_one(tmp_path):
    hierarchy = tmp_path / "unified"
    hierarchy.mkdir()
    mount = f"30 23 0:27 / {hierarchy} rw,relatime - cgroup2 cgroup2 rw"
    (hierarchy / "cgroup.subtree_control").write_text("memory pids\n")
    assert sessions.in_effect(**_machine(tmp_path, "0::/user.slice/session-1.scope\n", [mount]))
    (hierarchy / "cgroup.subtree_control").write_text(
        "cpu memory pids\n"
    )  # systemd's usual: each slice a group
    assert not sessions.in_effect(**_machine(tmp_path, "0::/user.slice/session-1.scope\n", [mount]))


def test_the_filter_refuses_setsid_by_its_number_on_each_architecture_it_knows():
    for machine, number in (("x86_64", 112), ("aarch64", 157)):
        code = sessions.program(machine)
        assert len(code) % 8 == 0 and number in [
            int.from_bytes(code[i + 4 : i + 8], sys.byteorder) for i in range(0, len(code), 8)
        ]
    assert sessions.program("s390x") is None  # then no run is said to have an autogroup of its own


@AUTOGROUPS
def test_the_isolation_command_names_one_autogroup_per_run_where_no_cgroup_is_made(monkeypatch):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")
    assert cgroup.cpu_share().startswith("one scheduling group per run: the kernel's autogroups")
