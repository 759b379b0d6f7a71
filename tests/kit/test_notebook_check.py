"""`check("name")` in a notebook: eight CPU devices by default, and the public tests on one device and on eight."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from labkit import checks, notebook
from labkit.course import catalog
from labkit.run import modes
from labkit.student import stamp

ROOT = catalog.ROOT


def _python(code: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "LABKIT_RUN"))}
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=base | (env or {}),
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def test_an_environment_that_names_a_device_count_keeps_it():
    environ = {"JAX_NUM_CPU_DEVICES": "2"}
    assert notebook.default_devices(environ=environ).startswith("kept")
    assert environ == {"JAX_NUM_CPU_DEVICES": "2"}


def test_a_kit_run_keeps_what_its_configuration_set():
    environ = {notebook.RUN_MARKER: "cpu-1"}
    assert notebook.default_devices(environ=environ).startswith("kept")
    assert "JAX_NUM_CPU_DEVICES" not in environ


def test_outside_a_jupyter_kernel_nothing_changes():
    assert notebook.default_devices(environ={}, kernel=False) == "kept: not a Jupyter kernel"


def test_an_interactive_kernel_sees_eight_cpu_devices_once_the_lab_imports_the_checker():
    done = _python("import ipykernel, jax\nimport labkit.notebook as n\nprint(n.DEVICES, jax.device_count())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "8", done.stdout


def test_a_kernel_whose_jax_already_started_is_told_to_restart():
    done = _python(
        "import ipykernel, jax\njax.devices()\nimport labkit.notebook as n\nprint(jax.device_count())"
    )
    assert done.returncode == 0, done.stderr
    assert "restart the kernel" in done.stderr and done.stdout.split()[-1] == "1", done.stdout + done.stderr


def test_the_replay_leaves_out_check_calls_and_keeps_the_rest():
    history = [
        "",
        "import jax\ncheck = Checker(3)",
        "def f(x):\n    return x",
        'check("f")',
        'def g(x):\n    return x\ncheck("g")',
    ]
    assert notebook.replay_sources(history) == [
        "import jax\ncheck = Checker(3)",
        "def f(x):\n    return x",
        "def g(x):\n    return x",
    ]


def _cells(lab: int, replace: tuple[str, str] | None = None) -> list[str]:
    cells = [
        "".join(c["source"])
        for c in json.loads(catalog.lab(lab).reference.read_text())["cells"]
        if c["cell_type"] == "code"
    ]
    return [c.replace(*replace) for c in cells] if replace else cells


def test_check_reports_a_one_device_mesh_as_passing_on_one_device_and_failing_on_eight():
    one_device = (
        'mesh = Mesh(np.array(jax.devices()), ("data",))\n    double',
        'mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n    double',
    )
    cells = _cells(3, one_device)
    assert any("jax.devices()[:1]" in c for c in cells), "the mistake replaced nothing: the reference changed"
    code = (
        "import json, sys\nfrom labkit.notebook import Checker\n"
        "ns = {'In': json.loads(sys.argv[1])}\n"
        "from labkit.notebook import replay_sources\nfor cell in replay_sources(ns['In']):\n    exec(cell, ns)\n"
        "print('RESULT', Checker(3)('shard_map_double', namespace=ns))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cells)],
        check=False,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("JAX_")},
    )
    assert done.returncode == 0, done.stderr
    table = done.stdout
    assert "cpu-1" in table and "cpu-8" in table, table
    split = next(
        line for line in table.splitlines() if line.strip().startswith("result is split across every")
    )
    assert split.split()[-2:] == ["✓", "✗"], table
    assert "[cpu-8]" in table and "lives on 1" in table, table
    assert "RESULT False" in table


def test_check_of_the_reference_passes_on_both():
    code = (
        "import json, sys\nfrom labkit.notebook import Checker\n"
        "ns = {'In': json.loads(sys.argv[1])}\n"
        "from labkit.notebook import replay_sources\nfor cell in replay_sources(ns['In']):\n    exec(cell, ns)\n"
        "print('RESULT', Checker(3)('shard_map_double', namespace=ns))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(_cells(3))],
        check=False,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("JAX_")},
    )
    assert done.returncode == 0, done.stderr
    assert "RESULT True" in done.stdout and "✗" not in done.stdout, done.stdout
    # the exercise's cost card on eight devices, the same as the reference's recorded one
    assert "shard_map_double on cpu-8 (8 devices)" in done.stdout, done.stdout
    assert "about what the reference solution costs" in done.stdout


# ----------------------------------------------------------------------------------------
# The replay runs in the kit's sandbox: its scratch folder, the notebook's folder read-only, no network.
# ----------------------------------------------------------------------------------------

SANDBOXED = modes.bubblewrap()[0] is not None
NEEDS_SANDBOX = pytest.mark.skipif(not SANDBOXED, reason="bubblewrap cannot make a sandbox on this machine")

LOOK_AROUND = """import json, os, socket
import helpers
def look_around(outside):
    seen = {"cwd": os.getcwd(), "data": open("data.csv").read().strip(), "outside": os.path.exists(outside),
            "helper": helpers.ANSWER,
            "interfaces": sorted(name for _, name in socket.if_nameindex())}
    try:
        with open("written.txt", "w") as f:
            f.write("x")
        seen["wrote"] = True
    except OSError as e:
        seen["wrote"] = e.strerror
    return json.dumps(seen)
"""


@NEEDS_SANDBOX
def test_the_replay_reads_the_notebooks_folder_and_nothing_the_kernel_reads_outside_it_nor_the_network(
    tmp_path,
):
    folder, outside = tmp_path / "course" / "labs", tmp_path / "private.txt"
    folder.mkdir(parents=True)
    (folder / "data.csv").write_text("1,2,3\n")
    (folder / "helpers.py").write_text("ANSWER = 42\n")
    outside.write_text("the kernel can read this\n")
    assert outside.read_text()  # this process, like the student's kernel, can
    look = checks.call("look_around", str(outside))
    done = notebook.run_elsewhere("cpu-1", [LOOK_AROUND], [{"id": look.id, **look.encoded()}], folder=folder)
    assert done["status"] == "ok" and done["isolation"] == "bubblewrap", done
    seen = json.loads(done["results"][look.id]["value"]["value"])
    assert seen["cwd"] == str(folder) and seen["data"] == "1,2,3" and seen["helper"] == 42
    assert seen["outside"] is False
    assert seen["wrote"] == "Read-only file system" and not (folder / "written.txt").exists()
    assert seen["interfaces"] == ["lo"]  # a network namespace of its own: nothing beyond loopback


def test_a_folder_that_holds_the_kit_is_not_shown_to_the_replay():
    assert notebook.replay_folder(ROOT) is None and notebook.replay_folder(ROOT.parent) is None
    assert notebook.replay_folder(ROOT / "labs") == (ROOT / "labs").resolve()


_CHECK = (
    "import json, sys\nfrom labkit.notebook import Checker, replay_sources\n"
    "ns = {'In': json.loads(sys.argv[1])}\nfor cell in replay_sources(ns['In']):\n    exec(cell, ns)\n"
    "print('RESULT', Checker(3)('shard_map_double', namespace=ns))\n"
)


@NEEDS_SANDBOX
def test_a_solution_that_reads_a_file_outside_the_notebooks_folder_works_in_the_kernel_and_not_in_the_replay(
    tmp_path,
):
    secret = tmp_path / "answers.txt"
    secret.write_text("2.0")
    reads_outside = (
        "def shard_map_double(x):\n",
        f"def shard_map_double(x):\n    factor = float(open({str(secret)!r}).read())\n",
    )
    cells = _cells(3, reads_outside)
    assert any(str(secret) in c for c in cells), "the change replaced nothing: the reference changed"
    (tmp_path / "labs").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, json.dumps(cells)],
        check=False,
        cwd=tmp_path / "labs",
        text=True,
        capture_output=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("JAX_")},
    )
    assert done.returncode == 0, done.stderr
    assert "RESULT False" in done.stdout, done.stdout
    assert "answers.txt" in done.stdout and "No such file or directory" in done.stdout, done.stdout
    assert "warning" not in done.stderr, done.stderr


def test_where_no_sandbox_can_be_made_the_replay_runs_with_limits_only_and_check_says_so_in_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "LABKIT_SANDBOX"))}
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, json.dumps(_cells(3))],
        check=False,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
        env=env | {"LABKIT_BWRAP": "/bin/false"},
    )
    assert done.returncode == 0, done.stderr
    assert "RESULT True" in done.stdout and "✗" not in done.stdout, done.stdout
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith(
        "labkit: warning: check() replays with resource limits only, not in a sandbox"
    )
    assert "/bin/false" in warnings[0] and "cannot start" in warnings[0]


def test_check_in_this_kernel_prints_lab_14s_cost_card_and_on_one_device_says_why_there_is_none(tmp_path):
    # lab 14's first test calls train_step unexamined and a later one examines the same call: the card must
    # still print; a program on one device gets one line saying why there is no card, not silence
    code = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from labkit.notebook import Checker
mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
@jax.jit
def split(p, m, x, y):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("d")))
    return p, m, jnp.sum(x * x)
whole = jax.jit(lambda p, m, x, y: (p, m, jnp.sum(x * x)))
for f in (split, whole):
    print("=====")
    Checker(14)("train_step", namespace={"train_step": f}, configs=None)
"""
    done = _python(code, env={"JAX_NUM_CPU_DEVICES": "8", "LABKIT_BUILD": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert stamp.read(tmp_path / "lab-14") is not None  # the check's time, for `make lab-14`'s note
    split, whole = done.stdout.split("=====")[1:]
    assert "Cost cards:" in split and "train_step" in split.split("Cost cards:")[1], split
    assert "Cost cards:" not in whole and "No cost card: every run examined was on one device" in whole, whole
    # the test at a production size runs on the compile-only TPU configurations alone: here it is skipped,
    # saying where it runs, never a failure the student cannot mend
    [at_size] = [line for line in split.splitlines() if line.strip().startswith("at a production size")]
    assert at_size.split()[-1] == "skip" and "✗" not in at_size, split
    assert "runs on the compile-only TPU configurations" in split, split
