"""The Gradescope autograder run as Gradescope runs it: in a container whose python3 is older than the kit's floor.

Gradescope runs `setup.sh` once, as root, from /autograder/source on its Ubuntu 22.04 image (python3 is 3.10),
with the internet open; then, for every submission, it copies `run_autograder` to /autograder/run_autograder
and runs it from /autograder. Here that image is a Debian 11 (bullseye) base made by debootstrap
(`make docker-base DEBIAN_SUITE=bullseye`): Ubuntu's archive and Docker Hub cannot be reached from the
kit's test machines, Debian's mirror can. It stands in for Ubuntu 22.04 in what setup.sh depends on: a
python3 below the kit's floor (3.9 here, 3.10 there) with venv and pip, bash, root, no uv, no Python the kit
can use, so setup.sh must have uv install one.

uv installs a managed Python from python-build-standalone's releases on GitHub, which cannot be reached
here: it reads them from a local mirror instead (docker/python_mirror.py: CPython 3.13 built from Debian's
source tarball on the same base, with uv's own list of downloads naming its hash), through uv's two
documented settings, given to setup.sh and nothing else. Those, and the host's CA bundle (for the proxy the
kit's test machines reach PyPI through), stand in for the internet Gradescope has; no variable of the kit's
is set. The uv cache of the set-up is kept between runs under the engine's cache folder.

The set-up container is committed as an image, and each submission runs in a fresh container of it:
with Docker's default seccomp profile (bubblewrap is refused there, as in a container that refuses user
namespaces), and with the kit's profile (docker/seccomp.json: bubblewrap works).
Skipped, with the reason, where no Docker engine can be had or the base cannot be made.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import doc_commands
import pytest
from notebook_variants import LAB_3_TESTS

from labkit.grading.publish import gradescope

pytestmark = pytest.mark.machine_wide  # see conftest.py: one worker runs such modules in turn

ROOT = Path(__file__).resolve().parents[2]
BASE = "labkit-base:bullseye"
SET_UP = "labkit-test-gradescope:lab-3"
CA = Path("/etc/ssl/certs/ca-certificates.crt")
ADVERSARIAL = Path(__file__).parent / "adversarial"
LAB_3_POINTS = LAB_3_TESTS  # a point a test


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"labkit_docker_{name}", ROOT / "docker" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


engine_module, python_mirror = _load("engine"), _load("python_mirror")


@pytest.fixture(scope="module")
def engine():
    env, started, why = engine_module.start()
    if env is None:
        pytest.skip(f"no Docker engine: {why}")
    env = dict(env, NO_COLOR="1")
    yield env
    # The set-up image of an earlier run, no longer tagged, goes; the base and the Python archive's image stay.
    docker(env, "image", "prune", "-f", check=False, timeout=300)
    if started:
        engine_module.stop()


def docker(engine, *args, timeout=600, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", str(ROOT / "docker" / "client.sh"), *args],
        env=engine,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def base(engine):
    """Debian 11 from Debian's mirror: python3 3.9 (with venv), bash, root; made once per engine."""
    if docker(engine, "image", "inspect", BASE, check=False).returncode != 0:
        if os.geteuid() != 0 or not shutil.which("debootstrap"):
            pytest.skip(f"no {BASE} image, and debootstrap (as root) cannot make one here")
        done = subprocess.run(
            ["make", "--no-print-directory", "docker-base", "DEBIAN_SUITE=bullseye", f"BASE_IMAGE={BASE}"],
            cwd=ROOT,
            env=engine,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    version = docker(
        engine, "run", "--rm", BASE, "python3", "-c", "import sys; print(sys.version_info[:2])"
    ).stdout
    assert version.strip() == "(3, 9)", version  # below the kit's floor, as Ubuntu 22.04's 3.10 is
    return BASE


@pytest.fixture(scope="module")
def mirror(engine, base, tmp_path_factory) -> Path:
    return python_mirror.build(engine, tmp_path_factory.mktemp("python-mirror"), base)


def unpack(zip_path: Path, dest: Path) -> Path:
    """The zip unpacked as Gradescope unpacks it into /autograder/source (file modes kept)."""
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            z.extract(info, dest)
            (dest / info.filename).chmod(info.external_attr >> 16 & 0o777)
    return dest


@pytest.fixture(scope="module")
def zips(tmp_path_factory) -> dict[str, Path]:
    """The two autograders the TA guide's lines build, each kept as it was written."""
    tmp, built = tmp_path_factory.mktemp("zips"), ROOT / "build" / "gradescope" / "lab-3.zip"
    lines = {
        "sandbox": doc_commands.typed("make gradescope LAB=3"),
        "limits-only": doc_commands.typed("make gradescope LAB=3 ISOLATION=limits-only"),
    }
    zips = {}
    for kind, line in lines.items():
        built.unlink(missing_ok=True)
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=ROOT,
            env=doc_commands.user_environment(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0 and built.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
        zips[kind] = tmp / kind / built.name
        zips[kind].parent.mkdir()
        shutil.copy2(built, zips[kind])
    return zips


def _setup_sh(zip_path: Path) -> bytes:
    with zipfile.ZipFile(zip_path) as z:
        return z.read("setup.sh")


@pytest.fixture(scope="module")
def set_up(engine, base, mirror, zips, tmp_path_factory):
    """setup.sh run once as Gradescope runs it, the container then kept as an image; (image, seconds, its output)."""
    # One set-up serves both zips: they differ in run_autograder alone.
    assert _setup_sh(zips["sandbox"]) == _setup_sh(zips["limits-only"])
    source = unpack(zips["sandbox"], tmp_path_factory.mktemp("source"))
    cache = engine_module.cache_dir() / "gradescope-uv-cache"
    cache.mkdir(parents=True, exist_ok=True)
    name = "labkit-test-gradescope-setup"
    docker(engine, "rm", "-f", name, check=False)
    # The internet Gradescope has during set-up: the mirror (uv's settings, for this one command) and the CA.
    internet = {
        **python_mirror.uv_settings("/mirror"),
        **({"SSL_CERT_FILE": "/run/ca.crt", "PIP_CERT": "/run/ca.crt"} if CA.exists() else {}),
    }
    mounts = [
        "-v",
        f"{source}:/zip:ro",
        "-v",
        f"{mirror}:/mirror:ro",
        "-v",
        f"{cache}:/root/.cache/uv",
        *(["-v", f"{CA}:/run/ca.crt:ro"] if CA.exists() else []),
    ]
    command = (
        "mkdir -p /autograder/source && cp -a /zip/. /autograder/source/ && cd /autograder/source && "
        f"env {' '.join(f'{k}={v}' for k, v in internet.items())} ./setup.sh"
    )
    started = time.monotonic()
    done = docker(
        engine, "run", "--name", name, *mounts, base, "bash", "-c", command, timeout=3600, check=False
    )
    seconds = time.monotonic() - started
    try:
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        # The variables were the command's alone: the committed image has none of them.
        docker(engine, "commit", name, SET_UP)
    finally:
        docker(engine, "rm", "-f", name, check=False)
    env = docker(engine, "image", "inspect", "--format", "{{json .Config.Env}}", SET_UP).stdout
    assert not re.search(r"UV_|SSL_CERT|PIP_CERT|LABKIT_", env), env
    return SET_UP, seconds, done.stdout + done.stderr


def sandbox_options() -> list[str]:
    """The kit's profile as `make docker-grade` gives it (from the Makefile), less its `--cap-drop ALL`: Gradescope
    runs run_autograder as root with Docker's default capabilities, and root with none (no CAP_SETUID) is
    refused the uid map of bubblewrap's namespace, where `make docker-grade`'s non-root user is not."""
    plan = subprocess.run(
        ["make", "-n", "docker-grade"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    options = re.findall(r"--security-opt \S+|--pids-limit \S+", plan)
    assert any("seccomp=" in o for o in options) and "--cap-drop ALL" in plan, plan
    return [word for option in options for word in option.split()]


def submission(tmp_path: Path, notebook: Path | str) -> Path:
    folder = tmp_path / "submission"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "lab-3.ipynb"
    if isinstance(notebook, Path):
        shutil.copy2(notebook, target)
    else:
        target.write_text(notebook)
    return folder


def with_cell(source: str) -> str:
    """Lab 3's student notebook with `source` as a new cell right after the exercise's cell."""
    import nbformat

    nb = nbformat.read(ROOT / "labs" / "lab-3.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "def shard_map_double" in c.source)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    return nbformat.writes(nb)


def run_autograder(
    engine, image: str, tmp_path: Path, notebook: Path | str, *options: str, script: Path | None = None
) -> tuple[dict, subprocess.CompletedProcess, dict]:
    """A fresh container of the set-up image: run_autograder copied to /autograder and run from there on the
    submission, as root; (results.json, the run, what was measured: seconds, peak memory of the container)."""
    results = tmp_path / "results"
    results.mkdir(parents=True, exist_ok=True)
    mounts = [
        "-v",
        f"{submission(tmp_path, notebook)}:/autograder/submission",
        "-v",
        f"{results}:/autograder/results",
    ]
    copy = "cp /autograder/source/run_autograder /autograder/run_autograder"
    if script is not None:
        mounts += ["-v", f"{script}:/zip/run_autograder:ro"]
        copy = "cp /zip/run_autograder /autograder/run_autograder"
    peak = (
        "cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.peak "
        "2>/dev/null || echo 0"
    )
    command = f'{copy} && cd /autograder && ./run_autograder; echo "exit=$?"; echo "peak=$({peak})"'
    started = time.monotonic()
    done = docker(
        engine, "run", "--rm", *options, *mounts, image, "bash", "-c", command, timeout=1800, check=False
    )
    measured = {"seconds": time.monotonic() - started}
    found = re.search(r"^peak=(\d+)$", done.stdout, re.MULTILINE)
    measured["peak_mib"] = int(found.group(1)) / (1 << 20) if found else None
    assert done.returncode == 0 and "exit=0" in done.stdout, (done.stdout + done.stderr)[-6000:]
    answer = json.loads((results / "results.json").read_text())
    gradescope.validate(answer)
    print(f"measured: {measured}")  # shown with -s; the figures in docs/grading.md come from these
    return answer, done, measured


def test_setup_sh_has_uv_install_python_3_13_from_the_mirror_on_a_base_whose_python3_is_too_old(
    engine, set_up
):
    image, seconds, printed = set_up
    print(f"setup.sh took {seconds:.0f} s")
    assert re.search(r"setup: Python 3\.13\.\d+ \(/root/\.local/share/uv/python/cpython-3\.13", printed), (
        printed
    )
    versions = docker(
        engine,
        "run",
        "--rm",
        image,
        "/autograder/source/.venv/bin/python",
        "-c",
        "import sys, jax; print(*sys.version_info[:2], jax.__version__)",
    ).stdout.split()
    assert versions == ["3", "13", "0.12.0.1"], versions


def test_with_the_kits_profile_lab_3s_reference_scores_every_point_in_the_sandbox(engine, set_up, tmp_path):
    results, done, _ = run_autograder(
        engine, set_up[0], tmp_path, ROOT / "reference" / "lab-3.ipynb", *sandbox_options()
    )
    assert results["score"] == LAB_3_POINTS, results["output"] + done.stdout[-3000:]
    assert len(results["tests"]) == LAB_3_POINTS and {t["status"] for t in results["tests"]} == {"passed"}
    assert "Graded on cpu-1, cpu-8" in results["output"] and gradescope.NOT_SANDBOXED not in results["output"]


def test_with_the_kits_profile_the_unmodified_student_notebook_scores_nothing(engine, set_up, tmp_path):
    results, _, _ = run_autograder(
        engine, set_up[0], tmp_path, ROOT / "labs" / "lab-3.ipynb", *sandbox_options()
    )
    assert results["score"] == 0 and len(results["tests"]) == LAB_3_POINTS, results["output"]
    assert {t["status"] for t in results["tests"]} == {"failed"}


def test_a_notebook_that_crashes_its_kernel_still_gets_results_that_say_so(engine, set_up, tmp_path):
    crash = with_cell((ADVERSARIAL / "segfault.py").read_text())
    results, _, _ = run_autograder(engine, set_up[0], tmp_path, crash, *sandbox_options())
    assert results["score"] == 0, results["output"]
    assert re.search(r"cpu-1: the run ended with error: .*(died|signal 11)", results["output"]), results[
        "output"
    ]


def test_with_dockers_default_profile_the_sandbox_cannot_be_made_and_nothing_is_graded(
    engine, set_up, tmp_path
):
    results, _, _ = run_autograder(engine, set_up[0], tmp_path, ROOT / "reference" / "lab-3.ipynb")
    assert results["score"] == 0 and results["tests"] == [], results["output"]
    assert (
        "this submission was not graded" in results["output"] and "ISOLATION=limits-only" in results["output"]
    )


def test_built_limits_only_by_name_it_grades_there_and_every_result_says_it_was_not_sandboxed(
    engine, set_up, zips, tmp_path
):
    script = unpack(zips["limits-only"], tmp_path / "zip") / "run_autograder"
    results, _, _ = run_autograder(
        engine, set_up[0], tmp_path, ROOT / "reference" / "lab-3.ipynb", script=script
    )
    assert results["score"] == LAB_3_POINTS, results["output"]
    assert gradescope.NOT_SANDBOXED in results["output"]
    assert all(t["output"].startswith(gradescope.NOT_SANDBOXED) for t in results["tests"])


def test_uv_refuses_a_mirrored_python_whose_hash_is_not_the_listed_one(mirror, tmp_path):
    uv = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    listed = json.loads((mirror / "downloads.json").read_text())
    for entry in listed.values():
        entry["sha256"] = "0" * 64
    (tmp_path / "downloads.json").write_text(json.dumps(listed))
    settings = python_mirror.uv_settings(str(mirror)) | {
        "UV_PYTHON_DOWNLOADS_JSON_URL": str(tmp_path / "downloads.json")
    }
    # an explicit install, as setup.sh's (make exports UV_PYTHON_DOWNLOADS=never for the kit's own set-up)
    env = dict(
        os.environ,
        UV_PYTHON_INSTALL_DIR=str(tmp_path / "python"),
        UV_PYTHON_BIN_DIR=str(tmp_path / "bin"),
        UV_CACHE_DIR=str(tmp_path / "cache"),
        UV_PYTHON_DOWNLOADS="manual",
        **settings,
    )
    done = subprocess.run(
        [uv, "python", "install", "3.13"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode != 0 and "0" * 64 in done.stderr, done.stderr
    assert not list((tmp_path / "python").glob("cpython-3.13*"))
