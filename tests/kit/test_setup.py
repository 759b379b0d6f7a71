"""Set-up: the student's lean selection by default, groups on top when a goal needs them, a few quiet
lines, one clear line for each thing that stops it, and a half-made .venv never taken for a good one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from labkit.machine import doctor, envsetup

ROOT = Path(__file__).resolve().parents[2]
KIT_FILES = ("Makefile", "pyproject.toml", "uv.lock", "README.md")
EVERY_GROUP = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"])


def copy_kit(to: Path) -> Path:
    to.mkdir(parents=True, exist_ok=True)
    for name in KIT_FILES:
        shutil.copy2(ROOT / name, to / name)
    shutil.copytree(ROOT / "labkit", to / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    return to


def uv_on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has uv (the one `make setup` fetched for this checkout) and a Python."""
    uv = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    bin_dir = tmp_path / "uvbin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "uv").exists():
        (bin_dir / "uv").symlink_to(uv)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", NO_COLOR="1")


def make(kit: Path, *args: str, env=None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=kit,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def groups(selection: str) -> list[str]:
    words = selection.split()
    return sorted(words[i + 1] for i, w in enumerate(words[:-1]) if w == "--group")


def planned_selection(kit: Path, *args: str, env=None) -> str | None:
    """The selection `make` would install for these goals, or None when it would install nothing."""
    out = make(kit, "-n", *args, env=env).stdout
    for line in out.splitlines():
        if "labkit.machine.envsetup sync" in line:
            return line.split(" -- ", 1)[1]
    return None


def interpreter(kit: Path) -> str:
    """The `--python EXE` the Makefile puts first in every selection (the Python it picked)."""
    words = planned_selection(kit, "setup").split()
    assert words[0] == "--python", words
    return " ".join(words[:2])


def test_a_students_first_make_lab_installs_only_the_notebook_group(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    assert groups(planned_selection(kit, "lab-3")) == ["notebook"]
    assert groups(planned_selection(kit, "list")) == ["notebook"]


def test_make_test_installs_every_group_on_top(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    (kit / ".venv").mkdir()
    (kit / ".venv" / ".synced").write_text("--no-default-groups --group notebook\n")
    assert groups(planned_selection(kit, "test")) == EVERY_GROUP
    assert groups(planned_selection(kit, "setup", "FOR=test")) == EVERY_GROUP
    assert groups(planned_selection(kit, "lint")) == ["dev", "lint", "notebook"]  # ruff, mypy, vulture: dev


def test_what_is_installed_is_kept_and_not_installed_again(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    python = interpreter(kit)
    (kit / ".venv").mkdir()
    stamp = kit / ".venv" / ".synced"
    stamp.write_text(f"{python} --no-default-groups " + " ".join(f"--group {g}" for g in EVERY_GROUP) + "\n")
    assert planned_selection(kit, "lab-3") is None, (
        "after `make test`, `make lab-3` must not take groups away"
    )
    stamp.write_text("\n")  # a stamp from before: every group was the default then
    assert planned_selection(kit, "setup") is not None  # rewritten once in the new form...
    assert groups(planned_selection(kit, "setup")) == EVERY_GROUP  # ...keeping every group


def test_make_test_adds_libtpu_where_jax_0_12_installs_and_a_later_make_lab_keeps_it(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    python = interpreter(kit)
    new = (
        subprocess.run(
            [python.split()[1], "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        == "True"
    )
    (kit / ".venv").mkdir()
    stamp = kit / ".venv" / ".synced"
    stamp.write_text(f"{python} --no-default-groups --group notebook\n")
    assert (
        "--extra tpu" in planned_selection(kit, "test")
    ) == new  # the TPU configurations' tests need libtpu
    assert ("--extra tpu" in planned_selection(kit, "setup", "FOR=test")) == new
    assert "--extra" not in planned_selection(kit, "setup", "DEP_GROUPS=notebook,dev"), "never for a student"
    stamp.write_text(f"{python} --extra tpu --no-default-groups --group notebook\n")
    assert planned_selection(kit, "lab-3") is None, "an extra installed is kept, not taken away again"


def test_dep_groups_and_extras_are_exact(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    python = interpreter(kit)
    (kit / ".venv").mkdir()
    (kit / ".venv" / ".synced").write_text(f"{python} --no-default-groups --group notebook\n")
    assert planned_selection(kit, "setup", "DEP_GROUPS=notebook") is None
    assert planned_selection(kit, "setup", "EXTRAS=tpu", "DEP_GROUPS=notebook").startswith(
        f"{python} --extra tpu "
    )


def test_first_setup_prints_a_few_lines_and_logs_the_package_list(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    python = interpreter(kit)
    done = make(kit, "setup", env=uv_on_path(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) <= 5, done.stdout
    assert lines[0].startswith("Python 3.") and ": JAX 0." in lines[0], "first: which Python and which JAX"
    assert "packages, about" in lines[1] and "MB to download" in lines[1]
    assert "build/setup.log" in done.stdout
    log = (kit / "build" / "setup.log").read_text()
    assert "+ jaxlib==" in log and "jaxlib" not in done.stdout
    assert (kit / ".venv" / ".synced").read_text().split() == [
        *python.split(),
        "--no-default-groups",
        "--group",
        "notebook",
    ]
    assert make(kit, "-q", ".venv/.synced").returncode == 0, "a finished set-up is up to date"
    assert not list((kit / ".venv").glob("lib/python*/site-packages/ruff")), "the kit's own tools stay out"
    # compiled once here: every run sees .venv read-only, so a module without its .pyc is compiled in every process
    assert list((kit / ".venv").glob("lib/python*/site-packages/jax/__pycache__/__init__.cpython-*.pyc"))


def stand_in_python(tmp_path: Path, reported: str, venv_works: bool = True) -> Path:
    """A `python3` that answers the kit's version check as Python `reported` would, and may lack venv."""
    script = tmp_path / f"python{reported}"
    check = (
        f"from labkit.machine.envsetup import python_problem; import sys; "
        f"p = python_problem({tuple(int(x) for x in reported.split('.'))}, '{script}'); "
        f"print(p, file=sys.stderr) if p else None; sys.exit(1 if p else 0)"
    )
    script.write_text(f"""#!/bin/sh
if [ "$1 $2 $3" = "-m labkit.machine.envsetup check-python" ]; then exec {sys.executable} -c "{check}"; fi
if [ "$1 $2" = "-m venv" ] && [ {str(not venv_works).lower()} = true ]; then
  echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1
fi
exec {sys.executable} "$@"
""")
    script.chmod(0o755)
    return script


def test_a_python_older_than_311_stops_set_up_with_one_clear_line(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    done = make(kit, "lab-3", f"PYTHON={stand_in_python(tmp_path, '3.10.12')}")
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "needs Python 3.11 or newer" in errors[0] and "3.10.12" in errors[0], (
        done.stderr
    )
    assert not (kit / ".venv").exists() and not (kit / ".tools").exists()


def test_a_python_that_is_not_there_is_named(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    done = make(kit, "lab-3", "PYTHON=python3.99-not-here")
    assert done.returncode != 0
    assert "error: `python3.99-not-here` is not on the PATH" in done.stderr


def test_a_python_without_venv_is_named_and_leaves_no_half_made_tools(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    env = dict(
        os.environ, PATH=":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "uv").exists())
    )
    done = make(
        kit, ".tools/bin/uv", f"PYTHON={stand_in_python(tmp_path, '3.11.7', venv_works=False)}", env=env
    )
    assert done.returncode != 0
    assert "no working venv module" in done.stderr and "python3-venv" in done.stderr
    assert not (kit / ".tools").exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root to mount a small tmpfs"
)
def test_a_full_disk_is_named_and_the_half_made_venv_is_not_taken_for_a_good_one(tmp_path):
    kit = copy_kit(tmp_path / "kit")
    env = uv_on_path(tmp_path)
    # The kit on a 60 MB file system: its .venv (hundreds of MB) cannot fit there.
    script = (
        f"mount -t tmpfs -o size=60m tmpfs {tmp_path}/small && cp -a {kit}/. {tmp_path}/small/ && "
        f"cd {tmp_path}/small && make --no-print-directory setup; code=$?; "
        f'make --no-print-directory -q .venv/.synced; echo "up-to-date=$?"; '
        f"ls .venv/.synced 2>/dev/null; exit $code"
    )
    (tmp_path / "small").mkdir()
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    assert "the disk is full" in done.stderr, done.stderr[-2000:]
    assert "up-to-date=1" in done.stdout, "the next make must install again"
    assert ".venv/.synced" not in done.stdout


def test_the_download_size_is_read_from_the_lock_for_this_machine():
    sizes = envsetup.lock_sizes(ROOT / "uv.lock")
    # the lock has two jaxlibs (one per world); each has one wheel for this machine, not the sum of all
    jaxlib = sizes[("jaxlib", envsetup.jax_for(tuple(sys.version_info[:3])))]
    assert 50e6 < jaxlib < 200e6
    assert envsetup.human(234e6) == "234 MB"


def test_doctor_says_the_machine_is_ready_for_the_student_loop():
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "doctor"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout
    for title in (
        "Python",
        "Environment (.venv)",
        "Sandbox (bubblewrap)",
        "Configuration cpu-8",
        "Docker",
        "Chromium",
        "Disk",
        "Memory",
    ):
        assert title in done.stdout
    assert "READY for lab" in done.stdout


def test_doctor_fails_what_was_asked_for_and_gives_the_fix():
    env = dict(os.environ, LABKIT_SANDBOX="none", PATH=str(Path(sys.executable).parent))
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "doctor", "--for", "grade,docker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "NOT READY for grade, docker: Sandbox (bubblewrap); Docker" in done.stdout
    assert "✗ Docker" in done.stdout and "fix: install Docker" in done.stdout
    # the same machine is ready for a student: a missing sandbox only warns there
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "doctor"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "! Sandbox" in done.stdout


def test_doctor_tells_an_unfinished_environment_from_a_missing_one(tmp_path):
    shutil.copy2(ROOT / "uv.lock", tmp_path / "uv.lock")
    assert doctor.check_environment(tmp_path).detail == "not made yet"
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    unfinished = doctor.check_environment(tmp_path)
    assert unfinished.status == doctor.FAIL and "did not finish" in unfinished.detail


# ---------------------------------------------------------------------------------------------
# Which Python: the newest supported one here (JAX 0.12 on 3.12 and newer, 0.10.2 on 3.11), or PYTHON=.


def real_python(version: str) -> str | None:
    """An interpreter of `version` ("3.13") that runs on this machine: on the PATH or installed by pyenv."""
    for _, found, exe in envsetup.pythons_here((f"python{version}", *envsetup._pyenv_pythons())):
        if f"{found[0]}.{found[1]}" == version:
            return exe
    return None


NEWER = next((v for v in ("3.13", "3.12") if real_python(v)), None)
both_worlds = pytest.mark.skipif(
    not (NEWER and real_python("3.11")), reason="needs Python 3.11 and Python 3.12 or newer on this machine"
)


def path_with(tmp_path: Path, **names: str) -> dict[str, str]:
    """An environment whose PATH has only these Pythons (name -> interpreter) before /usr/bin, and no pyenv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, target in names.items():
        (bin_dir / name).symlink_to(target)
    return dict(
        os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", PYENV_ROOT=str(tmp_path / "no-pyenv"), NO_COLOR="1"
    )


def picked(kit: Path, env: dict[str, str], *args: str) -> str:
    """The version of the Python whose `--python` the Makefile's set-up would pass."""
    exe = planned_selection(kit, "setup", *args, env=env).split()[1]
    return subprocess.run(
        [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@both_worlds
def test_set_up_takes_the_newest_python_on_the_path_over_python3(tmp_path):
    env = path_with(
        tmp_path,
        python3=real_python("3.11"),
        **{"python3.11": real_python("3.11"), f"python{NEWER}": real_python(NEWER)},
    )
    kit = copy_kit(tmp_path / "kit")
    assert picked(kit, env) == NEWER


@both_worlds
def test_python_given_by_name_is_the_one_taken(tmp_path):
    env = path_with(tmp_path, **{"python3.11": real_python("3.11"), f"python{NEWER}": real_python(NEWER)})
    kit = copy_kit(tmp_path / "kit")
    assert picked(kit, env, "PYTHON=python3.11") == "3.11"


@both_worlds
def test_a_pyenv_python_that_is_installed_but_not_selected_is_found(tmp_path):
    """pyenv's shim for a version that is not selected exits 127; the version's own folder still counts."""
    shim = tmp_path / "shims" / f"python{NEWER}"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\necho 'pyenv: python{NEWER}: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    pyenv = tmp_path / "pyenv"
    version_bin = pyenv / "versions" / f"{NEWER}.0" / "bin"
    version_bin.mkdir(parents=True)
    (version_bin / f"python{NEWER}").symlink_to(real_python(NEWER))
    env = dict(path_with(tmp_path, python3=real_python("3.11")), PYENV_ROOT=str(pyenv))
    env["PATH"] = f"{shim.parent}:{env['PATH']}"
    done = subprocess.run(
        [real_python("3.11"), "-m", "labkit.machine.envsetup", "pick-python"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert Path(done.stdout.strip()) == (version_bin / f"python{NEWER}").resolve(), done.stdout + done.stderr
    assert picked(copy_kit(tmp_path / "kit"), env) == NEWER


@both_worlds
def test_the_other_world_is_the_python_whose_jax_differs(tmp_path):
    env = path_with(
        tmp_path,
        python3=real_python("3.11"),
        **{"python3.11": real_python("3.11"), f"python{NEWER}": real_python(NEWER)},
    )
    for mine, other in ((NEWER, "3.11"), ("3.11", NEWER)):
        done = subprocess.run(
            [
                real_python("3.11"),
                "-m",
                "labkit.machine.envsetup",
                "pick-python",
                "--other-than",
                f"python{mine}",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip().endswith(f"python{other}"), done.stdout


def test_with_one_python_there_is_no_other_world_and_each_python_gets_its_jax(tmp_path):
    only = real_python("3.11") or sys.executable
    env = path_with(tmp_path, python3=only)
    env["PATH"] = f"{tmp_path / 'bin'}"  # nothing else: not even /usr/bin's Pythons
    done = subprocess.run(
        [only, "-m", "labkit.machine.envsetup", "pick-python", "--other-than", "python3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert envsetup.jax_for((3, 11, 7)) == "0.10.2"
    assert envsetup.jax_for((3, 13, 0)).startswith("0.12.")


def test_an_activated_venv_is_never_the_python_a_venv_is_made_with(tmp_path):
    """With a virtual environment first on the PATH (`source .venv/bin/activate`, the course image), its
    python3.X is not the interpreter set-up names: the one it runs on is."""
    base = (
        real_python(NEWER) if NEWER else real_python("3.11") or sys.executable
    )  # the newest: the one picked
    venv = tmp_path / "activated"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    selection = planned_selection(copy_kit(tmp_path / "kit"), "setup", env=env)
    exe = selection.split()[1]
    assert not exe.startswith(str(venv)), selection
    assert Path(exe).resolve() == Path(base).resolve() or not exe.startswith(str(tmp_path)), selection


@both_worlds
def test_once_venv_exists_every_user_names_the_interpreter_it_was_made_with(tmp_path):
    """Set-up by root (or on a machine with a newer Python since) and a later `make lab-N` by anyone name the
    same interpreter, so the environment is not taken for another and made again; PYTHON= still moves it."""
    kit = copy_kit(tmp_path / "kit")
    subprocess.run(
        [real_python("3.11"), "-m", "venv", "--without-pip", str(kit / ".venv")],
        check=True,
        capture_output=True,
    )
    env = path_with(tmp_path, python3=real_python("3.11"), **{f"python{NEWER}": real_python(NEWER)})
    assert picked(kit, env) == "3.11"
    assert planned_selection(kit, "setup", env=env).split()[1] == str(Path(real_python("3.11")).resolve())
    assert picked(kit, env, f"PYTHON=python{NEWER}") == NEWER
