"""Facts about this machine's accelerators: which device files a run must see, whether JAX can use them.

Both `configs` (is a `tpu` or `gpu` run possible here, and if not, why) and `sandbox` (which
device nodes and driver libraries a sandboxed run needs, and which limits an accelerator
runtime survives) ask this module; it imports nothing of the kit's.

* TPU: the chips are `/dev/accel*` (or `/dev/vfio/*` on newer VMs); JAX needs `libtpu`
  (`make setup EXTRAS=tpu`).
* NVIDIA GPU: the driver's nodes are `/dev/nvidia0`, `/dev/nvidia1`, ..., `/dev/nvidiactl`,
  `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset` and `/dev/nvidia-caps/*`;
  JAX needs its CUDA plugin (`make setup EXTRAS=cuda`) and the driver's `libcuda.so.1`, which
  lives in a system library folder or, on some hosts (GKE, the NVIDIA GPU operator), in a
  folder of its own named by `LD_LIBRARY_PATH`.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re

# Where the NVIDIA driver's user-space libraries live when they are not in a system folder.
_DRIVER_FOLDERS = (
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "/run/nvidia/driver/usr/lib64",
    "/usr/lib64/nvidia",
    "/usr/lib/nvidia",
)
# JAX's CUDA plugin, as each CUDA major version names its package.
_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
# Platforms whose runtime reserves far more address space than any sensible RLIMIT_AS (see `address_space_limit`).
ACCELERATOR_PLATFORMS = ("tpu", "cuda", "gpu", "rocm")
# Where device nodes are (a test points it at a folder of its own).
DEV = "/dev"


def _nodes(*patterns: str) -> list[str]:
    return [p for pattern in patterns for p in glob.glob(os.path.join(DEV, pattern)) if not os.path.isdir(p)]


def tpu_devices() -> list[str]:
    return sorted(_nodes("accel*", "vfio/*"))


def nvidia_devices() -> list[str]:
    """The NVIDIA driver's device nodes: every GPU, the control and unified-memory nodes, the capability nodes."""
    return sorted(_nodes("nvidia*", "nvidia-caps/*"))


def nvidia_gpus() -> list[str]:
    """One node per GPU: /dev/nvidia0, /dev/nvidia1, ..."""
    gpus = [p for p in _nodes("nvidia*") if re.fullmatch(r"nvidia[0-9]+", os.path.basename(p))]
    return sorted(gpus, key=lambda p: int(os.path.basename(p)[len("nvidia") :]))


def devices() -> list[str]:
    """Every accelerator device node of this host (none on a CPU machine): a sandboxed run must see them."""
    return tpu_devices() + nvidia_devices()


def driver_library_folders(env: dict[str, str] | None = None) -> list[str]:
    """Folders holding the NVIDIA driver's libcuda.so.1 outside the system folders: `LD_LIBRARY_PATH`'s, the usual ones.

    Only where this host has an NVIDIA GPU; a run must see these folders and find them on its library path.
    """
    if not nvidia_gpus():
        return []
    env = os.environ if env is None else env
    candidates = [p for p in (env.get("LD_LIBRARY_PATH") or "").split(":") if p] + list(_DRIVER_FOLDERS)
    found = [os.path.realpath(p) for p in candidates if glob.glob(os.path.join(p, "libcuda.so*"))]
    return list(dict.fromkeys(found))


def tpu_available() -> tuple[bool, str]:
    has_chips = bool(tpu_devices())
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    if has_chips and has_libtpu:
        return True, ""
    if not has_chips:
        return False, "no TPU on this machine (no /dev/accel* or /dev/vfio devices)"
    return False, "TPU devices found but libtpu is not installed: run `make setup EXTRAS=tpu`"


def cuda_plugin() -> str | None:
    """The name of the installed JAX CUDA plugin, or None."""
    for name in _CUDA_PLUGINS:
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def gpu_available() -> tuple[bool, str]:
    if not nvidia_gpus():
        return False, "no NVIDIA GPU on this machine (no /dev/nvidia0, /dev/nvidia1, ... device)"
    if cuda_plugin() is None:
        return (
            False,
            "an NVIDIA GPU is here but JAX's CUDA plugin is not installed: run `make setup EXTRAS=cuda`",
        )
    return True, ""


def is_accelerator_run(env: dict[str, str]) -> bool:
    """Whether a run with this environment starts an accelerator runtime (its configuration names the platform)."""
    platforms = [p.strip() for p in (env.get("JAX_PLATFORMS") or "").split(",") if p.strip()]
    return any(p in ACCELERATOR_PLATFORMS for p in platforms)


def address_space_limit(env: dict[str, str], memory: int) -> int | None:
    """The RLIMIT_AS of a run's processes: `memory` for a CPU run, none (None) for an accelerator run.

    JAX's CUDA plugin (and the TPU runtime) reserve far more virtual address space than they use;
    under a 4 GiB address-space limit the CUDA backend fails to load and JAX reports only that
    'cuda' is not a known backend. An address-space limit cannot bound such a run's memory: there,
    the run's memory cgroup (where one can be made) is the only memory limit.
    """
    return None if is_accelerator_run(env) else memory


def libtpu_available() -> tuple[bool, str]:
    """(True, "") where libtpu is installed, else (False, the one command that adds it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return True, ""
    return False, "libtpu (the TPU compiler) is not installed: add it with `make setup EXTRAS=tpu`"
