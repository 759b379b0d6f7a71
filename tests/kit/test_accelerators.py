"""What a run on an accelerator needs from the machine: its device nodes, its driver, no address-space limit.

Nothing here needs a GPU: each test makes the device nodes and the driver's folder a GPU host
has (as plain files in a folder of its own) and reads what the sandbox would do with them.
"""

from __future__ import annotations

import os
import sys

import pytest

from labkit.machine import accelerators
from labkit.run import allowance, modes, mounts, processes, sandbox

SANDBOXED = modes.isolation()[0] == modes.BUBBLEWRAP


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    """A /dev of an NVIDIA host with two GPUs, as the driver makes it."""
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for node in (
        "nvidia0",
        "nvidia1",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-caps/nvidia-cap1",
    ):
        (dev / node).touch()
    monkeypatch.setattr(accelerators, "DEV", str(dev))
    return dev


def test_a_cpu_host_has_no_accelerator_nodes(tmp_path, monkeypatch):
    monkeypatch.setattr(accelerators, "DEV", str(tmp_path))
    (tmp_path / "null").touch()
    assert accelerators.devices() == [] and accelerators.nvidia_gpus() == []


def test_every_nvidia_node_is_found_and_each_gpu_once(gpu_host):
    names = [os.path.relpath(p, gpu_host) for p in accelerators.nvidia_devices()]
    assert sorted(names) == sorted(
        ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps/nvidia-cap1"]
    )
    assert [os.path.basename(p) for p in accelerators.nvidia_gpus()] == ["nvidia0", "nvidia1"]


def test_the_sandbox_passes_every_nvidia_node_through(gpu_host, tmp_path):
    cmd = mounts.bwrap_command("bwrap", ["true"], tmp_path / "work", allowance.DEFAULT_LIMITS)
    bound = {cmd[i + 1] for i, a in enumerate(cmd) if a == "--dev-bind"}
    assert bound == set(accelerators.nvidia_devices()) and len(bound) == 6


def test_a_cpu_run_keeps_its_address_space_limit():
    assert accelerators.address_space_limit({"JAX_PLATFORMS": "cpu"}, 4 << 30) == 4 << 30


@pytest.mark.parametrize("platforms", ["cuda", "tpu", "cuda,cpu"])
def test_an_accelerator_run_has_no_address_space_limit(platforms):
    # the CUDA plugin reserves far more address space than 4 GiB and, under that limit, fails to load
    assert accelerators.address_space_limit({"JAX_PLATFORMS": platforms}, 4 << 30) is None


def _limits_of_a_run(tmp_path, env: dict) -> str:
    log_path = tmp_path / "log"
    code = (
        "print(open('/proc/self/limits').read()); import os; print('LD', os.environ.get('LD_LIBRARY_PATH'))"
    )
    with open(log_path, "wb") as log:
        proc = sandbox.launch(
            [sys.executable, "-c", code],
            sandbox.RunContext(tmp_path / "work", {"PATH": os.environ["PATH"], **env}, log),
        )
        try:
            proc.wait(timeout=60)
        finally:
            processes.kill_tree(proc.pid)
            proc.wait()
    return log_path.read_text()


def _address_space(text: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith("Max address space"))
    return line.split()[3]


def test_a_launched_cpu_run_has_the_address_space_limit(tmp_path):
    assert _address_space(_limits_of_a_run(tmp_path, {"JAX_PLATFORMS": "cpu"})) == str(
        allowance.DEFAULT_LIMITS.memory
    )


def test_a_launched_gpu_run_has_none(tmp_path):
    assert _address_space(_limits_of_a_run(tmp_path, {"JAX_PLATFORMS": "cuda"})) == "unlimited"


def test_the_driver_folder_named_by_ld_library_path_is_found_only_on_a_gpu_host(
    gpu_host, tmp_path, monkeypatch
):
    driver = tmp_path / "nvidia" / "lib64"
    driver.mkdir(parents=True)
    (driver / "libcuda.so.1").touch()
    assert accelerators.driver_library_folders({"LD_LIBRARY_PATH": f"/nowhere:{driver}"}) == [str(driver)]
    monkeypatch.setattr(accelerators, "DEV", str(tmp_path / "empty"))
    assert accelerators.driver_library_folders({"LD_LIBRARY_PATH": str(driver)}) == []


@pytest.mark.skipif(not SANDBOXED, reason="bubblewrap cannot make a sandbox on this machine")
def test_a_sandboxed_gpu_run_sees_the_driver_folder_on_its_library_path(gpu_host, tmp_path):
    driver = tmp_path / "nvidia" / "lib64"
    driver.mkdir(parents=True)
    (driver / "libcuda.so.1").write_text("driver")
    code = (
        f"import os; print('LD', os.environ.get('LD_LIBRARY_PATH')); "
        f"print('READ', open({str(driver / 'libcuda.so.1')!r}).read())"
    )
    log_path = tmp_path / "log"
    with open(log_path, "wb") as log:
        proc = sandbox.launch(
            [sys.executable, "-c", code],
            sandbox.RunContext(
                tmp_path / "work",
                {"PATH": os.environ["PATH"], "JAX_PLATFORMS": "cuda", "LD_LIBRARY_PATH": str(driver)},
                log,
            ),
        )
        try:
            proc.wait(timeout=60)
        finally:
            processes.kill_tree(proc.pid)
            proc.wait()
    out = log_path.read_text()
    assert f"LD {driver}" in out and "READ driver" in out, out
