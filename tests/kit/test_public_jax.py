"""The kit uses JAX's public API only, so that the next JAX cannot break it silently.

No module of the kit imports from `jax._src` or `jaxlib` (JAX's internals, which change without
notice between releases), and every module imports cleanly with deprecation warnings made errors,
on whichever JAX this environment has (`make test` runs on the newest Python here, and so on JAX
0.12 wherever Python 3.12 or newer is installed).
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import labkit
from labkit.machine import envsetup

KIT = Path(labkit.__file__).parent
ROOT = KIT.parent


def kit_modules() -> list[str]:
    """Every module of the kit, in its stage's folder too."""
    return sorted(
        m.name for m in pkgutil.walk_packages([str(KIT)], prefix="labkit.") if m.name != "labkit.__main__"
    )


def private_imports(source: str) -> list[str]:
    """The modules a source imports (at any depth: inside functions too) that are JAX's internals."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found += [n for n in names if n == "jaxlib" or n.startswith(("jax._src", "jaxlib."))]
    return found


def test_the_check_finds_a_private_import_inside_a_function():
    assert private_imports("def f():\n    from jax._src import array\n    return array\n") == [
        "jax._src",
        "jax._src.array",
    ]
    assert private_imports("import jaxlib.xla_client\n") == ["jaxlib.xla_client"]
    assert private_imports("import jax\nfrom jax.sharding import NamedSharding\n") == []


def test_no_module_of_the_kit_imports_jax_internals():
    files = sorted(KIT.rglob("*.py"))
    assert len(files) > 40 and KIT / "judge" / "harness.py" in files
    offenders = {str(p.relative_to(KIT)): private_imports(p.read_text()) for p in files}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_every_module_of_the_kit_imports_with_deprecation_warnings_made_errors():
    modules = kit_modules()
    assert len(modules) > 30 and "labkit.judge.harness" in modules
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\nimport jax\nprint(jax.__version__)"
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::DeprecationWarning",
            "-W",
            "error::PendingDeprecationWarning",
            "-c",
            script,
            *modules,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "JAX's version is printed"


# ---------------------------------------------------------------------------------------------
# One lock, two worlds: JAX 0.12 on Python 3.12 and newer, JAX 0.10.2 (its last release) on 3.11.


def locked_versions(name: str) -> dict[str, str]:
    """version -> the marker under which uv.lock installs it, for every locked version of `name`."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return {
        p["version"]: " or ".join(p.get("resolution-markers", ["always"]))
        for p in lock["package"]
        if p["name"] == name
    }


def test_the_lock_gives_jax_0_12_to_python_3_12_and_newer_and_0_10_2_to_python_3_11():
    for name in ("jax", "jaxlib"):
        versions = locked_versions(name)
        assert set(versions) == {"0.10.2", "0.12.0.1"}, versions
        assert "< '3.12'" in versions["0.10.2"] and ">= '3.12'" not in versions["0.10.2"], versions
        assert "'3.12" in versions["0.12.0.1"] or ">= '3.13'" in versions["0.12.0.1"], versions
    assert set(locked_versions("flax")) == {"0.12.8", "0.12.12"}
    assert envsetup.jax_for((3, 11, 7)) == "0.10.2" and envsetup.jax_for((3, 13, 0)) == "0.12.0.1"


def test_the_lock_matches_pyproject():
    uv = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    done = subprocess.run(
        [uv, "lock", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, UV_PYTHON_DOWNLOADS="never", NO_COLOR="1"),
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_this_environment_has_the_jax_the_lock_gives_its_python():
    import jax

    assert jax.__version__ == envsetup.jax_for(tuple(sys.version_info[:3]))


# ---------------------------------------------------------------------------------------------
# The labs name the JAX they teach.


def test_every_labs_first_cell_prints_the_jax_version_it_runs_on():
    from labkit.course import catalog

    for lab in catalog.labs():
        for notebook in (lab.reference, lab.student):
            cells = json.loads(notebook.read_text())["cells"]
            first_code = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
            assert "jax.__version__" in first_code, notebook


def test_the_first_lab_names_both_versions_and_the_one_difference_a_student_could_meet():
    from labkit.course import catalog

    intro = "".join(json.loads(catalog.lab(1).student.read_text())["cells"][0]["source"])
    newer, older = envsetup.jax_for((3, 13, 0)), envsetup.jax_for((3, 11, 7))
    assert f"JAX {'.'.join(newer.split('.')[:2])}" in intro and f"JAX {older}" in intro, intro
    assert "axis_sizes" in intro and "axis_shapes" in intro


def test_the_make_mesh_keyword_that_differs_is_what_this_jax_says():
    """The one difference the course names: `jax.make_mesh`'s first keyword (`axis_sizes` from 0.12)."""
    import inspect

    import jax

    first = next(iter(inspect.signature(jax.make_mesh).parameters))
    assert first == ("axis_sizes" if jax.__version__.startswith("0.12") else "axis_shapes"), (
        jax.__version__,
        first,
    )
