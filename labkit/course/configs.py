"""Device configurations, as data, in one place.

Every other part of the kit asks this module what a configuration is called, which
environment a notebook run gets for it, and whether it can run on this machine.
A configuration is applied to a fresh process before JAX starts its backend, so
configurations never leak into each other.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TypedDict

from labkit import envnames
from labkit.machine import accelerators
from labkit.run.allowance import DEFAULT_LIMITS, Limits

# Variables that decide which devices JAX sees. A run never inherits them from the
# caller: the configuration alone sets them. (TPU_* variables are facts of a TPU host that
# libtpu reads; they pass through.)
_DEVICE_VARIABLES = (
    "JAX_PLATFORMS",
    "JAX_PLATFORM_NAME",
    "JAX_NUM_CPU_DEVICES",
    "XLA_FLAGS",
    "JAX_COORDINATOR",
    "JAX_LOCAL_DEVICE_IDS",
    envnames.COORDINATOR,
    envnames.NUM_PROCESSES,
    envnames.PROCESS_ID,
    envnames.LOCAL_DEVICE_IDS,
    envnames.CPU_COLLECTIVES,
    "JAX_DEFAULT_MATMUL_PRECISION",
    "XLA_PYTHON_CLIENT_",
    envnames.TPU_TOPOLOGY,
)

# The precision of float32 matrix products on an accelerator configuration. TPUs multiply float32 in
# one bfloat16 pass by default, recent NVIDIA GPUs in TF32: errors near 1e-3, which would fail checks
# written against float64 numpy. "highest" makes both compute in full float32; a lab that teaches
# lower precision asks for it with `jax.default_matmul_precision`, and the checks' tolerances
# follow the precision a run reports (`harness.environment`, `checks.expect_close`).
# Every TPU judge uses it: the `tpu` configuration runs at it, and the compile-only ones (v5e-8, ...) export at it,
# so the program libtpu compiles for their topology (the bytes it moves: float32 operands as float32) is the one a
# TPU would run.
# The verifier refuses a program whose float32 products ask for less (`verify.LOWER_PRECISION`).
ACCELERATOR_MATMUL_PRECISION = "highest"


@dataclass(frozen=True)
class DeviceConfig:
    name: str
    summary: str
    platform: str  # the jax backend the run must report: "cpu", "gpu" or "tpu"
    env: dict[str, str] = field(default_factory=dict)
    devices: int | None = None  # how many devices the run must see; None: whatever the host has
    processes: int = 1
    # For processes > 1: the environment of each process, joined with jax.distributed (see process_env).
    distributed: dict[str, str] = field(default_factory=dict)
    # Only when named (CONFIGS=, --configs): never in `make lab-N`'s default nor in grading's "every one available".
    on_request: bool = False
    # A compile-only TPU configuration: the TPU topology (e.g. "v5e:2x4") every compiled fact is read from.
    compile_for: str | None = None
    # The least processes (threads included) and memory (bytes) one run on this configuration needs to start at all
    # (`least_for(devices)`): `run_limits` raises a run's limits to them, never lowers them.
    least_processes: int = 0
    least_memory: int = 0
    # The least seconds one notebook on it may run (`least_for(devices)`): `run_timeout` raises a timeout to it.
    least_timeout: float = 0.0

    def availability(self) -> tuple[bool, str]:
        """(True, "") when this configuration can run here, else (False, reason)."""
        if self.compile_for:
            return accelerators.libtpu_available()
        if self.platform == "tpu":
            return tpu_available()
        if self.platform == "gpu":
            return accelerators.gpu_available()
        return True, ""

    def run_limits(self, limits: Limits) -> Limits:
        """`limits` as a run on this configuration gets them: the processes and memory raised
        to what it needs to start (`least_processes`, `least_memory`), never lowered; every other limit as given.
        `labkit lab`, `labkit grade` (local runs and pods) and the kit's verifier all run under these."""
        from dataclasses import replace

        return replace(
            limits,
            processes=max(limits.processes, self.least_processes),
            memory=max(limits.memory, self.least_memory),
        )

    def run_timeout(self, timeout: float) -> float:
        """`timeout` (seconds for one notebook) as a run on this configuration gets it: raised to
        `least_timeout`, never lowered, wherever `run_limits` applies."""
        return max(float(timeout), self.least_timeout)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a run: the caller's, less its device variables, plus this configuration's."""
        base = dict(os.environ if base is None else base)
        env = {k: v for k, v in base.items() if not k.startswith(_DEVICE_VARIABLES)}
        env.update(self.env)
        return env

    def process_env(self, process_id: int, coordinator: str) -> dict[str, str]:
        """What process `process_id` of a multi-process run adds to `environment()`: how to join the others.

        The kit's first cell (`harness.join_distributed`) reads these before the student's cells run.
        """
        if self.processes <= 1:
            return {}
        return {
            **self.distributed,
            envnames.COORDINATOR: coordinator,
            envnames.NUM_PROCESSES: str(self.processes),
            envnames.PROCESS_ID: str(process_id),
        }


def tpu_available() -> tuple[bool, str]:
    return accelerators.tpu_available()


# How the simulated CPU devices compile: without LLVM's optimisations. A lab's programs are small, so
# compiling them is most of a run's work and running them very little: a first run of each reference on
# cpu-1 and cpu-8 takes about a sixth less CPU (BENCHMARKS.md, benchmarks/bench_compile.py). What the kit
# judges a program by is settled before LLVM (its optimised HLO: the collectives, the FLOPs and the memory
# the compiler reports), the same at every level. The compile-only TPU configurations too: their values
# come from the same CPU programs (which then share the compile cache with cpu-N's), and libtpu's
# compiler, which reads the same flags, reported the same facts.
CPU_COMPILE_FLAGS = "--xla_backend_optimization_level=0"


def _on_cpu(devices: int) -> dict[str, str]:
    """The environment of a process of `devices` simulated CPU devices (every CPU configuration's, and the
    compile-only TPU configurations' runs)."""
    return {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices), "XLA_FLAGS": CPU_COMPILE_FLAGS}


# What a run of N simulated CPU devices needs to start, whatever limits it is given (`DeviceConfig.run_limits`).
# XLA:CPU starts about four threads a device, and each reserves a stack of address space it mostly never touches:
# a process of 256 devices (v5e-256's notebook, and its verifier) was measured at 1,041 threads and 10 GiB of
# address space for 0.65 GiB resident; of 8 devices, 37 threads and 1.7 GiB. Under the default limits (1,024
# processes, 4 GiB) such a run dies starting a thread ("Thread tf_XLACompile creation ... failed", signal 6). The
# need below holds that with room for the kernel's own threads and libtpu's compiler. Only where it is more than
# the default limits is it a floor (v5e-256; cpu-N past 32 devices for memory, past about 128 for the rest): at the
# pod sizes every lab runs at, the limits given stand, smaller ones a test asks for included. The kit's verifier
# of lab 14's capstone on 256 devices (its step on 256 sequences of a model dimension of 256, then libtpu's compile
# of its production size) peaked at 12.1 GiB of address space: past 12 GiB, a device failed to allocate and the others waited for it at their first
# all-reduce until XLA:CPU ended the process (40 s, signal 6). A design that computes the whole batch on each row
# of the grid (the heads split, the batch not) peaked at 14.3 GiB in its notebook (5.8 GiB resident), where 14 GiB
# killed the kernel before any test could name its cost. 64 MiB a device gives 18 GiB on 256.
LEAST_PROCESSES, PROCESSES_PER_DEVICE = 256, 6
LEAST_MEMORY, MEMORY_PER_DEVICE = 2 << 30, 64 << 20
# Such a pod compiles slowly too: XLA:CPU partitions every program 256 ways, and libtpu compiles it for a 16 x 16
# topology. On two cores shared with other runs, a lab's reference notebook took up to 110 s on v5e-256 and the
# kit's verifier up to 300 s, past the two minutes each gets by default; where the floors above apply, each gets
# at least two seconds a device (512 s on v5e-256).
SECONDS_PER_DEVICE = 2.0


class Least(TypedDict):
    least_processes: int
    least_memory: int
    least_timeout: float


def least_for(devices: int) -> Least:
    """The `least_processes`, `least_memory` and `least_timeout` of a configuration of `devices` simulated CPU
    devices: what it needs, where that is more than the default limits; else 0 (no floor)."""
    processes = LEAST_PROCESSES + PROCESSES_PER_DEVICE * devices
    memory = LEAST_MEMORY + MEMORY_PER_DEVICE * devices
    large = processes > DEFAULT_LIMITS.processes
    return {
        "least_processes": processes if large else 0,
        "least_memory": memory if memory > DEFAULT_LIMITS.memory else 0,
        "least_timeout": SECONDS_PER_DEVICE * devices if large else 0.0,
    }


# Device counts of the pod sizes a lab must be right on: every lab's inputs divide by each of them.
POD_SIZES = (1, 2, 4, 8, 16, 32)
_NUMBERS = {1: "one", 2: "two", 4: "four", 8: "eight", 16: "sixteen", 32: "thirty-two"}


def cpu(devices: int, *, on_request: bool = True) -> DeviceConfig:
    """`cpu-N`: N simulated CPU devices in one process."""
    if devices < 1:
        raise UnknownConfig(f"cpu-{devices}: a configuration needs at least one device")
    count = _NUMBERS.get(devices, str(devices))
    summary = "one CPU device" if devices == 1 else f"{count} simulated CPU devices in one process"
    return DeviceConfig(
        name=f"cpu-{devices}",
        summary=summary,
        platform="cpu",
        env=_on_cpu(devices),
        devices=devices,
        on_request=on_request,
        **least_for(devices),
    )


def cpu_processes(processes: int, devices: int, *, on_request: bool = True) -> DeviceConfig:
    """`cpu-PxD`: P JAX processes of D CPU devices each, joined over localhost (gloo collectives)."""
    if processes < 2 or devices < 1:
        raise UnknownConfig(
            f"cpu-{processes}x{devices}: a multi-process configuration needs at least two "
            f"processes of at least one device"
        )
    return DeviceConfig(
        name=f"cpu-{processes}x{devices}",
        summary=f"{_NUMBERS.get(processes, processes)} JAX processes of {_NUMBERS.get(devices, devices)} CPU "
        f"device{'s' if devices > 1 else ''} each, joined over localhost",
        platform="cpu",
        env=_on_cpu(devices),
        devices=processes * devices,
        processes=processes,
        distributed={
            envnames.CPU_COLLECTIVES: "gloo",
            envnames.LOCAL_DEVICE_IDS: ",".join(str(i) for i in range(devices)),
        },
        on_request=on_request,
        **least_for(devices),  # each process's own devices
    )


def tpu_compiled(name: str, topology: str, devices: int) -> DeviceConfig:
    """A compile-only TPU configuration: values from `cpu-N`, compiled facts from libtpu's compiler for `topology`.

    No TPU is needed: the notebook and the kit's own run of each program use N CPU devices; every check of
    the compiled program reads the same exported program compiled for the TPU topology (`judge.tpucompile`).
    """
    kind, _, shape = topology.partition(":")
    return DeviceConfig(
        name=name,
        summary=f"compiled for TPU {kind} {shape}, values from cpu-{devices}",
        platform="cpu",
        env=_on_cpu(devices)
        | {envnames.TPU_TOPOLOGY: topology, "JAX_DEFAULT_MATMUL_PRECISION": ACCELERATOR_MATMUL_PRECISION},
        devices=devices,
        on_request=True,
        compile_for=topology,
        **least_for(devices),
    )


# The compile-only TPU configurations, as data: name, topology, chips.
TPU_COMPILED = (
    ("v5e-8", "v5e:2x4", 8),
    ("v6e-8", "v6e:2x4", 8),
    ("v5p-8", "v5p:2x2x2", 8),
    ("v5e-256", "v5e:16x16", 256),
)

CONFIGS: dict[str, DeviceConfig] = {
    c.name: c
    for c in (
        cpu(1, on_request=False),
        cpu(8, on_request=False),
        cpu_processes(2, 4, on_request=False),
        DeviceConfig(
            name="tpu",
            summary="the TPU devices of this VM",
            platform="tpu",
            env={"JAX_PLATFORMS": "tpu", "JAX_DEFAULT_MATMUL_PRECISION": ACCELERATOR_MATMUL_PRECISION},
        ),
        DeviceConfig(
            name="gpu",
            summary="every NVIDIA GPU of this machine, through JAX's CUDA backend",
            platform="gpu",
            # Allocate GPU memory as needed (not 75% of it at start): several runs may share one GPU.
            env={
                "JAX_PLATFORMS": "cuda",
                "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                "JAX_DEFAULT_MATMUL_PRECISION": ACCELERATOR_MATMUL_PRECISION,
            },
            on_request=True,
        ),
        # Pod sizes: every lab's reference must pass on each (see tests/kit/test_pod_sizes.py).
        *(cpu(n) for n in POD_SIZES if n not in (1, 8)),
        cpu_processes(4, 2),
        *(tpu_compiled(*row) for row in TPU_COMPILED),
    )
}

# What `make lab-N` runs when no configuration is named: one and eight CPU devices, and the TPU when there is one.
DEFAULT = ("cpu-1", "cpu-8", "tpu")


class UnknownConfig(ValueError):
    pass


def parse(names: str | list[str] | None) -> list[DeviceConfig]:
    """Configurations from a comma-separated list of names (or the defaults), in the order given."""
    if names is None or names == "" or names == []:
        wanted = list(DEFAULT)
    elif isinstance(names, str):
        wanted = [n.strip() for n in names.split(",") if n.strip()]
    else:
        wanted = list(names)
    found, unknown = {}, []
    for n in dict.fromkeys(wanted):
        config = by_name(n)
        if config is None:
            unknown.append(n)
        else:
            found[n] = config
    if unknown:
        raise UnknownConfig(
            f"unknown device configuration {', '.join(map(repr, unknown))}; "
            f"the configurations are: {', '.join(CONFIGS)} (and cpu-N, cpu-PxD for other counts)"
        )
    return list(found.values())


def by_name(name: str) -> DeviceConfig | None:
    """The configuration called `name`: one of CONFIGS, or any `cpu-N` / `cpu-PxD` with N, D >= 1 and P >= 2."""
    if name in CONFIGS:
        return CONFIGS[name]
    if m := re.fullmatch(r"cpu-([1-9][0-9]{0,2})", name):
        return cpu(int(m.group(1)))
    if (m := re.fullmatch(r"cpu-([1-9][0-9]?)x([1-9][0-9]{0,2})", name)) and int(m.group(1)) >= 2:
        return cpu_processes(int(m.group(1)), int(m.group(2)))
    return None


def graded_by_default() -> list[DeviceConfig]:
    """What grading runs when no configuration is named: every one available here that is not on request."""
    return [c for c in CONFIGS.values() if not c.on_request and c.availability()[0]]
