"""Warm starts: one server imports JAX once and forks each run's kernel, every run in a sandbox of its own.

The adversarial battery (test_sandbox.py) runs every trick both cold and warm; these tests pin
down what a warm start must keep of a cold one: the configuration's devices and JAX settings,
a sandbox per run (its own folder, processes, /tmp, network, no capability), fresh random state,
and the fall-back to cold starts wherever no warm server can be had.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from notebook_variants import LAB_3_TESTS

from labkit.course import catalog, configs
from labkit.judge import judge
from labkit.run import cgroup, execute, modes, sandbox, warm
from labkit.run.allowance import Limits

SANDBOXED = modes.isolation()[0] == modes.BUBBLEWRAP
pytestmark = pytest.mark.skipif(not SANDBOXED, reason="bubblewrap cannot make a sandbox on this machine")
LIMITS = Limits(isolation=modes.SANDBOX)

# A cell that writes what the run sees of itself into its scratch folder, as facts.json (its kit folder is
# the one above, the runs beside it one more above).
LOOK_AROUND = r"""
import json, os, sys, jax, numpy as np
flax_before = "flax" in sys.modules  # what the server imported for the run: only a Flax lab's imports Flax
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
here = os.getcwd()
facts = {
    "devices": len(jax.devices()),
    "config": {k: repr(v) for k, v in sorted(jax.config.values.items())
               if isinstance(v, (bool, int, float, str, type(None))) and "cache" not in k},
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status.get("NoNewPrivs", "").strip(),
    "uid": os.getuid(),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "beside_me": sorted(n for n in ("warm-1", "warm-8", "cold-8") if os.path.exists(os.path.join(here, "..", "..", n))),
    "tmp": sorted(os.listdir("/tmp")),
    "interfaces": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]),
    "random": float(np.random.rand()),
    "flax_before": flax_before,
}
read_end, write_end = os.pipe()
if os.fork() == 0:  # a child, as a busy process would: may it leave for a session (a scheduling group) of its own?
    try:
        os.setsid()
        said = "a session of its own"
    except OSError as e:
        said = e.strerror
    os.write(write_end, said.encode())
    os._exit(0)
os.wait()
facts["setsid"] = os.read(read_end, 200).decode()
open("/tmp/mine", "w").write(here)
json.dump(facts, open("facts.json", "w"))
"""


def _notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(LOOK_AROUND)]
    nbformat.write(nb, path)
    return path


def _facts(record: execute.RunRecord) -> dict:
    assert record.status == "ok", (record.status, record.message)
    return json.loads((Path(record.workdir) / "scratch" / "facts.json").read_text())


@pytest.fixture(scope="module")
def runs_root(outside_tmp) -> Path:
    return outside_tmp("warm-runs")


@pytest.fixture(scope="module")
def server(runs_root, tmp_path_factory):
    env = {k: v for k, v in configs.CONFIGS["cpu-1"].environment().items() if k != "JAX_NUM_CPU_DEVICES"}
    started = warm.Server([runs_root], env, tmp_path_factory.mktemp("warm-server"))
    if not started.start(LIMITS):
        pytest.fail(f"the warm server did not start: {started.why}")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def looked(server, runs_root, tmp_path_factory):
    """Three runs of the look-around notebook: cpu-1 and cpu-8 forked by the server, and cpu-8 started cold."""
    notebook = _notebook(tmp_path_factory.mktemp("nb") / "look.ipynb")
    out = {}
    for label, name, with_server in (
        ("warm-1", "cpu-1", server),
        ("warm-8", "cpu-8", server),
        ("cold-8", "cpu-8", None),
    ):
        record = execute.run_notebook(
            notebook,
            configs.by_name(name),
            [],
            runs_root / label,
            timeout=180,
            limits=LIMITS,
            warm=with_server,
            keep_scratch=True,
        )
        out[label] = (record, _facts(record))
    return out


def test_one_server_forks_runs_of_one_and_of_eight_devices(looked):
    assert looked["warm-1"][0].start == looked["warm-8"][0].start == "warm"
    assert looked["cold-8"][0].start == "cold"
    assert (looked["warm-1"][1]["devices"], looked["warm-8"][1]["devices"]) == (1, 8)


def test_a_warm_kernel_has_the_jax_settings_of_a_cold_one(looked):
    warm_config, cold_config = looked["warm-8"][1]["config"], looked["cold-8"][1]["config"]
    differ = {
        k: (warm_config.get(k), cold_config.get(k))
        for k in set(warm_config) | set(cold_config)
        if warm_config.get(k) != cold_config.get(k)
    }
    assert not differ, differ


def test_a_warm_run_has_no_capability_and_cannot_gain_one(looked):
    facts = looked["warm-8"][1]
    assert facts["cap_eff"] == "0000000000000000"
    assert facts["no_new_privs"] == "1"
    assert facts["uid"] != 0


def test_a_warm_run_sees_only_its_own_folder_processes_tmp_and_loopback(looked, runs_root):
    facts = looked["warm-8"][1]
    assert facts["beside_me"] == ["warm-8"]  # warm-1 and cold-8 are there outside, not here, even by name
    assert len(facts["processes"]) <= 4, facts["processes"]  # its init, the kernel, and what the cell started
    assert "mine" not in facts["tmp"], facts["tmp"]  # a /tmp of its own: warm-1 wrote /tmp/mine in its own
    assert facts["interfaces"] == ["lo"]
    assert sorted(p.name for p in runs_root.iterdir()) == ["cold-8", "warm-1", "warm-8"]


def test_a_warm_run_may_not_start_a_session_of_its_own_as_a_cold_one_may_not(looked):
    # so that all its processes stay in one scheduling group where the kernel's autogroups share the processors
    assert looked["warm-8"][1]["setsid"] == looked["cold-8"][1]["setsid"] == "Operation not permitted"
    groups = cgroup.make_cgroups(LIMITS)
    for g in groups:
        cgroup.remove_cgroup(g)
    here = cgroup.share_of(
        groups, sessions_held=True
    )  # a cgroup per run, else one autogroup per run, or none
    assert looked["warm-8"][0].cpu_share == looked["cold-8"][0].cpu_share == here


def test_the_server_itself_may_start_sessions_its_runs_may_not(server):
    # it forks each run in a session of its own (its child's setsid); the filter is the runs' alone
    filtered = [
        line.split()[1]
        for pid in [server.process.pid, *sandbox.descendants(server.process.pid)]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Seccomp:")
    ]
    assert filtered and set(filtered) == {"0"}, filtered


def test_a_run_whose_child_never_reported_its_pid_signals_no_other_process(monkeypatch):
    signalled = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append(pid))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: signalled.append(pid))
    ours, theirs = socket.socketpair()
    run = warm.WarmRun(ours, -1, [], None, LIMITS, "")  # as `Server.launch` has it before it gives up
    run.kill()
    theirs.close()
    assert signalled == []  # kill(-1) would be every process the kit may signal, itself included


def test_two_warm_runs_draw_different_random_numbers(looked):
    assert looked["warm-1"][1]["random"] != looked["warm-8"][1]["random"]


def test_the_kits_own_run_of_the_programs_is_forked_by_the_server_too_and_leaves_no_inputs_behind(
    server, runs_root
):
    lab = catalog.lab(3)
    calls = judge.collect_calls(lab.test_dirs(hidden=True))
    records = {
        start: execute.run_notebook(
            lab.reference,
            configs.by_name("cpu-8"),
            calls,
            runs_root / f"verify-{start}",
            timeout=180,
            limits=LIMITS,
            warm=with_server,
        )
        for start, with_server in (("warm", server), ("cold", None))
    }
    for start, record in records.items():
        assert (record.status, record.judged_by, record.verify_start) == ("ok", "verified", start), (
            record.message
        )
        assert not (Path(record.workdir) / "verify-job.json").exists()  # the hidden inputs are not kept
    assert records["warm"].results == records["cold"].results


def test_a_server_imports_flax_only_for_the_labs_that_use_it(looked, runs_root, tmp_path_factory):
    assert [lab.number for lab in catalog.labs() if lab.uses("flax")] == [6, 8]
    assert looked["warm-1"][1]["flax_before"] is False  # a server for lab 3's runs (no lab given)
    env = {k: v for k, v in configs.CONFIGS["cpu-1"].environment().items() if k != "JAX_NUM_CPU_DEVICES"}
    flax_lab = warm.Server([runs_root], env, tmp_path_factory.mktemp("flax-server"), labs=[catalog.lab(6)])
    assert flax_lab.packages == ["flax"]
    assert flax_lab.start(LIMITS), flax_lab.why
    try:
        record = execute.run_notebook(
            _notebook(tmp_path_factory.mktemp("nb") / "look.ipynb"),
            configs.by_name("cpu-1"),
            [],
            runs_root / "flax-lab",
            timeout=180,
            limits=LIMITS,
            warm=flax_lab,
            keep_scratch=True,
        )
    finally:
        flax_lab.stop()
    assert record.start == "warm" and _facts(record)["flax_before"] is True


def test_the_server_never_starts_a_jax_backend(server):
    # a backend started in the server would fix the device count of every run it forks
    log = (server.folder / "server.log").read_text(errors="replace")
    assert "os.fork() was called" not in log


def test_without_a_sandbox_there_is_no_warm_server(tmp_path):
    env = configs.CONFIGS["cpu-1"].environment()
    server = warm.Server([tmp_path], env, tmp_path / "server")
    assert not server.start(replace(LIMITS, isolation=modes.LIMITS_ONLY))
    assert "no sandbox" in server.why


def test_a_folder_outside_the_servers_is_refused_and_the_run_starts_cold(server, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(OSError, match="not in the warm server's folders"), open(os.devnull, "wb") as log:
        server.launch([], elsewhere, {}, LIMITS, log=log)
    record = execute.run_notebook(
        _notebook(elsewhere / "look.ipynb"),
        configs.by_name("cpu-1"),
        [],
        elsewhere / "run",
        timeout=180,
        limits=LIMITS,
        warm=server,
    )
    assert record.status == "ok" and record.start == "cold"
    assert "no warm start" in (elsewhere / "run" / "run.log").read_text(errors="replace")


def test_a_run_with_limits_above_the_servers_own_is_refused_and_starts_cold(server, runs_root):
    # A forked run's limits can only be lowered from the server's: v5e-256's raised ones (configs.least_for) would
    # be cut to the server's, and its 256 devices' threads would not start. Such a run starts cold instead.
    more = replace(LIMITS, memory=server.limits.memory * 2)
    assert configs.by_name("v5e-256").run_limits(LIMITS).memory > server.limits.memory
    with pytest.raises(OSError, match="above the warm server's own"), open(os.devnull, "wb") as log:
        server.launch([], runs_root / "above", {}, more, log=log)


def test_a_multi_process_run_starts_cold(server, runs_root):
    lab = catalog.lab(11)
    calls = judge.collect_calls(lab.test_dirs(hidden=True))
    record = execute.run_notebook(
        lab.reference,
        configs.by_name("cpu-2x4"),
        calls,
        runs_root / "procs",
        timeout=240,
        limits=LIMITS,
        warm=server,
    )
    assert record.status == "ok", record.message
    assert record.start == "cold"  # its processes' kernels join one network: each starts a kernel of its own


def _grade(tmp_path: Path, *extra: str) -> dict:
    subs = tmp_path / "subs"
    (subs / "ada").mkdir(parents=True)
    (subs / "ada" / "lab-3.ipynb").write_text(catalog.lab(3).reference.read_text())
    out = tmp_path / "out"
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
            "cpu-1,cpu-8",
            "--jobs",
            "2",
            *extra,
        ],
        cwd=catalog.ROOT,
        text=True,
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {(r["student"], r["config"]): r for r in json.loads((out / "scoreboard.json").read_text())["rows"]}


def test_grading_forks_every_kernel_from_a_warm_server_by_default(tmp_path):
    rows = _grade(tmp_path)
    assert {(r["status"], r["passed"], r["start"]) for r in rows.values()} == {("ok", LAB_3_TESTS, "warm")}
    # the servers are gone when grading ends, and their sockets with them: `cp -r OUT` copies the output
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_socket()]


def test_grading_with_cold_starts_asked_for_starts_every_kernel_cold(tmp_path):
    rows = _grade(tmp_path, "--start", "cold")
    assert {(r["status"], r["passed"], r["start"]) for r in rows.values()} == {("ok", LAB_3_TESTS, "cold")}


def test_the_student_loop_on_one_configuration_forks_its_kernel_and_its_verifier_from_a_warm_server(
    kit, lab_report
):
    # one configuration is worth a server: the kernel and the kit's own run of the programs share its import of JAX
    done = kit("lab", "3", "--notebook", str(catalog.lab(3).reference), "--configs", "cpu-8")
    assert done.returncode == 0, done.stdout + done.stderr
    run = lab_report(3)["runs"]["cpu-8"]
    assert (run["start"], run["verify_start"]) == ("warm", "warm"), run


def test_a_server_is_wanted_only_for_a_one_process_cpu_configuration_that_can_run_here(monkeypatch):
    from labkit.machine import accelerators

    named = configs.parse
    base = warm.environment_for(named("cpu-8"))
    assert base is not None and "JAX_NUM_CPU_DEVICES" not in base and base["JAX_PLATFORMS"] == "cpu"
    assert warm.environment_for(named("cpu-2x4,tpu,gpu")) is None  # several processes, or no CPU run
    monkeypatch.setattr(accelerators, "libtpu_available", lambda: (False, "not installed"))
    assert warm.environment_for(named("v5e-8")) is None  # skipped here: nothing to fork
    assert warm.environment_for(named("v5e-8,cpu-1")) == warm.environment_for(named("cpu-1"))
    monkeypatch.setattr(accelerators, "libtpu_available", lambda: (True, ""))
    assert warm.environment_for(named("v5e-8")) is not None
