"""The names of the environment variables the kit reads and sets, in one place.

Every module spells a LABKIT_* name through this one (`envnames.WARM`), never as a literal
(tests/kit/test_envnames.py checks), so that a rename or a typo cannot split one setting in two.
This module imports nothing: the harness in the student's process and the kit's first step read it
before anything else is loaded.
"""

# Where things are: the kit's checkout, the build folder (the student loop's reports).
ROOT = "LABKIT_ROOT"
BUILD = "LABKIT_BUILD"

# How a notebook runs: the sandbox (auto, a bwrap path, off), the bwrap binary, cgroups (auto, off),
# warm kernels (on, off), JAX's compilation cache (on, off), and where the student loop keeps that
# cache (a folder; unset, the build folder's .jax-cache).
SANDBOX = "LABKIT_SANDBOX"
BWRAP = "LABKIT_BWRAP"
CGROUPS = "LABKIT_CGROUPS"
WARM = "LABKIT_WARM"
COMPILE_CACHE = "LABKIT_COMPILE_CACHE"
COMPILE_CACHE_DIR = "LABKIT_COMPILE_CACHE_DIR"

# Set by the kit in the notebook's process: the configuration it runs on, a replay of a check, the
# token that finds the run's processes again.
RUN = "LABKIT_RUN"
CHECK_REPLAY = "LABKIT_CHECK_REPLAY"
RUN_TOKEN = "LABKIT_RUN_TOKEN"

# A configuration of several JAX processes (cpu-2x4, TPU pods): who coordinates, how many, which one.
COORDINATOR = "LABKIT_COORDINATOR"
NUM_PROCESSES = "LABKIT_NUM_PROCESSES"
PROCESS_ID = "LABKIT_PROCESS_ID"
LOCAL_DEVICE_IDS = "LABKIT_LOCAL_DEVICE_IDS"
CPU_COLLECTIVES = "LABKIT_CPU_COLLECTIVES"
JOIN_TIMEOUT = "LABKIT_JOIN_TIMEOUT"
TPU_HOSTS = "LABKIT_TPU_HOSTS"

# Compile-only TPU configurations and the judge's numerics.
TPU_TOPOLOGY = "LABKIT_TPU_TOPOLOGY"
TPU_CACHE = "LABKIT_TPU_CACHE"
EMULATED_PRODUCTS = "LABKIT_EMULATED_PRODUCTS"

# The kit's own test suite: "full" runs every sweep whole (every reference on every pod size, ...);
# unset, `make test` runs each lab on a share of it that still covers every size (docs/development.md).
TEST_SWEEP = "LABKIT_TEST_SWEEP"
