"""`check("name")` in a notebook: eight CPU devices by default, and the public tests on one device and on eight."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from labkit import catalog, notebook

ROOT = catalog.ROOT


def _python(code: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "LABKIT_RUN"))}
    return subprocess.run([sys.executable, "-c", code], check=False, env=base | (env or {}), cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


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
    done = _python("import ipykernel, jax\njax.devices()\nimport labkit.notebook as n\nprint(jax.device_count())")
    assert done.returncode == 0, done.stderr
    assert "restart the kernel" in done.stderr and done.stdout.split()[-1] == "1", done.stdout + done.stderr


def test_the_replay_leaves_out_check_calls_and_keeps_the_rest():
    history = ["", "import jax\ncheck = Checker(3)", "def f(x):\n    return x", 'check("f")',
               'def g(x):\n    return x\ncheck("g")']
    assert notebook.replay_sources(history) == ["import jax\ncheck = Checker(3)", "def f(x):\n    return x",
                                                "def g(x):\n    return x"]


def _cells(lab: int, replace: tuple[str, str] | None = None) -> list[str]:
    cells = ["".join(c["source"]) for c in json.loads(catalog.lab(lab).reference.read_text())["cells"]
             if c["cell_type"] == "code"]
    return [c.replace(*replace) for c in cells] if replace else cells


def test_check_reports_a_one_device_mesh_as_passing_on_one_device_and_failing_on_eight():
    one_device = ('mesh = Mesh(np.array(jax.devices()), ("data",))\n    double',
                  'mesh = Mesh(np.array(jax.devices()[:1]), ("data",))\n    double')
    cells = _cells(3, one_device)
    assert any("jax.devices()[:1]" in c for c in cells), "the mistake replaced nothing: the reference changed"
    code = ("import json, sys\nfrom labkit.notebook import Checker\n"
            "ns = {'In': json.loads(sys.argv[1])}\n"
            "from labkit.notebook import replay_sources\nfor cell in replay_sources(ns['In']):\n    exec(cell, ns)\n"
            "print('RESULT', Checker(3)('shard_map_double', namespace=ns))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(cells)], check=False, cwd=ROOT, text=True, capture_output=True,
                          timeout=600, env={k: v for k, v in os.environ.items() if not k.startswith("JAX_")})
    assert done.returncode == 0, done.stderr
    table = done.stdout
    assert "cpu-1" in table and "cpu-8" in table, table
    split = next(line for line in table.splitlines() if line.strip().startswith("result is split across every"))
    assert split.split()[-2:] == ["✓", "✗"], table
    assert "[cpu-8]" in table and "lives on 1" in table, table
    assert "RESULT False" in table


def test_check_of_the_reference_passes_on_both():
    code = ("import json, sys\nfrom labkit.notebook import Checker\n"
            "ns = {'In': json.loads(sys.argv[1])}\n"
            "from labkit.notebook import replay_sources\nfor cell in replay_sources(ns['In']):\n    exec(cell, ns)\n"
            "print('RESULT', Checker(3)('shard_map_double', namespace=ns))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(_cells(3))], check=False, cwd=ROOT, text=True,
                          capture_output=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if not k.startswith("JAX_")})
    assert done.returncode == 0, done.stderr
    assert "RESULT True" in done.stdout and "✗" not in done.stdout, done.stdout
