"""cpu-2x4: two JAX processes of four CPU devices, joined over localhost, both running the notebook.

Lab 11's reference passes there; mistakes that are harmless in one process (every process loading
the same rows or the whole batch, printing from every host, reading another host's shard) pass on
cpu-1 and fail on cpu-2x4; a peer that crashes or hangs ends the run with `error` or `timeout`,
with no process left behind and the coordinator's port free again.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from notebook_variants import LAB_3_PUBLIC_TESTS

from labkit.checks import AsNumpy, by_devices, call
from labkit.course import configs
from labkit.judge import plaindata
from labkit.run import execute, modes

ROOT = Path(__file__).resolve().parents[2]
TWO_BY_FOUR = configs.CONFIGS["cpu-2x4"]


def processes_under(folder: Path, settle: float = 10.0) -> list[str]:
    """Live processes (not zombies) still running from `folder`, by working directory or command line.

    A process killed a moment ago may take a little while to go; `settle` seconds are allowed for that.
    """
    deadline = time.monotonic() + settle
    while True:
        found = []
        ps = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
        for line in ps.splitlines():
            pid, stat, args = (line.split(None, 2) + ["", ""])[:3]
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
            if (
                int(pid) != os.getpid()
                and not stat.startswith("Z")
                and (str(folder) in args or cwd.startswith(str(folder)))
            ):
                found.append(line.strip())
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def port_is_free(address: str) -> bool:
    """Nothing listens on `address`: a new coordinator could bind it (as servers do, with SO_REUSEADDR)."""
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
            s.listen()
        except OSError:
            return False
    return True


# ----------------------------------------------------------------------------------------
# The configuration, as data.
# ----------------------------------------------------------------------------------------


def test_cpu_2x4_is_two_processes_of_four_cpu_devices():
    assert TWO_BY_FOUR.processes == 2 and TWO_BY_FOUR.devices == 8
    assert TWO_BY_FOUR.env["JAX_NUM_CPU_DEVICES"] == "4" and TWO_BY_FOUR.env["JAX_PLATFORMS"] == "cpu"
    assert TWO_BY_FOUR.availability() == (True, "")


def test_each_process_is_told_its_index_and_the_same_coordinator():
    envs = [TWO_BY_FOUR.process_env(i, "127.0.0.1:5000") for i in range(2)]
    assert [e["LABKIT_PROCESS_ID"] for e in envs] == ["0", "1"]
    assert {e["LABKIT_COORDINATOR"] for e in envs} == {"127.0.0.1:5000"}
    assert all(e["LABKIT_NUM_PROCESSES"] == "2" and e["LABKIT_CPU_COLLECTIVES"] == "gloo" for e in envs)
    assert configs.CONFIGS["cpu-8"].process_env(0, "127.0.0.1:5000") == {}


def test_a_run_never_inherits_a_coordinator_from_the_caller():
    env = configs.CONFIGS["cpu-8"].environment(
        {
            "LABKIT_COORDINATOR": "10.0.0.1:1",
            "LABKIT_PROCESS_ID": "1",
            "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1",
            "HOME": "/h",
        }
    )
    assert set(env) == {"HOME", "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS"}


# ----------------------------------------------------------------------------------------
# Lab 11 on two processes.
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_on_two_processes(tmp_path_factory):
    """`make lab-11 CONFIGS=cpu-2x4` on the reference, with the hidden tests: (the finished command, its report)."""
    build = tmp_path_factory.mktemp("build")
    env = dict(os.environ, COLUMNS="160", NO_COLOR="1", LABKIT_BUILD=str(build))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "lab",
            "11",
            "--notebook",
            str(ROOT / "reference" / "lab-11.ipynb"),
            "--configs",
            "cpu-2x4",
            "--hidden",
        ],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
    )
    return done, json.loads((build / "lab-11" / "report.json").read_text())


def test_the_lab_11_reference_passes_its_public_and_hidden_tests_on_cpu_2x4(reference_on_two_processes):
    done, report = reference_on_two_processes
    assert done.returncode == 0, done.stdout + done.stderr
    assert {o["status"] for o in report["outcomes"]} == {"passed"}


def test_every_process_runs_the_notebook_and_the_record_says_which_process_holds_which_rows(
    reference_on_two_processes,
):
    _, report = reference_on_two_processes
    run = report["runs"]["cpu-2x4"]
    processes = run["processes"]
    assert [p["environment"]["process_index"] for p in processes] == [0, 1]
    assert all(
        p["environment"]["process_count"] == 2 and p["environment"]["device_count"] == 8 for p in processes
    )
    # the public tests' dataset, ROWS, as they give it (its rows grow only on more than 32 devices)
    data = np.arange(32 * 3, dtype=np.float32).reshape(32, 3)
    loaded = call("load_global_batch", AsNumpy(by_devices(data, shift=96.0)))
    value = processes[0]["results"][loaded.id]["value"]
    assert np.array_equal(plaindata.decode(value).value, data)  # gathered from both
    shards = value["sharding"]["shards"]
    assert value["sharding"]["processes"] == [0, 1] and not value["sharding"]["fully_addressable"]
    rows_of = {
        p: sorted(r for sh in shards if sh["process"] == p for r in range(*sh["index"][0])) for p in (0, 1)
    }
    assert rows_of == {0: list(range(16)), 1: list(range(16, 32))}


def test_mistakes_harmless_in_one_process_pass_on_cpu_1_and_fail_on_cpu_2x4(kit, lab_outcomes, variant):
    buggy = variant(
        11,
        # every process loads the first block of rows
        (
            "    start = jax.process_index() * per_process\n    return start, start + per_process",
            "    return 0, per_process",
        ),
        # reading an array spread over processes as if this process held all of it
        ("return np.asarray(multihost_utils.process_allgather(x, tiled=True))", "return np.asarray(x)"),
        # printing from every host
        (
            '    if jax.process_index() == 0:\n        print(f"step {step}',
            '    if True:\n        print(f"step {step}',
        ),
        # counting the job's devices as this process's
        ('"local_devices": jax.local_device_count()', '"local_devices": len(jax.devices())'),
    )
    done = kit("lab", "11", "--notebook", str(buggy), "--configs", "cpu-1,cpu-2x4", "--hidden")
    assert done.returncode == 1
    by = lab_outcomes(11)
    assert {o["status"] for o in by["cpu-1"].values()} == {"passed"}
    two = by["cpu-2x4"]
    expected_failures = {
        "test_local_devices_count_only_this_process": "jax.local_device_count()",
        "test_the_processes_load_disjoint_blocks_that_cover_the_batch": "every process is loading the same rows",
        "test_the_global_batch_has_the_shape_and_values_of_the_dataset": "use jax.process_index()",
        "test_a_step_on_unseen_data_uses_every_row_once": "every process loads the same block",
        "test_gather_returns_the_whole_array_as_numpy": "non-addressable",
        "test_the_line_is_printed_once_for_the_whole_job": "process 1 printed 'step 3: loss 0.2500' too",
        "test_only_process_0_prints": "jax.process_index() == 0",
    }
    for test, phrase in expected_failures.items():
        assert two[test]["status"] == "failed", (test, two[test])
        assert phrase in two[test]["message"], (test, two[test]["message"])
    assert two["test_device_summary_counts_processes_and_global_devices"]["status"] == "passed"


def test_every_process_loading_the_whole_batch_passes_on_cpu_1_and_fails_on_cpu_2x4(
    kit, lab_outcomes, variant
):
    buggy = variant(11, ("    return start, start + per_process", "    return 0, num_rows"))
    done = kit("lab", "11", "--notebook", str(buggy), "--configs", "cpu-1,cpu-2x4", "--hidden")
    assert done.returncode == 1
    by = lab_outcomes(11)
    assert {o["status"] for o in by["cpu-1"].values()} == {"passed"}
    batch = by["cpu-2x4"]["test_the_global_batch_has_the_shape_and_values_of_the_dataset"]
    assert batch["status"] == "failed"
    assert (
        "expected shape (32, 3), got shape (64, 3)" in batch["message"]
        and "whole dataset" in batch["message"]
    )
    assert by["cpu-2x4"]["test_each_process_contributes_only_its_rows"]["status"] == "failed"


def reference_code(lab: int) -> str:
    cells = json.loads((ROOT / "reference" / f"lab-{lab}.ipynb").read_text())["cells"]
    return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


# Right in value, not parallel: the step's batch given whole to every device (no load_global_batch).
WHOLE_BATCH_STEP = (
    "    xs = load_global_batch(x)\n    ys = load_global_batch(y)\n",
    (
        "    xs = jax.device_put(x, NamedSharding(mesh, P()))\n"
        "    ys = jax.device_put(y, NamedSharding(mesh, P()))\n"
    ),
)
# A load that puts the whole global batch on every device of every process.
WHOLE_BATCH_LOAD = (
    (
        "    start, stop = process_rows(data.shape[0])\n"
        '    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), data[start:stop])'
    ),
    "    return jax.device_put(data, NamedSharding(mesh, P()))",
)


def test_a_step_on_the_whole_batch_on_every_device_passes_on_cpu_1_and_is_named_on_cpu_2x4(
    kit, lab_outcomes, variant
):
    assert WHOLE_BATCH_STEP[0] in reference_code(11), "the replacement finds nothing: the reference changed"
    done = kit(
        "lab",
        "11",
        "--notebook",
        str(variant(11, WHOLE_BATCH_STEP)),
        "--configs",
        "cpu-1,cpu-2x4",
        "--hidden",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    by = lab_outcomes(11)
    assert {o["status"] for o in by["cpu-1"].values()} == {"passed"}, by["cpu-1"]
    assert by["cpu-2x4"]["test_a_step_on_unseen_data_uses_every_row_once"]["status"] == "passed"
    named = by["cpu-2x4"]["test_a_step_gives_each_device_only_its_own_rows_of_the_batch"]
    assert named["hidden"] and named["status"] == "failed", named
    assert "every device computes all of it" in named["message"], named["message"]
    assert "not data parallelism" in named["message"] and "load_global_batch" in named["message"]
    # the hidden test and its public twin (make lab-11 holds the same budget)
    assert {t for t, o in by["cpu-2x4"].items() if o["status"] != "passed"} == {
        "test_a_step_gives_each_device_only_its_own_rows_of_the_batch",
        "test_a_step_computes_only_the_rows_of_each_device_and_averages_with_an_all_reduce",
    }


def test_a_load_that_puts_the_whole_batch_on_every_device_passes_on_cpu_1_and_fails_on_cpu_2x4(
    kit, lab_outcomes, variant
):
    assert WHOLE_BATCH_LOAD[0] in reference_code(11), "the replacement finds nothing: the reference changed"
    done = kit(
        "lab",
        "11",
        "--notebook",
        str(variant(11, WHOLE_BATCH_LOAD)),
        "--configs",
        "cpu-1,cpu-2x4",
        "--hidden",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    by = lab_outcomes(11)
    assert {o["status"] for o in by["cpu-1"].values()} == {"passed"}, by["cpu-1"]
    assert by["cpu-2x4"]["test_each_process_contributes_only_its_rows"]["status"] == "passed"
    split = by["cpu-2x4"]["test_the_global_batch_is_split_across_every_device"]
    assert split["status"] == "failed" and "full copy" in split["message"], split
    step = by["cpu-2x4"]["test_a_step_gives_each_device_only_its_own_rows_of_the_batch"]
    assert step["hidden"] and step["status"] == "failed" and "not data parallelism" in step["message"], step


# ----------------------------------------------------------------------------------------
# A peer that crashes or hangs.
# ----------------------------------------------------------------------------------------

SETUP_LINE = "check = Checker(11)"


def test_a_peer_that_crashes_ends_the_run_with_an_error_and_leaves_nothing_running(tmp_path, variant):
    crash = variant(
        11, (SETUP_LINE, SETUP_LINE + "\nimport os\nif jax.process_index() == 1:\n    os._exit(1)")
    )
    c = call("device_summary")
    record = execute.run_notebook(
        crash, TWO_BY_FOUR, [{"id": c.id, **c.encoded()}], tmp_path / "run", timeout=300
    )
    assert record.status == "error"
    assert record.message.startswith("process 1 of 2 stopped early"), record.message
    assert "kernel died" in record.message
    assert processes_under(tmp_path) == []
    assert port_is_free(record.processes[0]["coordinator"])


def test_a_peer_that_hangs_ends_the_run_with_a_timeout_and_leaves_nothing_running(tmp_path, variant):
    hang = variant(
        11, (SETUP_LINE, SETUP_LINE + "\nimport time\nif jax.process_index() == 1:\n    time.sleep(3600)")
    )
    c = call("device_summary")
    record = execute.run_notebook(
        hang, TWO_BY_FOUR, [{"id": c.id, **c.encoded()}], tmp_path / "run", timeout=40
    )
    assert record.status == "timeout"
    assert "did not finish within 40 s on all 2 processes" in record.message
    assert processes_under(tmp_path) == []
    assert port_is_free(record.processes[0]["coordinator"])


def test_a_process_still_in_its_last_cell_when_process_0_ends_is_not_cut_off(tmp_path):
    # Process 0 holds JAX's coordination service: if its kernel ended while a peer still ran a cell (a slower
    # process on a loaded machine, seen in a whole-class `make grade`), the peer's JAX client aborted it
    # (signal 6) and the run was an error. The processes now leave together after the harness.
    import nbformat

    notebook = tmp_path / "slow-peer.ipynb"
    nbformat.write(
        nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell(
                    "import time\n\nimport jax\n\nprint(jax.process_index(), jax.device_count())"
                ),
                nbformat.v4.new_code_cell("if jax.process_index() == 1:\n    time.sleep(8)"),
            ]
        ),
        notebook,
    )
    record = execute.run_notebook(notebook, TWO_BY_FOUR, [], tmp_path / "run", timeout=120)
    assert record.status == "ok", record.message
    assert processes_under(tmp_path) == []


# ----------------------------------------------------------------------------------------
# A lab that runs in one process only.
# ----------------------------------------------------------------------------------------


def test_a_lab_whose_tests_declare_one_process_is_skipped_on_cpu_2x4_with_the_reason(tmp_path):
    root = tmp_path / "course"
    (root / "reference").mkdir(parents=True)
    shutil.copy(ROOT / "reference" / "lab-3.ipynb", root / "reference" / "lab-3.ipynb")
    tests = root / "tests" / "public" / "lab_3"
    shutil.copytree(ROOT / "tests" / "public" / "lab_3", tests)
    for path in tests.glob("test_*.py"):
        path.write_text(
            path.read_text() + "\nfrom labkit.checks import single_process\n"
            'pytestmark = single_process("its inputs are arrays of one process")\n'
        )
    build = tmp_path / "build"
    env = dict(os.environ, COLUMNS="160", NO_COLOR="1", LABKIT_BUILD=str(build), LABKIT_ROOT=str(root))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "lab",
            "3",
            "--notebook",
            str(root / "reference" / "lab-3.ipynb"),
            "--configs",
            "cpu-1,cpu-2x4",
        ],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "cpu-2x4 skipped (runs in one JAX process only: its inputs are arrays of one process)" in done.stdout
    )
    report = json.loads((build / "lab-3" / "report.json").read_text())
    by: dict[str, dict[str, dict]] = {}
    for o in report["outcomes"]:
        by.setdefault(o["config"], {})[o["test"]] = o
    assert {o["status"] for o in by["cpu-2x4"].values()} == {"skipped"}
    assert {o["status"] for o in by["cpu-1"].values()} == {"passed"}
    assert not (build / "lab-3" / "cpu-2x4" / "process-0").exists()  # not even started


def test_a_process_that_cannot_join_the_others_stops_and_says_why(tmp_path):
    env = (
        TWO_BY_FOUR.environment()
        | TWO_BY_FOUR.process_env(1, f"127.0.0.1:{execute.free_port()}")
        | {"LABKIT_JOIN_TIMEOUT": "3"}
    )
    done = subprocess.run(
        [sys.executable, "-c", "import labkit.judge.harness as h; h.join_distributed(); print('joined')"],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 3 and "joined" not in done.stdout
    assert "labkit: process 1 could not join the others: nothing answered at 127.0.0.1:" in done.stderr


def test_each_worker_of_a_multi_host_tpu_slice_joins_the_others(monkeypatch):
    import jax

    from labkit.judge import harness

    joined = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: joined.append((a, k)))
    for var in ("LABKIT_COORDINATOR",):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    monkeypatch.setenv("LABKIT_TPU_HOSTS", "4")
    harness.join_distributed()
    assert joined == [((), {})], "on Cloud TPU, initialize() finds the coordinator by itself"
    monkeypatch.setenv("LABKIT_TPU_HOSTS", "1")
    harness.join_distributed()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("LABKIT_TPU_HOSTS", "4")
    harness.join_distributed()
    assert len(joined) == 1, "one host, or a CPU run, joins nobody"


def test_the_workers_of_a_tpu_slice_share_the_network_inside_the_sandbox():
    from labkit.judge import harness

    assert harness.tpu_hosts({"JAX_PLATFORMS": "tpu", "LABKIT_TPU_HOSTS": "4"}) == 4
    assert harness.tpu_hosts({"JAX_PLATFORMS": "cpu", "LABKIT_TPU_HOSTS": "4"}) == 1
    assert harness.tpu_hosts({"JAX_PLATFORMS": "tpu"}) == 1


# ----------------------------------------------------------------------------------------
# The two processes' network.
# ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not modes.bubblewrap()[0], reason="bubblewrap cannot make a sandbox on this machine")
def test_the_processes_share_one_private_network_that_reaches_nothing_of_the_host(tmp_path, variant):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as host_server:  # a service of the TA's machine
        host_server.bind(("127.0.0.1", 0))
        host_server.listen()
        port = host_server.getsockname()[1]
        probe = (
            SETUP_LINE + "\nimport json, os, socket\n"
            f"_s = socket.socket()\n_s.settimeout(2)\n_reached = _s.connect_ex(('127.0.0.1', {port})) == 0\n"
            "_s.close()\n"
            "open('network.json', 'w').write(json.dumps({'net': os.readlink('/proc/self/ns/net'), "
            "'reached_the_host': _reached}))"
        )
        notebook = variant(11, (SETUP_LINE, probe))
        c = call("device_summary")
        record = execute.run_notebook(
            notebook,
            TWO_BY_FOUR,
            [{"id": c.id, **c.encoded()}],
            tmp_path / "run",
            timeout=300,
            keep_scratch=True,
        )
    assert record.status == "ok", record.message  # the two processes found each other
    seen = [
        json.loads((tmp_path / "run" / f"process-{i}" / "scratch" / "network.json").read_text())
        for i in range(2)
    ]
    assert seen[0]["net"] == seen[1]["net"] != os.readlink("/proc/self/ns/net")
    assert not seen[0]["reached_the_host"] and not seen[1]["reached_the_host"]


# ----------------------------------------------------------------------------------------
# A machine whose own name resolves to nothing (a container with no network) or elsewhere.
# ----------------------------------------------------------------------------------------


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="giving the machine another host name for one command needs root (unshare -u)",
)
def test_the_processes_join_where_the_machines_host_name_resolves_to_nothing(tmp_path):
    # As in `docker run --network none`: gloo resolves the host name to find the address it binds to.
    # The sandbox names itself localhost, which resolves to the one interface its network has.
    reference = ROOT / "reference" / "lab-3.ipynb"
    line = (
        f"hostname labkit-nowhere-host && exec {sys.executable} -m labkit lab 3 --notebook {reference} "
        "--configs cpu-2x4"
    )
    done = subprocess.run(
        ["unshare", "--uts", "bash", "-c", line],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
        env=dict(os.environ, LABKIT_BUILD=str(tmp_path / "build"), NO_COLOR="1"),
    )
    assert f"PASS  {LAB_3_PUBLIC_TESTS}/{LAB_3_PUBLIC_TESTS} on cpu-2x4" in done.stdout, (
        done.stdout + done.stderr
    )[-3000:]


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="dropping CAP_SYS_ADMIN from root for one command needs root (setpriv)",
)
def test_as_root_without_cap_sys_admin_the_processes_still_join_each_others_network(tmp_path):
    # As in a container with Docker's default capabilities (Gradescope's): root, but no CAP_SYS_ADMIN, so it
    # may not enter the first process's network directly, only through the user namespace that owns it.
    reference = ROOT / "reference" / "lab-3.ipynb"
    done = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-sys_admin",
            "--inh-caps=-sys_admin",
            sys.executable,
            "-m",
            "labkit",
            "lab",
            "3",
            "--notebook",
            str(reference),
            "--configs",
            "cpu-2x4",
        ],
        check=False,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
        env=dict(os.environ, LABKIT_BUILD=str(tmp_path / "build"), NO_COLOR="1"),
    )
    assert f"PASS  {LAB_3_PUBLIC_TESTS}/{LAB_3_PUBLIC_TESTS} on cpu-2x4" in done.stdout, (
        done.stdout + done.stderr
    )[-3000:]
