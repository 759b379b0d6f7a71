"""infra/startup.sh, the workshop VMs' startup script, run locally.

The real run (CPU mode, in a temporary folder, against this checkout's committed HEAD, with the
environment built from uv's cache) installs the student release, checks it with the smoke lab as a
student gets it, and starts JupyterLab, which answers. The quicker runs use a recording `make` and
`gcloud`: TPU mode, a multi-host slice, restoring labs/ from a backup, and the backup helper.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STARTUP = ROOT / "infra/startup.sh"


def run(cmd, *, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout)


def _uv_dir() -> str:
    """Where `uv` is: on the PATH, or the kit's private copy that `make setup` made."""
    uv = shutil.which("uv") or (ROOT / ".tools/bin/uv")
    if not Path(uv).exists():
        pytest.skip("uv not found (run `make setup` first)")
    return str(Path(uv).parent)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _startup_env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_", "JAX_", "XLA_"))}
    env.update(
        LABKIT_REPO=str(ROOT),
        LABKIT_REF="HEAD",
        LABKIT_HOME=str(tmp / "kit"),
        LABKIT_MODE="cpu",
        LABKIT_SYSTEM_PACKAGES="0",
        LABKIT_LOG=str(tmp / "log" / "labkit-startup.log"),
        LABKIT_STATE=str(tmp / "state"),
        LABKIT_SYSTEM_ENV=str(tmp / "environment"),
        LABKIT_USER=subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip(),
        LABKIT_JUPYTER="off",
        LABKIT_BACKUP="",
        LABKIT_STUDENT="ada",
        # Build the environment from uv's cache (filled by this machine's own `make setup`): no download.
        UV_OFFLINE="1",
        PATH=_uv_dir() + os.pathsep + env["PATH"],
    )
    env.update(extra)
    return env


# ---- the real run -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def booted(tmp_path_factory):
    """One real run in CPU mode with JupyterLab in the background; stopped when the module ends."""
    tmp = tmp_path_factory.mktemp("vm")
    port = _free_port()
    result = run(
        ["bash", str(STARTUP)],
        env=_startup_env(tmp, LABKIT_JUPYTER="background", LABKIT_JUPYTER_PORT=str(port)),
        timeout=1200,
    )
    log = (tmp / "log" / "labkit-startup.log").read_text()
    yield tmp, port, result, log
    pid_file = tmp / "state" / "jupyter.pid"
    if pid_file.exists():
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        except ProcessLookupError:
            pass


def test_startup_script_ends_ready_after_the_smoke_lab_reports_not_implemented_yet(booted):
    tmp, _, result, log = booted
    assert result.returncode == 0, log[-3000:]
    status = (tmp / "state" / "status").read_text()
    assert status.startswith("ready: lab 3 as shipped reports not implemented yet on cpu-8"), status
    assert "every one not implemented yet" in log
    report = json.loads((tmp / "state/smoke/build/lab-3/report.json").read_text())
    assert report["outcomes"] and {o["status"] for o in report["outcomes"]} == {"todo"}


def test_the_students_disk_holds_the_release_and_no_reference_or_hidden_tests(booted):
    tmp, _, result, log = booted
    assert result.returncode == 0, log[-3000:]
    kit = tmp / "kit"
    assert (kit / ".labkit-release").exists() and (kit / "labs/lab-3.ipynb").exists()
    assert (kit / "tests/public").is_dir()
    assert not (kit / "reference").exists() and not (kit / "tests/hidden").exists()
    # Nowhere on the "disk": not in the staging clone (deleted), not in the state folder.
    leftovers = [p for p in tmp.rglob("*") if p.name == "reference" or p.match("tests/hidden")]
    assert leftovers == []
    assert not (tmp / "state/src").exists(), "the staging clone is deleted once the release is built"


def test_jupyterlab_answers_and_serves_the_students_labs(booted):
    tmp, port, result, log = booted
    assert result.returncode == 0, log[-3000:]
    assert f"JupyterLab on 127.0.0.1:{port}" in (tmp / "state" / "status").read_text()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as r:
        assert r.status == 200 and "last_activity" in json.load(r)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/labs", timeout=10) as r:
        names = {item["name"] for item in json.load(r)["content"]}
    assert "lab-3.ipynb" in names
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=10) as r:
        assert r.status == 200 and "JupyterLab" in r.read().decode()


def test_the_environment_is_the_students_selection_and_up_to_date(booted):
    tmp, _, result, log = booted
    assert result.returncode == 0, log[-3000:]
    kit = tmp / "kit"
    assert (kit / ".venv" / "bin" / "jupyter-lab").exists(), "students get JupyterLab"
    assert not (kit / ".venv" / "bin" / "checkov").exists(), "the kit's own tools stay off the VMs"
    selection = dict(line.split("=", 1) for line in (tmp / "environment").read_text().splitlines())
    assert selection == {"EXTRAS": "", "DEP_GROUPS": "notebook"}
    up_to_date = run(
        ["make", "-q", "-C", str(kit), ".venv/.synced", *(f"{k}={v}" for k, v in selection.items())]
    )
    assert up_to_date.returncode == 0, "a student's make lab-N would install again"
    assert not list((kit / ".venv").glob("lib/python*/site-packages/libtpu*")), (
        "jax[tpu] belongs on TPU VMs only"
    )


def test_the_release_and_its_environment_are_read_only_to_other_users(booted):
    tmp, _, result, log = booted
    assert result.returncode == 0, log[-3000:]
    kit = tmp / "kit"
    for path in (kit, kit / "labkit", kit / "Makefile", kit / "labs", kit / ".venv/bin"):
        assert not path.stat().st_mode & 0o022, f"{path} is writable by group or others"


def test_startup_script_writes_the_failing_step_where_a_ta_reads_it(tmp_path):
    env = _startup_env(tmp_path, LABKIT_REPO=str(tmp_path / "no-such-repo"))
    result = run(["bash", str(STARTUP)], env=env)
    assert result.returncode != 0
    status = (tmp_path / "state" / "status").read_text()
    assert status.startswith("failed: fetching the kit from")
    assert str(tmp_path / "log" / "labkit-startup.log") in status


# ---- quick runs with a recording make and gcloud ---------------------------------------------------

FAKE_PYTHON = textwrap.dedent("""\
    #!/bin/sh
    echo "python $*" >> "$FAKE_RECORD"
    if [ "$1" = - ]; then exec python3 "$@"; fi
    case "$*" in
      *"labkit release --out "*)
        out=$(echo "$*" | sed 's/.*--out //')
        mkdir -p "$out/labs" "$out/tests/public" && touch "$out/.labkit-release"
        echo '{"cells": []}' > "$out/labs/lab-3.ipynb" ;;
      *"labkit lab "*)
        mkdir -p "$LABKIT_BUILD/lab-3"
        echo '{"outcomes": [{"status": "todo"}, {"status": "todo"}]}' > "$LABKIT_BUILD/lab-3/report.json" ;;
    esac
""")


def _recording_tools(tmp: Path) -> tuple[Path, Path, Path]:
    """A `make` that records its arguments and leaves a recording `.venv/bin/python` where it was
    asked to set up; a `gcloud` whose storage commands work on a folder standing in for the bucket."""
    bin_dir = tmp / "fakebin"
    bin_dir.mkdir()
    record = tmp / "calls.log"
    bucket = tmp / "bucket"
    (bin_dir / "python-fake").write_text(FAKE_PYTHON)
    make = textwrap.dedent(f"""\
        #!/bin/sh
        echo "make $*" >> {record}
        mkdir -p "$2/.venv/bin"
        cp {bin_dir / "python-fake"} "$2/.venv/bin/python"
        chmod +x "$2/.venv/bin/python"
    """)
    gcloud = textwrap.dedent(f"""\
        #!{sys.executable}
        import os, shutil, sys
        args = sys.argv[1:]
        open("{record}", "a").write("gcloud " + " ".join(args) + "\\n")
        local = lambda url: url.replace("gs://", "{bucket}/") if url.startswith("gs://") else url
        if args[:2] == ["storage", "ls"]:
            sys.exit(0 if os.path.isdir(local(args[2])) else 1)
        if args[:2] == ["storage", "rsync"]:
            src, dst = [local(a) for a in args if not a.startswith("-") and a not in ("storage", "rsync")][-2:]
            shutil.copytree(src, dst, dirs_exist_ok=True)
    """)
    for name, text in (("make", make), ("gcloud", gcloud)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir, record, bucket


def _quick(tmp: Path, **extra) -> tuple[subprocess.CompletedProcess, list[str]]:
    if not (tmp / "fakebin").exists():
        _recording_tools(tmp)
    bin_dir, record = tmp / "fakebin", tmp / "calls.log"
    env = _startup_env(tmp, FAKE_RECORD=str(record), **extra)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    result = run(["bash", str(STARTUP)], env=env)
    return result, record.read_text().splitlines() if record.exists() else []


def test_startup_script_in_tpu_mode_installs_jax_tpu_and_smokes_on_tpu(tmp_path):
    result, calls = _quick(tmp_path, LABKIT_MODE="tpu")
    assert result.returncode == 0, result.stdout + result.stderr
    makes = [c for c in calls if c.startswith("make ")]
    assert makes == [
        f"make -C {tmp_path / 'state/src'} setup DEP_GROUPS=notebook",
        f"make -C {tmp_path / 'kit'} setup EXTRAS=tpu DEP_GROUPS=notebook",
    ]
    smoke = next(c for c in calls if "labkit lab 3" in c)
    assert "--configs tpu" in smoke and f"--notebook {tmp_path / 'state/smoke/lab-3.ipynb'}" in smoke
    assert (
        (tmp_path / "state" / "status")
        .read_text()
        .startswith("ready: lab 3 as shipped reports not implemented yet on tpu")
    )
    assert (tmp_path / "environment").read_text() == "EXTRAS=tpu\nDEP_GROUPS=notebook\n"


def test_a_smoke_lab_that_passes_or_errs_is_a_failed_boot(tmp_path):
    _recording_tools(tmp_path)
    fake = tmp_path / "fakebin/python-fake"
    fake.write_text(
        fake.read_text().replace(
            '{"status": "todo"}, {"status": "todo"}', '{"status": "todo"}, {"status": "error"}'
        )
    )
    result, _ = _quick(tmp_path)
    assert result.returncode != 0
    status = (tmp_path / "state" / "status").read_text()
    assert status.startswith("failed: smoke lab: lab 3 as shipped on cpu-8")
    assert "got ['error', 'todo']" in (tmp_path / "log/labkit-startup.log").read_text()


def test_startup_script_on_a_multi_host_slice_leaves_the_tpu_run_to_all_workers(tmp_path):
    result, calls = _quick(tmp_path, LABKIT_MODE="tpu", LABKIT_WORKERS="4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--configs cpu-8" in next(c for c in calls if "labkit lab 3" in c)
    assert "multi-host slice of 4 workers" in (tmp_path / "log" / "labkit-startup.log").read_text()


def test_a_new_vm_restores_the_students_last_backup(tmp_path):
    _, _, bucket = _recording_tools(tmp_path)
    saved = bucket / "spmd-labs/labs/ada"
    saved.mkdir(parents=True)
    (saved / "lab-3.ipynb").write_text('{"cells": ["ada was here"]}')
    result, calls = _quick(tmp_path, LABKIT_BACKUP="gs://spmd-labs/labs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ada was here" in (tmp_path / "kit/labs/lab-3.ipynb").read_text()
    assert f"gcloud storage rsync --recursive gs://spmd-labs/labs/ada {tmp_path / 'kit/labs'}" in calls
    # The smoke lab still runs the lab as shipped, not the student's restored work.
    assert (tmp_path / "state/smoke/lab-3.ipynb").read_text().strip() == '{"cells": []}'


def test_the_backup_helper_copies_labs_to_the_students_folder_in_the_bucket(tmp_path):
    _, _, bucket = _recording_tools(tmp_path)
    result, _ = _quick(tmp_path, LABKIT_BACKUP="gs://spmd-labs/labs")
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "kit/labs/lab-3.ipynb").write_text('{"cells": ["work in progress"]}')
    env = dict(os.environ, PATH=f"{tmp_path / 'fakebin'}{os.pathsep}{os.environ['PATH']}")
    backup = run([str(tmp_path / "state/labkit-backup")], env=env)
    assert backup.returncode == 0, backup.stderr
    assert "work in progress" in (bucket / "spmd-labs/labs/ada/lab-3.ipynb").read_text()
    assert (tmp_path / "state/last-backup").exists()


def test_a_reboot_leaves_the_students_files_as_they_are(tmp_path):
    result, _ = _quick(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "kit/labs/lab-3.ipynb").write_text('{"cells": ["edited"]}')
    again, _calls = _quick(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "edited" in (tmp_path / "kit/labs/lab-3.ipynb").read_text()
    assert "already in" in (tmp_path / "log/labkit-startup.log").read_text()
