"""One pod per graded unit, the pod as the sandbox: the kit's side, and the whole path with a real gVisor.

A unit's pod runs its notebook without bubblewrap only when `--isolation pod` is named and its root file
system is read-only; a judge that runs no student code reads what each pod wrote as untrusted data. The
pod is emulated by a container under Debian's runsc (gVisor), as test_gvisor.py starts it: `--network
none`, `--read-only`, the unit's inputs read-only, one output folder, another user, no capabilities. The
judge runs here, on the outputs. Those tests need root, runsc and dockerd (skipped otherwise, with why).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from labkit.run import allowance, modes

sys.path.insert(0, str(Path(__file__).parent))
import test_gvisor  # the Docker engine with the runsc runtime

pytestmark = pytest.mark.machine_wide  # see conftest.py: one worker runs such modules in turn

ROOT = Path(__file__).resolve().parents[2]
PY = [sys.executable, "-m", "labkit"]


def labkit(*args, timeout=600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PY, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False, **kw
    )


def _class(folder: Path, students: dict[str, str]) -> Path:
    for student, text in students.items():
        (folder / student).mkdir(parents=True)
        (folder / student / "lab-3.ipynb").write_text(text)
    return folder


REFERENCE = (ROOT / "reference/lab-3.ipynb").read_text()
ONE_DEVICE = REFERENCE.replace("jax.devices()", "jax.devices()[:1]")  # right on one device, wrong on eight


# ---- no notebook ever runs without bubblewrap unless the pod is named, and is a pod ---------------------


def test_isolation_pod_is_refused_where_the_root_file_system_is_writable():
    with pytest.raises(modes.SandboxUnavailable, match="is writable here"):
        modes.isolation(modes.POD)


def test_read_only_is_taken_from_the_root_mount_as_gvisor_reports_it(tmp_path):
    # gVisor's statfs does not say ST_RDONLY; its mountinfo does (seen under runsc 20221219).
    info = tmp_path / "mountinfo"
    info.write_text("8 8 0:8 / / ro  - 9p none ro,trans=fd\n10 8 0:6 / /dev rw  - tmpfs none rw\n")
    assert modes._read_only("/", str(info))
    info.write_text("8 8 0:8 / / rw,relatime - overlay overlay rw\n")
    assert not modes._read_only("/", str(info))


@pytest.mark.parametrize(
    "make,what",
    [(os.mkfifo, "not a regular file"), (lambda p: os.symlink("/etc/passwd", p), "a symbolic link")],
    ids=["pipe", "link"],
)
def test_a_pods_record_of_its_run_that_is_a_pipe_or_a_link_is_refused_saying_why(tmp_path, make, what):
    from labkit.course import configs
    from labkit.grading.running import pods

    out = tmp_path / "out"
    out.mkdir()
    make(out / pods.ENDED)
    record = pods.record_of(out, configs.CONFIGS["cpu-1"], [], tmp_path / "kit", 60, allowance.DEFAULT_LIMITS)
    assert record.status == "error" and record.results == {}
    assert f"a record the kit does not read ({pods.ENDED} is {what})" in record.message, record.message


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    subs = _class(tmp / "class", {"ada": REFERENCE, "cy": ONE_DEVICE})
    done = labkit(
        "pods",
        "plan",
        "--submissions",
        str(subs),
        "--out",
        str(tmp / "plan"),
        "--labs",
        "3",
        "--configs",
        "cpu-8",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp


def test_the_plan_gives_each_unit_its_notebook_and_calls_but_no_hidden_input(planned):
    units = json.loads((planned / "plan/units.json").read_text())["units"]
    assert [(u["student"], u["config"]) for u in units] == [
        ("reference", "cpu-8"),
        ("ada", "cpu-8"),
        ("cy", "cpu-8"),
    ]
    for u in units:
        folder = planned / "plan/units" / str(u["index"])
        assert sorted(p.name for p in folder.iterdir()) == ["calls.json", "notebook.ipynb", "unit.json"]
    calls = json.loads((planned / "plan/units/1/calls.json").read_text())["calls"]
    verified = [c for c in calls if c.get("verify")]
    assert verified, "lab 3's examined calls are run by the kit"
    for call in verified:  # their arrays as shapes only: no value of the tests' inputs reaches the pod
        assert '"abstract"' in json.dumps(call["args"]) and '"kind": "array"' not in json.dumps(call["args"])


def test_pods_run_refuses_unless_isolation_pod_is_named(planned, tmp_path):
    done = labkit("pods", "run", str(planned / "plan/units/1"), str(tmp_path))
    assert done.returncode == 3 and "--isolation pod" in done.stderr
    named = labkit("pods", "run", str(planned / "plan/units/1"), str(tmp_path), "--isolation", "pod")
    assert named.returncode == 3 and "is writable here" in named.stderr
    assert not any(tmp_path.iterdir()), "nothing ran"


def test_grading_with_isolation_pod_outside_a_pod_grades_nothing(planned, tmp_path):
    done = labkit(
        "grade",
        "--submissions",
        str(planned / "class"),
        "--out",
        str(tmp_path / "out"),
        "--labs",
        "3",
        "--configs",
        "cpu-8",
        "--isolation",
        "pod",
    )
    assert done.returncode == 3 and "is writable here" in done.stderr
    assert not (tmp_path / "out/scoreboard.csv").exists()


# ---- the whole path: pods under gVisor, the judge here ------------------------------------------------


def _pod_image(folder: Path) -> Path:
    """An empty root file system: the pod's programs are this machine's, bound read-only."""
    root = folder / "root"
    for sub in ("proc", "sys", "dev", "tmp", "etc", "unit", "out"):
        (root / sub).mkdir(parents=True)
    tar = folder / "root.tar"
    with tarfile.open(tar, "w") as t:
        t.add(root, arcname=".")
    return tar


def _readable_binds() -> list[str]:
    """What the pod reads, read-only: the system, the kit's Python and environment, and the labkit package alone
    (never reference/ or tests/hidden/)."""
    python = Path(os.path.realpath(sys.executable)).parents[1]
    venv = Path(sys.prefix)
    binds = [p for p in ("/usr", "/lib", "/lib64", "/bin", "/etc") if Path(p).exists()]
    binds += [str(python), str(venv), str(ROOT / "labkit")]
    return [a for p in binds for a in ("-v", f"{p}:{p}:ro")]


@pytest.fixture(scope="module")
def pods(planned):
    why = test_gvisor._missing()
    if why:
        pytest.skip(why)
    engine = test_gvisor.Engine(Path(tempfile.mkdtemp(prefix="lkpd-", dir="/run")))
    try:
        imported = engine.docker("import", str(_pod_image(planned)), "labkit-pod-test")
        assert imported.returncode == 0, imported.stderr
        runs = planned / "runs"
        for unit in json.loads((planned / "plan/units.json").read_text())["units"]:
            out = runs / str(unit["index"])
            out.mkdir(parents=True)
            os.chown(out, 65534, 65534)  # the pod's own output folder, its user's
            done = engine.docker(
                "run",
                "--rm",
                "--runtime=runsc",
                "--network",
                "none",
                "--read-only",
                "--user",
                "65534:65534",
                "--cap-drop",
                "ALL",
                "--cpus",
                "2",
                "--memory",
                "4g",
                "--pids-limit",
                "1024",
                "--tmpfs",
                "/tmp:size=512m",
                "-e",
                "HOME=/tmp",
                *_readable_binds(),
                "-v",
                f"{planned}/plan/units/{unit['index']}:/unit:ro",
                "-v",
                f"{out}:/out",
                "labkit-pod-test",
                sys.executable,
                "-m",
                "labkit",
                "pods",
                "run",
                "/unit",
                "/out",
                "--isolation",
                "pod",
                "--timeout",
                "300",
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        yield planned
    finally:
        engine.stop()
        shutil.rmtree(engine.folder, ignore_errors=True)


def _rows(board: Path) -> dict[str, dict]:
    return {r["student"]: r for r in json.loads((board / "scoreboard.json").read_text())["rows"]}


def _verdict(row: dict) -> tuple:
    """What a row grades. Each test's own message is left out: an error JAX raised in the student's process
    words its devices differently in the pod (under gVisor) and in bubblewrap."""
    return (
        row["status"],
        row["passed"],
        row["total"],
        row["points"],
        row["message"],
        [(t["test"], t["status"], t["points"]) for t in row["tests"]],
    )


@pytest.fixture(scope="module")
def judged(pods):
    """A local run of ada and cy; the judge, here, on the pods' outputs, with three hostile units' outputs made
    as their pods could have made them (each handed in cy's notebook; nothing in a pod's output folder is the kit's)."""
    runs = pods / "runs"
    local = labkit(
        "grade",
        "--submissions",
        str(pods / "class"),
        "--out",
        str(pods / "local"),
        "--labs",
        "3",
        "--configs",
        "cpu-8",
        "--jobs",
        "2",
    )
    assert local.returncode == 0, local.stderr[-3000:]
    units = json.loads((pods / "plan/units.json").read_text())["units"]
    for index, student in ((3, "eve"), (4, "pipe"), (5, "link")):
        (pods / "class" / student).mkdir()
        (pods / "class" / student / "lab-3.ipynb").write_text(ONE_DEVICE)
        units.append({"index": index, "student": student, "lab": 3, "config": "cpu-8"})
        shutil.copytree(runs / "2", runs / str(index), symlinks=True)
    (pods / "plan/units.json").write_text(json.dumps({"units": units}))
    # eve: values it never computed (ada's), beside cy's programs, and a record of a clean run.
    results = runs / "3/run/scratch/results.json"
    payload = json.loads(json.loads(results.read_text())["payload"])
    right = json.loads((pods / "local/units/ada/lab-3/cpu-8.run.json").read_text())["record"]["results"]
    for r in payload["results"]:
        r["value"] = right[str(r["id"])]["value"]
    results.write_text(json.dumps({"payload": json.dumps(payload), "mac": "0" * 64}))
    (runs / "3/pod-run.json").write_text(json.dumps({"status": "ok", "seconds": 1}))
    # pipe: a named pipe for its results, which would block a reader that opened it; link: ada's results, by a link.
    (runs / "4/run/scratch/results.json").unlink()
    os.mkfifo(runs / "4/run/scratch/results.json")
    (runs / "5/run/scratch/results.json").unlink()
    (runs / "5/run/scratch/results.json").symlink_to(runs / "1/run/scratch/results.json")
    graded = labkit(
        "grade",
        "--submissions",
        str(pods / "class"),
        "--out",
        str(pods / "judged"),
        "--labs",
        "3",
        "--configs",
        "cpu-8",
        "--runs-from",
        str(runs),
        "--plan",
        str(pods / "plan"),
        timeout=300,
    )
    assert graded.returncode == 0, graded.stderr[-3000:]
    return pods


def test_a_class_graded_through_pods_has_the_verdicts_of_a_local_run(judged):
    local, pods = _rows(judged / "local"), _rows(judged / "judged")
    assert pods["ada"]["status"] == "ok" and pods["cy"]["status"] == "failed"
    for student in ("ada", "cy"):
        assert _verdict(pods[student]) == _verdict(local[student])
        assert pods[student]["isolation"] == "pod" and local[student]["isolation"] == "bubblewrap"
        assert pods[student]["judged_by"] == local[student]["judged_by"] == "verified"


def test_values_a_pod_wrote_beside_its_programs_gain_nothing(judged):
    pods = _rows(judged / "judged")
    assert _verdict(pods["eve"]) == _verdict(pods["cy"]), "eve is graded on cy's programs, run by the kit"


@pytest.mark.parametrize("student,what", [("pipe", "special file"), ("link", "symbolic link")])
def test_a_link_or_a_pipe_for_results_is_refused_and_never_blocks_the_judge(judged, student, what):
    row = _rows(judged / "judged")[student]
    assert row["status"] == "error" and row["points"] == 0
    assert f"replaced by a {what}" in row["message"]
