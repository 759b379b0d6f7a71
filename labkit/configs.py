"""Device configurations, as data, in one place.

Every other part of the kit asks this module what a configuration is called, which
environment a notebook run gets for it, and whether it can run on this machine.
A configuration is applied to a fresh process before JAX starts its backend, so
configurations never leak into each other.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field

# Variables that decide which devices JAX sees. A run never inherits them from the
# caller: the configuration alone sets them. (TPU_* variables are facts of a TPU host that
# libtpu reads; they pass through.)
_DEVICE_VARIABLES = ("JAX_PLATFORMS", "JAX_PLATFORM_NAME", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS",
                     "JAX_COORDINATOR", "JAX_LOCAL_DEVICE_IDS", "LABKIT_COORDINATOR", "LABKIT_NUM_PROCESSES",
                     "LABKIT_PROCESS_ID", "LABKIT_LOCAL_DEVICE_IDS", "LABKIT_CPU_COLLECTIVES")


@dataclass(frozen=True)
class DeviceConfig:
    name: str
    summary: str
    platform: str  # the jax backend the run must report: "cpu" or "tpu"
    env: dict[str, str] = field(default_factory=dict)
    devices: int | None = None  # how many devices the run must see; None: whatever the host has
    processes: int = 1
    # For processes > 1: the environment of each process, joined with jax.distributed (see process_env).
    distributed: dict[str, str] = field(default_factory=dict)

    def availability(self) -> tuple[bool, str]:
        """(True, "") when this configuration can run here, else (False, reason)."""
        if self.platform == "tpu":
            return tpu_available()
        return True, ""

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
        return {**self.distributed, "LABKIT_COORDINATOR": coordinator,
                "LABKIT_NUM_PROCESSES": str(self.processes), "LABKIT_PROCESS_ID": str(process_id)}


def tpu_available() -> tuple[bool, str]:
    has_chips = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    if has_chips and has_libtpu:
        return True, ""
    if not has_chips:
        return False, "no TPU on this machine (no /dev/accel* or /dev/vfio devices)"
    return False, "TPU devices found but libtpu is not installed: run `make setup EXTRAS=tpu`"


CONFIGS: dict[str, DeviceConfig] = {
    c.name: c
    for c in (
        DeviceConfig(
            name="cpu-1",
            summary="one CPU device",
            platform="cpu",
            env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"},
            devices=1,
        ),
        DeviceConfig(
            name="cpu-8",
            summary="eight simulated CPU devices in one process",
            platform="cpu",
            env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"},
            devices=8,
        ),
        DeviceConfig(
            name="cpu-2x4",
            summary="two JAX processes of four CPU devices each, joined over localhost",
            platform="cpu",
            env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"},
            devices=8,
            processes=2,
            distributed={"LABKIT_CPU_COLLECTIVES": "gloo", "LABKIT_LOCAL_DEVICE_IDS": "0,1,2,3"},
        ),
        DeviceConfig(
            name="tpu",
            summary="the TPU devices of this VM",
            platform="tpu",
            env={"JAX_PLATFORMS": "tpu"},
        ),
    )
}

# What `make lab-N` runs when no configuration is named: every CPU configuration, and the TPU when there is one.
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
    unknown = [n for n in wanted if n not in CONFIGS]
    if unknown:
        raise UnknownConfig(
            f"unknown device configuration {', '.join(map(repr, unknown))}; "
            f"the configurations are: {', '.join(CONFIGS)}"
        )
    return [CONFIGS[n] for n in dict.fromkeys(wanted)]
