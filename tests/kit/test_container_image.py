"""The course image, built and run for real on a Docker engine.

The engine is the one that answers (DOCKER_HOST, or the client's default); else, as root with
`dockerd` installed, the kit's own, started for these tests and stopped after them
(`docker/engine.py`: images and build cache under /var/cache/labkit-docker, kept between runs so
the next `make test` reuses the base image, the layers and uv's downloads). Without either, every
test here is skipped with the reason. Each test builds nothing itself: the image is built once,
by `make docker-build` as a user would (on the Debian base `make docker-base` makes). The make and
docker lines a user types are taken from docs/containers.md (`doc_commands`): a guide that says
something else changes what is run here.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import doc_commands
import pytest

pytestmark = pytest.mark.machine_wide  # see conftest.py: one worker runs such modules in turn

ROOT = Path(__file__).resolve().parents[2]
KIT = "/home/student/kit"
IMAGE = "labkit:cpu"  # what `make docker-build` tags
TPU_IMAGE = "labkit:tpu"  # and with EXTRAS=tpu
CA = Path("/etc/ssl/certs/ca-certificates.crt")
ADVERSARIAL = Path(__file__).parent / "adversarial"
ARTIFACTS = Path(os.environ.get("LABKIT_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
HOST_USER = 4242  # a host user who is neither root nor the image's own user (1000)

_spec = importlib.util.spec_from_file_location("labkit_docker_engine", ROOT / "docker" / "engine.py")
engine_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine_module)


# ---------------------------------------------------------------------------------------------
# The engine and the image.


@pytest.fixture(scope="session")
def engine():
    """The environment the docker client needs; the kit's own engine is stopped after the session
    when this fixture started it."""
    env, started, why = engine_module.start()
    if env is None:
        pytest.skip(f"no Docker engine: {why}")
    env = dict(env, NO_COLOR="1")
    # What earlier runs' builds left (images no tag names any more, build cache beyond 10 GB) goes;
    # the base image, the tagged images and the recent cache (uv's downloads) stay. Before the session's
    # builds, not after them: deleting the layers mostly waits on the disk, which other workers' tests
    # fill with work here, where after the last test it was the suite's last minute.
    # Tidying is housekeeping, never a test: a prune that outlasts its time (a slow disk, a large cache) is
    # left, and the tests build on what is there.
    for tidy in (["image", "prune", "-f"], ["builder", "prune", "-f", "--keep-storage", "10GB"]):
        try:
            subprocess.run(
                ["bash", str(ROOT / "docker" / "client.sh"), *tidy],
                env=env,
                capture_output=True,
                timeout=180,
                check=False,
            )
        except subprocess.TimeoutExpired:
            print(f"docker {' '.join(tidy)}: not done in 180 s; left for a later run", file=sys.stderr)
    yield env
    if started:
        engine_module.stop()


def docker(engine, *args, timeout=600, check=True, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", str(ROOT / "docker" / "client.sh"), *args],
        env=engine,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,
    )
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def make(engine, *args, timeout=1800, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        env=dict(env or engine),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def make_line(engine, words: list[str], timeout=1800) -> subprocess.CompletedProcess:
    """A make line of the guide, as `doc_commands` gives its words, run from the kit's top folder with
    the engine the guide's user exports (DOCKER_HOST) and nothing of the kit's own."""
    return subprocess.run(
        words,
        cwd=ROOT,
        env=doc_commands.user_environment(engine),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def behind_the_proxy() -> dict[str, str]:
    """What the guide adds behind a proxy that inspects TLS, as these machines have one."""
    return {"CA_CERTS": str(CA)} if CA.exists() else {}


@pytest.fixture(scope="session")
def base(engine):
    """The Debian base (`make docker-base`), made once per engine."""
    if docker(engine, "image", "inspect", "labkit-base:trixie", check=False).returncode != 0:
        if os.geteuid() != 0 or not shutil.which("debootstrap"):
            pytest.skip("no labkit-base:trixie image, and debootstrap (as root) cannot make one here")
        done = make_line(engine, doc_commands.with_values("make docker-base"))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return "labkit-base:trixie"


@pytest.fixture(scope="session")
def image(engine, base):
    line = (
        doc_commands.with_values(
            "make docker-build CA_CERTS=/etc/ssl/certs/ca-certificates.crt", CA_CERTS=str(CA)
        )
        if CA.exists()
        else doc_commands.with_values("make docker-build")
    )
    done = make_line(engine, line)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    return IMAGE


def owned_by(path: Path, uid: int) -> list[str]:
    """Files and folders under `path` (itself included) that `uid` does not own."""
    return [str(p) for p in [path, *path.rglob("*")] if p.lstat().st_uid != uid]


def host_folder(tmp_path: Path, name: str, uid: int = HOST_USER) -> Path:
    """A folder owned by the simulated host user, as the user's own checkout would be."""
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp_path, 0o755)
    os.chown(folder, uid, uid)
    return folder


def labs_with(tmp_path: Path, notebook: Path | None = None) -> Path:
    labs = host_folder(tmp_path, "labs")
    for nb in (ROOT / "labs").glob("*.ipynb"):
        shutil.copy2(nb, labs / nb.name)
    if notebook:
        shutil.copy2(notebook, labs / "lab-3.ipynb")
    for p in labs.iterdir():
        os.chown(p, HOST_USER, HOST_USER)
    return labs


def sandbox_options() -> list[str]:
    """The options `make docker-lab` and `make docker-grade` give bubblewrap (from the Makefile)."""
    plan = subprocess.run(
        ["make", "-n", "docker-grade"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    options = re.findall(r"--security-opt \S+|--cap-drop \S+|--pids-limit \S+", plan)
    assert any("seccomp=" in o for o in options), plan
    return [word for option in options for word in option.split()]


# ---------------------------------------------------------------------------------------------
# The student loop: `docker run IMAGE` on the mounted labs/.


@pytest.fixture(scope="module")
def unmodified_run(engine, image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("student")
    labs, build = labs_with(tmp), host_folder(tmp, "build")
    done = docker(
        engine,
        "run",
        "--rm",
        "--user",
        f"{HOST_USER}:{HOST_USER}",
        "-v",
        f"{labs}:{KIT}/labs",
        "-v",
        f"{build}:{KIT}/build",
        image,
        check=False,
        timeout=900,
    )
    return done, build


def test_docker_run_on_the_unmodified_lab_says_not_implemented_yet(unmodified_run):
    done, build = unmodified_run
    assert "not implemented yet" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((build / "lab-3" / "report.json").read_text())
    on_cpu = [o for o in report["outcomes"] if o["config"] in ("cpu-1", "cpu-8")]
    assert {o["config"] for o in on_cpu} == {"cpu-1", "cpu-8"}
    assert {o["status"] for o in on_cpu} == {"todo"}, [(o["config"], o["test"], o["status"]) for o in on_cpu]


def test_files_the_container_writes_to_the_mount_belong_to_the_host_user(unmodified_run):
    _, build = unmodified_run
    assert (build / "lab-3" / "report.json").exists()
    assert owned_by(build, HOST_USER) == []


def typed_by_a_host_user(engine, line: str, folder: Path) -> subprocess.CompletedProcess:
    """`line` typed in `folder` by the host user, whom the engine's group lets reach its socket (the guide's
    'add the user to the `docker` group'), with a home of their own."""
    socket = engine.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not socket.startswith("unix://"):
        pytest.skip(f"the engine is not on a local socket ({socket}): no host user can be given its group")
    env = dict(doc_commands.user_environment(engine), HOME=str(folder), USER="host")
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={HOST_USER}",
            f"--regid={HOST_USER}",
            f"--groups={os.stat(socket.removeprefix('unix://')).st_gid}",
            "bash",
            "-c",
            line,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_the_guides_student_loop_lines_run_on_the_host_users_labs_as_that_user(engine, image):
    folder = Path(tempfile.mkdtemp(prefix="labkit-host-user-", dir="/tmp"))  # a folder every user can reach
    try:
        os.chmod(folder, 0o755)
        os.chown(folder, HOST_USER, HOST_USER)
        labs = labs_with(folder)
        default = typed_by_a_host_user(
            engine,
            doc_commands.typed(
                'docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/labs:/home/student/kit/labs" labkit:cpu'
            ),
            folder,
        )
        assert default.returncode != 0 and "not implemented yet" in default.stdout, (
            default.stdout[-3000:] + default.stderr
        )
        assert "cpu-1" in default.stdout and "cpu-8" in default.stdout, default.stdout[-3000:]
        lab_4 = typed_by_a_host_user(
            engine,
            doc_commands.typed(
                'docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/labs:/home/student/kit/labs" labkit:cpu '
                "make lab-4 CONFIGS=cpu-8"
            ),
            folder,
        )
        assert re.search(r"\d+/\d+ on cpu-8", lab_4.stdout), lab_4.stdout[-3000:] + lab_4.stderr
        assert not re.search(r"\d+/\d+ on cpu-1", lab_4.stdout), "only the configuration asked for"
        assert lab_4.returncode != 0, "lab 4 as handed out does not pass"
        assert owned_by(labs, HOST_USER) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_container_runs_as_the_user_it_is_given_never_root(engine, image):
    assert docker(engine, "run", "--rm", image, "id", "-u").stdout.strip() == "1000"
    assert docker(
        engine, "run", "--rm", "--user", f"{HOST_USER}:{HOST_USER}", image, "id", "-u"
    ).stdout.strip() == str(HOST_USER)


def lab_3_reference_passes_in_the_sandbox(engine, image, tmp_path) -> None:
    """`make lab-3` in `image` on lab 3's reference, as a host user: every test passes on cpu-1 and cpu-8, in bwrap."""
    labs, build = labs_with(tmp_path, ROOT / "reference" / "lab-3.ipynb"), host_folder(tmp_path, "build")
    done = docker(
        engine,
        "run",
        "--rm",
        "--user",
        f"{HOST_USER}:{HOST_USER}",
        *sandbox_options(),
        "-v",
        f"{labs}:{KIT}/labs",
        "-v",
        f"{build}:{KIT}/build",
        image,
        "make",
        "lab-3",
        "CONFIGS=cpu-1,cpu-8",
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((build / "lab-3" / "report.json").read_text())
    by_config = {}
    for o in report["outcomes"]:
        by_config.setdefault(o["config"], set()).add(o["status"])
    assert by_config == {"cpu-1": {"passed"}, "cpu-8": {"passed"}}, by_config
    assert {r["isolation"] for r in report["runs"].values()} == {"bubblewrap"}, report["runs"]


def test_a_correct_notebook_passes_on_cpu_1_and_cpu_8_in_the_kits_sandbox(engine, image, tmp_path):
    lab_3_reference_passes_in_the_sandbox(engine, image, tmp_path)


@pytest.fixture(scope="session")
def bookworm_image(engine):
    """The course image on Debian 12 (Python 3.11, so JAX 0.10.2 from the lock), as `make docker-base
    DEBIAN_SUITE=bookworm` and `make docker-build BASE_IMAGE=...` make it."""
    base_name = "labkit-base:bookworm"
    if docker(engine, "image", "inspect", base_name, check=False).returncode != 0:
        if os.geteuid() != 0 or not shutil.which("debootstrap"):
            pytest.skip(f"no {base_name} image, and debootstrap (as root) cannot make one here")
        done = make_line(engine, doc_commands.with_values("make docker-base DEBIAN_SUITE=bookworm"))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # its own tag, so that the Debian 13 image the other tests run stays labkit:cpu
    done = make_line(
        engine,
        doc_commands.with_values(
            "make docker-build BASE_IMAGE=labkit-base:bookworm",
            also={"IMAGE": "labkit:kit-test-bookworm", **behind_the_proxy()},
        ),
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    return "labkit:kit-test-bookworm"


def test_the_image_on_debian_12_has_jax_0_10_and_passes_lab_3_on_cpu_1_and_cpu_8(
    engine, bookworm_image, tmp_path
):
    versions = docker(
        engine,
        "run",
        "--rm",
        bookworm_image,
        "python",
        "-c",
        "import sys, jax, flax; print(*sys.version_info[:2], jax.__version__, flax.__version__)",
    ).stdout.split()
    assert versions[:3] == ["3", "11", "0.10.2"], versions
    lab_3_reference_passes_in_the_sandbox(engine, bookworm_image, tmp_path)


def test_with_dockers_default_profile_bubblewrap_cannot_make_the_sandbox(engine, image):
    """What the kit's profile is for: under Docker's default seccomp profile, bwrap is refused."""
    probe = "from labkit.run import modes; print(modes.bubblewrap()[1] or 'works')"
    default = docker(engine, "run", "--rm", image, "python", "-c", probe).stdout
    assert default.strip() and default.strip() != "works", default  # the kit's reason why not
    kits = docker(engine, "run", "--rm", *sandbox_options(), image, "python", "-c", probe).stdout
    assert kits.strip() == "works", kits


def test_the_kits_profile_still_refuses_what_bubblewrap_does_not_need(engine, image):
    """keyctl, bpf and kexec_load stay refused (EPERM) under the kit's seccomp profile."""
    script = (
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
        "numbers = {'keyctl': 250, 'bpf': 321, 'kexec_load': 246} if os.uname().machine == 'x86_64' "
        "else {'keyctl': 219, 'bpf': 280, 'kexec_load': 104}; "
        "print({name: (libc.syscall(n, 0, 0, 0, 0, 0), ctypes.get_errno()) for name, n in numbers.items()})"
    )
    out = docker(engine, "run", "--rm", *sandbox_options(), image, "python", "-c", script).stdout
    assert out.strip() == "{'keyctl': (-1, 1), 'bpf': (-1, 1), 'kexec_load': (-1, 1)}", out


# ---------------------------------------------------------------------------------------------
# What the image holds.


def test_the_image_holds_no_reference_solution_and_no_hidden_test(engine, image):
    listing = docker(
        engine,
        "run",
        "--rm",
        image,
        "sh",
        "-c",
        f"cd {KIT} && find . -path ./.venv -prune -o -type f -print0 | xargs -0 sha256sum",
    ).stdout
    inside = {line.split()[0]: line.split(maxsplit=1)[1] for line in listing.splitlines()}
    assert "./labs/lab-3.ipynb" in inside.values() and "./labkit/run/sandbox.py" in inside.values()
    assert not [
        p for p in inside.values() if p.startswith(("./reference/", "./tests/hidden/", "./tests/kit/"))
    ]
    secrets = [
        p
        for p in [*(ROOT / "reference").glob("*.ipynb"), *(ROOT / "tests" / "hidden").rglob("*.py")]
        if p.stat().st_size
    ]
    leaked = [str(p) for p in secrets if hashlib.sha256(p.read_bytes()).hexdigest() in inside]
    assert secrets and not leaked, leaked


# ---------------------------------------------------------------------------------------------
# JupyterLab in a real browser: `make docker-lab`, then headless Chromium.


@pytest.fixture(scope="module")
def jupyterlab(engine, image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jupyterlab")
    labs = tmp / "kit" / "labs"
    labs.mkdir(parents=True)
    shutil.copy2(ROOT / "reference" / "lab-3.ipynb", labs / "lab-3.ipynb")
    port, name = "18888", "labkit-lab-kit-test"
    docker(engine, "rm", "-f", name, check=False)
    log = open(tmp / "docker-lab.log", "w+")  # noqa: SIM115 - the server writes it until the fixture ends
    line = doc_commands.with_values(
        "make docker-lab", also={"PORT": port, "LAB_NAME": name, "LAB_DIR": str(labs)}
    )
    proc = subprocess.Popen(
        line,
        cwd=ROOT,
        env=doc_commands.user_environment(engine),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    url, deadline = None, time.monotonic() + 240
    while time.monotonic() < deadline and url is None:
        time.sleep(1)
        log.seek(0)
        found = re.search(r"http://127\.0\.0\.1:8888/lab\?token=\w+", log.read())
        url = found and found.group(0).replace(":8888/", f":{port}/")
        assert proc.poll() is None, (tmp / "docker-lab.log").read_text()[-3000:]
    assert url, (tmp / "docker-lab.log").read_text()[-3000:]
    yield url, labs, tmp
    docker(engine, "stop", "-t", "5", name, check=False)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_jupyterlab_answers_on_the_published_port(jupyterlab):
    url, _, _ = jupyterlab
    with urllib.request.urlopen(url.replace("/lab?", "/api/status?"), timeout=30) as r:
        assert r.status == 200 and "started" in json.loads(r.read())


def test_chromium_runs_lab_3_in_jupyterlab_and_shows_the_check_cells_output(jupyterlab):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    url, _, _ = jupyterlab
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("Debian's chromium is not installed (make system-deps installs it)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "jupyterlab-lab-3.png"
    for old in (shot, ARTIFACTS / "jupyterlab-lab-3-failed.png"):
        old.unlink(missing_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(url.replace("/lab?", "/lab/tree/labs/lab-3.ipynb?"), timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180_000)
            # The kernel is up when the status bar says so; a "Run All" sent before can be lost, so it
            # is sent again until a cell's prompt shows it queued or run.
            page.get_by_text(re.compile(r"ipykernel\) \| Idle")).first.wait_for(timeout=180_000)
            for _ in range(3):
                page.locator(".jp-Notebook").first.click()
                page.keyboard.press("Escape")
                page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
                page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
                try:
                    page.wait_for_function(
                        "() => [...document.querySelectorAll('.jp-InputPrompt')]"
                        ".some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))",
                        timeout=60_000,
                    )
                    break
                except PlaywrightTimeout:
                    continue
            # The check cell, `check("shard_map_double")`, prints a table: one row per public test, one column
            # each for cpu-1 and cpu-8 (run beside the kernel), then where `make lab-3` goes further.
            output = page.locator(".jp-OutputArea-output", has_text="shard_map_double: public tests")
            output.last.wait_for(timeout=300_000)
            output.last.scroll_into_view_if_needed()
            text = output.last.inner_text()
            # below it, the cost card of the cpu-8 run: in Jupyter a table of bars, not wrapped text
            cards = page.locator("table.labkit-cards")
            cards.last.wait_for(timeout=120_000)
            card_text = cards.last.inner_text()
            page.screenshot(path=str(shot))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "jupyterlab-lab-3-failed.png"))
            raise
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "shard_map_double: public tests" in line)
    assert lines[header + 1].split() == ["cpu-1", "cpu-8"], text
    # the table's rows run up to the line in brackets that says where `make lab-3` goes further
    table = next(
        (
            lines[header + 2 : header + 2 + i]
            for i, line in enumerate(lines[header + 2 :])
            if line.lstrip().startswith("(")
        ),
        lines[header + 2 :],
    )
    rows = [line for line in table if line.strip() and not line.lstrip().startswith("•")]
    assert rows and all(row.split()[-2:] == ["✓", "✓"] for row in rows), text
    # and below it, the cost card of the cpu-8 run, its headline first, yours against the reference
    assert "shard_map_double on cpu-8: " in card_text and "a step on a TPU v5e x8" in card_text, card_text
    assert "yours:" in card_text and "reference:" in card_text, card_text


# ---------------------------------------------------------------------------------------------
# Grading a hostile class: `make docker-grade`, no network, every notebook in the kit's sandbox.

HOSTILE = ["kill_parents", "read_secrets", "fork_bomb", "forge_results_later", "segfault", "markup_injection"]


def with_cell(source: str, path: Path) -> Path:
    """Lab 3's student notebook with `source` as a new cell right after the exercise's cell."""
    import nbformat

    nb = nbformat.read(ROOT / "labs" / "lab-3.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "def shard_map_double" in c.source)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded(engine, image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("class")
    subs, grades = tmp / "submissions", tmp / "grades"
    (subs / "honest").mkdir(parents=True)
    shutil.copy2(ROOT / "reference" / "lab-3.ipynb", subs / "honest" / "lab-3.ipynb")
    (subs / "unmodified").mkdir()
    shutil.copy2(ROOT / "labs" / "lab-3.ipynb", subs / "unmodified" / "lab-3.ipynb")
    for trick in HOSTILE:
        with_cell((ADVERSARIAL / f"{trick}.py").read_text(), subs / trick / "lab-3.ipynb")
    started = time.monotonic()
    done = make_line(
        engine,
        doc_commands.with_values(
            "make docker-grade SUBMISSIONS=submissions GRADES=grades LABS=3",
            SUBMISSIONS=str(subs),
            GRADES=str(grades),
            also={"CONFIGS": "cpu-1", "TIMEOUT": "120"},
        ),
        timeout=1500,
    )
    seconds = time.monotonic() - started
    rows = (
        list(csv.DictReader((grades / "scoreboard.csv").open()))
        if (grades / "scoreboard.csv").exists()
        else []
    )
    return done, grades, {r["student"]: r for r in rows}, seconds


def test_docker_grade_writes_the_scoreboard_to_the_hosts_folder(graded):
    done, grades, rows, _ = graded
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert {"scoreboard.csv", "scoreboard.json", "scoreboard.md", "scoreboard.html"} <= {
        p.name for p in grades.iterdir()
    }
    assert set(rows) == {"honest", "unmodified", *HOSTILE}


def test_docker_grade_runs_every_notebook_in_the_sandbox(graded):
    _, _, rows, _ = graded
    assert rows and {r["isolation"] for r in rows.values()} == {"bubblewrap"}, {
        s: r["isolation"] for s, r in rows.items()
    }


def test_in_the_container_the_honest_notebook_passes_and_no_hostile_one_scores(graded):
    _, _, rows, _ = graded
    honest = rows["honest"]
    assert honest["status"] == "ok" and honest["passed"] == honest["total"] != "0", (
        f"{honest['status']}, {honest['passed']}/{honest['total']}: {honest.get('message', '')[:1500]}"
    )
    assert rows["unmodified"]["passed"] == "0"
    scored = {
        s: rows[s]["passed"] for s in HOSTILE if int(rows[s]["passed"]) > int(rows["unmodified"]["passed"])
    }
    assert not scored, scored


def test_docker_grade_leaves_the_files_it_wrote_to_the_host_user(graded):
    _, grades, _, _ = graded
    assert (grades / "scoreboard.csv").exists()
    assert owned_by(grades, os.getuid()) == []


def test_docker_grade_with_its_default_configurations_grades_every_one_and_starts_warm(
    engine, image, tmp_path
):
    # No CONFIGS: every configuration the container can run, cpu-2x4 among them (its two processes join
    # over gloo in a container with no network), and the one-process runs forked by a warm server.
    subs, grades = tmp_path / "submissions", tmp_path / "grades"
    (subs / "ada").mkdir(parents=True)
    shutil.copy2(ROOT / "reference" / "lab-3.ipynb", subs / "ada" / "lab-3.ipynb")
    done = make_line(
        engine,
        doc_commands.with_values(
            "make docker-grade SUBMISSIONS=submissions GRADES=grades LABS=3",
            SUBMISSIONS=str(subs),
            GRADES=str(grades),
        ),
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = {
        r["config"]: r
        for r in json.loads((grades / "scoreboard.json").read_text())["rows"]
        if r["student"] == "ada"
    }
    assert {"cpu-1", "cpu-8", "cpu-2x4"} <= set(rows), sorted(rows)
    assert {c: r["status"] for c, r in rows.items()} == dict.fromkeys(rows, "ok"), {
        c: r["message"] for c, r in rows.items()
    }
    assert rows["cpu-1"]["start"] == rows["cpu-8"]["start"] == "warm"


def test_the_terms_class_in_the_container_keeps_the_tas_inputs_and_gets_the_rules_grades(
    engine, image, tmp_path
):
    """The class of tests/kit/test_term.py through `make docker-grade`: week 1 with every TA input the guide
    lists, week 2 with nothing but the new export. Each run's grades.csv is the one the rules give (computed
    there from the rows alone), so the roster, policy, overrides, extensions and adjustments of week 1 were
    kept in GRADES/course and used again inside a fresh container."""
    import test_term as term

    inputs = term.ta_inputs()
    for name, text in inputs.items():
        (tmp_path / name).write_text(text)
    grades = tmp_path / "grades"
    week1, week2 = term.export(tmp_path / "week1.zip", week=1), term.export(tmp_path / "week2.zip", week=2)

    def docker_grade(export: Path, given: dict[str, str]):
        return make_line(
            engine,
            doc_commands.with_values(
                "make docker-grade SUBMISSIONS=submissions GRADES=grades LABS=3",
                SUBMISSIONS=str(export),
                GRADES=str(grades),
                also={"CONFIGS": "cpu-1,cpu-8", **given},
            ),
            timeout=1800,
        )

    first = docker_grade(week1, {name.split(".")[0].upper(): str(tmp_path / name) for name in inputs})
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    term.check_grades(grades, week=1, overrides={("s17", term.LAB): 4.0})
    assert sorted(p.name for p in (grades / "course").iterdir()) == sorted(
        [*inputs, "manifest.json", "term.json"]
    )

    second = docker_grade(week2, {})
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    term.check_grades(grades, week=2, overrides={("s17", term.LAB): 4.0})
    assert owned_by(grades, os.getuid()) == []


def test_the_terms_downloads_add_up_in_the_container_and_the_bare_command_is_the_same_again(
    engine, image, tmp_path
):
    """docs/grading.md's term through `make docker-grade`, as its lines are written (on cpu-1 alone, to keep
    it short): lab 3's Canvas download with the course's inputs, then lab 5's, then the bare command. Each
    download is mounted where the kept term names it, so lab 3's grades stay after lab 5's download and the
    bare command grades nothing and changes nothing; the totals are the rules' (tests/kit/test_term_weeks.py)."""
    import test_term_weeks as weeks

    right = {lab: {s: weeks.distinct(weeks.REFERENCE[lab], s) for s in weeks.CANVAS_ID} for lab in (3, 5)}
    lab3 = {s: (right[3][s], False) for s in ("ana", "ben", "cy", "eve")} | {"fay": (weeks.HANDOUT[3], False)}
    lab5 = {s: (right[5][s], s in ("eve", "fay")) for s in ("ana", "cy", "eve", "fay")}
    lab5["ben"] = (weeks.HANDOUT[5], False)
    (tmp_path / "roster.csv").write_text(weeks.roster())
    (tmp_path / "policy.toml").write_text(weeks.policy())
    grades = tmp_path / "grades"
    runs = {}
    at = {"GRADES": str(grades)}
    # the guide's lines, each typed as written (tests/kit/doc_commands.py reads them from this call's text)
    steps = {
        "week 1": doc_commands.with_values(
            "make docker-grade SUBMISSIONS=canvas-lab3.zip ROSTER=roster.csv POLICY=policy.toml GRADES=grades "
            "LABS=3 CONFIGS=cpu-1,cpu-8",
            SUBMISSIONS=str(weeks.canvas(tmp_path / "canvas-lab3.zip", 3, lab3)),
            ROSTER=str(tmp_path / "roster.csv"),
            POLICY=str(tmp_path / "policy.toml"),
            CONFIGS="cpu-1",
            **at,
        ),
        "week 2": doc_commands.with_values(
            "make docker-grade SUBMISSIONS=canvas-lab5.zip GRADES=grades LABS=5",
            SUBMISSIONS=str(weeks.canvas(tmp_path / "canvas lab5 (1).zip", 5, lab5)),
            **at,
        ),
        "bare": doc_commands.with_values("make docker-grade GRADES=grades", **at),
    }
    for name, words in steps.items():
        done = make_line(engine, words, timeout=1500)
        assert done.returncode == 0, f"{name}: " + done.stdout[-4000:] + done.stderr[-4000:]
        runs[name] = (done, (grades / "grades.csv").read_text())
        week = {"students": sorted(weeks.CANVAS_ID), "late_days": {}, "overrides": {}, "adjustments": []}
        if name == "week 1":
            weeks.check_week(grades, week | {"labs": [3]})
        else:
            weeks.check_week(grades, week | {"labs": [3, 5], "late_days": {("fay", 5): 1, ("eve", 5): 1}})
    first, second = weeks.grades_of_text(runs["week 1"][1]), weeks.grades_of_text(runs["week 2"][1])
    assert all(second[s, "3"]["points"] == first[s, "3"]["points"] != "" for s in weeks.CANVAS_ID)
    assert weeks.graded_now(runs["bare"][0]) == [], runs["bare"][0].stderr[-3000:]
    assert runs["bare"][1] == runs["week 2"][1]
    kept = json.loads((grades / "course" / "term.json").read_text())
    assert [s["path"] for s in kept["sources"]] == [
        "/submissions/1-canvas-lab3.zip",
        "/submissions/2-canvas_lab5__1_.zip",
    ]
    assert kept["labs"] == [3, 5] and kept["configs"] == ["cpu-1"]
    assert owned_by(grades, os.getuid()) == []


# ---------------------------------------------------------------------------------------------
# Other builds: the TPU variant, and bases that lack what the image needs.


def test_the_tpu_variant_builds_installs_libtpu_and_runs_the_cpu_configurations(engine, image):
    done = make_line(
        engine, doc_commands.with_values("make docker-build EXTRAS=tpu", also=behind_the_proxy())
    )
    # The build's own check ran lab 3 on cpu-1 and cpu-8 in the TPU image (see the Dockerfile).
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    found = docker(
        engine,
        "run",
        "--rm",
        TPU_IMAGE,
        "python",
        "-c",
        "import importlib.metadata as m; print(m.version('libtpu'))",
    ).stdout
    assert re.fullmatch(r"\d[\w.]*\n", found), found
    configs = docker(engine, "run", "--rm", TPU_IMAGE, "python", "-m", "labkit", "configs").stdout
    assert re.search(r"tpu.*(skip|no TPU|not available)", configs, re.IGNORECASE | re.DOTALL), configs


@pytest.mark.parametrize(
    "missing, remove",
    [("make", "rm -f /usr/bin/make"), ("python3", "rm -f /usr/bin/python3 /usr/bin/python3.*")],
)
def test_a_base_without_python3_or_make_fails_the_build_at_once_with_that_reason(
    engine, base, missing, remove, tmp_path
):
    broken = f"labkit-test-base-without-{missing}"
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN {remove}\n")
    docker(engine, "build", "-t", broken, str(tmp_path))
    started = time.monotonic()
    done = make(
        engine, "docker-build", f"BASE_IMAGE={broken}", f"IMAGE=labkit:kit-test-broken-{missing}", timeout=600
    )
    assert done.returncode != 0
    assert f"the base image has no {missing}" in done.stdout + done.stderr, (
        done.stdout[-3000:] + done.stderr[-3000:]
    )
    # It stopped at the base's first step: `make setup` never started (it would print its first command).
    assert "-m venv .tools" not in done.stdout + done.stderr and time.monotonic() - started < 120
