"""Offline use: `make wheelhouse` once with network, then `make setup OFFLINE=1` and `make lab-N OFFLINE=1`
with none at all.

A fresh copy of the kit (no .venv, no .tools, an empty uv cache, no uv on the PATH) is set up from
the wheelhouse inside a network namespace with no network (`unshare -n`), and lab 3's reference is
run there on cpu-1 and cpu-8. The wheelhouse is the repository's own (ignored) wheelhouse/, made
once and reused: `make wheelhouse` only fetches what is not there yet. The copy finds it where
docs/containers.md has a user copy it, at wheelhouse/, and the make lines are that guide's
(`doc_commands`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import doc_commands
import pytest

from labkit.machine import envsetup
from labkit.machine import wheelhouse as wh

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / "wheelhouse"
SELECTION = "notebook"  # the course image's DEP_GROUPS: the lean environment students get


def _unshare_works() -> tuple[bool, str]:
    if not shutil.which("unshare"):
        return False, "unshare (util-linux) is not installed"
    done = subprocess.run(["unshare", "-n", "true"], check=False, capture_output=True, text=True)
    return done.returncode == 0, f"unshare -n is not permitted here: {done.stderr.strip()}"


_ok, _why = _unshare_works()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)


def _uv() -> str:
    return shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")


def offline(*command: str, cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a command in a new network namespace whose only interface is loopback (brought up, for kernels)."""
    script = 'ip link set lo up && exec "$@"'
    return subprocess.run(
        ["unshare", "-n", "bash", "-c", script, "offline", *command],
        cwd=cwd,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fresh_env(tmp: Path) -> dict:
    """The environment of a machine that has never set the kit up: no uv on the PATH, an empty uv cache."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("UV_", "VIRTUAL_ENV", "LABKIT_", "JAX_", "XLA_", "PIP_"))
    }
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if p and not (Path(p) / "uv").exists() and ".venv" not in p
    )
    env.update(
        UV_CACHE_DIR=str(tmp / "uv-cache"),
        UV_PYTHON_DOWNLOADS="never",
        LABKIT_BUILD=str(tmp / "build"),
        COLUMNS="160",
        NO_COLOR="1",
    )
    return env


def fresh_kit(dest: Path) -> Path:
    """A copy of the kit as a clone has it: tracked and new files, nothing that git ignores."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """The repository's wheelhouse/, completed by `make wheelhouse` when it lacks anything (needs network once)."""
    if WHEELHOUSE.is_dir() and any(WHEELHOUSE.glob("*.whl")):
        try:
            # for the Python this environment runs on (the lock holds another JAX for another Python)
            if not wh.missing(
                WHEELHOUSE, _uv(), ["--python", os.path.realpath(sys.executable), "--all-groups"]
            ):
                return WHEELHOUSE
        except wh.PlanError:
            pass
    done = subprocess.run(
        doc_commands.with_values("make wheelhouse"),
        cwd=ROOT,
        env=doc_commands.user_environment(),
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return WHEELHOUSE


@pytest.fixture(scope="module")
def offline_kit(tmp_path_factory, wheelhouse):
    """A fresh copy of the kit, set up with `make setup OFFLINE=1` inside a namespace with no network."""
    tmp = tmp_path_factory.mktemp("offline")
    kit = fresh_kit(tmp / "kit")
    (kit / "wheelhouse").symlink_to(wheelhouse)  # copied there, as the guide says
    env = fresh_env(tmp)
    done = offline(*doc_commands.with_values("make setup OFFLINE=1"), cwd=kit, env=env)
    return kit, env, done


def test_the_namespace_really_has_no_network(tmp_path):
    probe = "import socket; socket.create_connection(('pypi.org', 443), timeout=5)"
    done = offline(sys.executable, "-c", probe, cwd=tmp_path, env=dict(os.environ))
    assert done.returncode != 0
    assert "gaierror" in done.stderr or "unreachable" in done.stderr.lower() or "Errno" in done.stderr


def test_setup_offline_builds_the_environment_from_the_wheelhouse_alone(offline_kit):
    kit, env, done = offline_kit
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check = subprocess.run(
        [
            str(kit / ".venv" / "bin" / "python"),
            "-c",
            "import jax, flax, papermill, jupyterlab, labkit; print(jax.__version__, labkit.__file__)",
        ],
        cwd=kit,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stderr
    version, where = check.stdout.split()
    # the JAX the lock gives the Python set-up took (0.12 on 3.12 and newer, 0.10.2 on 3.11)
    assert version == envsetup.jax_for(envsetup.venv_python(kit / ".venv")), version
    assert where == str(kit / "labkit" / "__init__.py")
    assert (kit / ".tools" / "bin" / "uv").exists(), "uv itself came from the wheelhouse"
    assert list((kit / ".venv").glob("lib/python*/site-packages/jax/__pycache__/__init__.cpython-*.pyc")), (
        "the environment's bytecode is compiled at setup, offline too"
    )


def test_the_course_images_lean_selection_is_what_the_plain_offline_setup_made(offline_kit):
    kit, env, setup = offline_kit
    assert setup.returncode == 0, setup.stderr[-2000:]
    done = offline(*doc_commands.with_values("make setup OFFLINE=1 DEP_GROUPS=notebook"), cwd=kit, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pip sync" not in done.stdout + done.stderr, (
        "the environment was up to date: nothing was installed again"
    )


def test_lab_3_reference_passes_offline_on_cpu_1_and_cpu_8(offline_kit):
    kit, env, setup = offline_kit
    assert setup.returncode == 0, setup.stderr[-2000:]
    shutil.copy(kit / "reference" / "lab-3.ipynb", kit / "labs" / "lab-3.ipynb")
    done = offline(
        *doc_commands.with_values("make lab-3 OFFLINE=1", also={"CONFIGS": "cpu-1,cpu-8", "TIMEOUT": "600"}),
        cwd=kit,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pip sync" not in done.stdout + done.stderr, (
        "the environment was up to date: nothing was installed again"
    )
    assert "PASS" in done.stdout and "on cpu-1" in done.stdout and "on cpu-8" in done.stdout


def test_an_incomplete_wheelhouse_names_every_missing_package(tmp_path, wheelhouse):
    partial = tmp_path / "partial"
    partial.mkdir()
    left_out = ("jaxlib-", "jupyterlab-", "hatchling-")
    for wheel in wheelhouse.glob("*.whl"):
        if not wheel.name.startswith(left_out):
            (partial / wheel.name).symlink_to(wheel)
    kit = fresh_kit(tmp_path / "kit")
    done = offline(
        "make",
        "setup",
        "OFFLINE=1",
        f"DEP_GROUPS={SELECTION}",
        f"WHEELHOUSE={partial}",
        cwd=kit,
        env=fresh_env(tmp_path),
    )
    assert done.returncode != 0
    assert "is incomplete: 3 package(s)" in done.stderr, done.stderr
    assert "jaxlib==0." in done.stderr and "jupyterlab==" in done.stderr and "hatchling" in done.stderr
    assert "make wheelhouse" in done.stderr
    assert not (kit / ".venv").exists(), "nothing is installed from an incomplete wheelhouse"


def test_no_wheelhouse_at_all_says_how_to_make_one(tmp_path):
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit.machine.wheelhouse",
            "missing",
            "--wheelhouse",
            str(tmp_path / "empty"),
            "--uv",
            _uv(),
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "no wheelhouse" in done.stderr and "make wheelhouse" in done.stderr


def test_wheel_names_are_matched_as_pep_427_spells_them(tmp_path):
    for name in (
        "Jinja2-3.1.6-py3-none-any.whl",
        "typing_extensions-4.15.0-py3-none-any.whl",
        "jax-0.10.2-py3-none-any.whl",
    ):
        (tmp_path / name).touch()
    found = wh.present(tmp_path)
    assert found[wh.normalize("jinja2")] == {"3.1.6"}
    assert found[wh.normalize("typing-extensions")] == {"4.15.0"}
    assert wh.normalize("ruamel.yaml") == "ruamel_yaml"
