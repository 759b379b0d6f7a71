"""The precision of a run's float32 matrix products, and the tolerances it implies for the checks.

A float32 `jnp.dot` is exact float32 on CPU, but by default a TPU rounds its operands to
bfloat16 (8 significant bits) and a recent NVIDIA GPU to TF32 (11 bits), accumulating in
float32. The kit's accelerator configurations ask for full float32 (`configs.ACCELERATOR_MATMUL_PRECISION`);
a notebook may ask for less with `jax.default_matmul_precision`, but what a notebook chose is never
what the kit grades by: a setting is no licence to be 5% off. The precision of a run is its
configuration's (backend, and the JAX_DEFAULT_MATMUL_PRECISION it sets, as the kit's own verifier
reports them: `verify.kit_environment`); `effective` turns both into what the hardware really does
(on CPU, float32 whatever is asked), and `tolerances` widens the float32 tolerances of a check whose
values pass through matrix products (`checks.check`: the verifier reads the program) to what that
precision allows:

    rtol' = max(rtol, SLACK * u),   atol' = max(atol, SLACK * u * max|want|)

where u is the unit roundoff of the operands (2**-8 for bfloat16, 2**-11 for TF32, 0 for
float32: the check's own tolerances stand). Each product a*b of rounded operands is off by at
most 2u relative; a row of products summed, a few layers deep, stays within a few times that,
measured against the largest value (sums with cancellation are small next to their terms, so
the absolute term carries them). With SLACK = 8 every reference passes every test when all its
products are done in bfloat16 (tests/kit/test_precision.py); smaller values were not tried.
"""

from __future__ import annotations

import os

import numpy as np

from labkit import envnames

FLOAT32, TENSORFLOAT32, BFLOAT16 = "float32", "tensorfloat32", "bfloat16"
# Unit roundoff of a product's operands.
ROUNDOFF = {FLOAT32: 0.0, TENSORFLOAT32: 2.0**-11, BFLOAT16: 2.0**-8}
SLACK = 8.0
# Set in the kit's own (trusted) process only: grade every run as if its products were this precision. The kit's
# test of its tolerances (tests/kit/test_precision.py) rounds products to bfloat16 on CPU, as a TPU does, and sets it;
# nothing in a notebook can.
EMULATED = envnames.EMULATED_PRODUCTS
# What each backend does with float32 products when nothing is asked for.
_BACKEND_DEFAULT = {
    "cpu": FLOAT32,
    "gpu": TENSORFLOAT32,
    "cuda": TENSORFLOAT32,
    "rocm": TENSORFLOAT32,
    "tpu": BFLOAT16,
}


def effective(backend: str | None, setting: str | None) -> str:
    """What float32 matrix products really are on `backend` under `jax_default_matmul_precision` = `setting`."""
    if backend == "cpu":  # XLA:CPU multiplies float32 exactly, whatever precision is asked for
        return FLOAT32
    s = (setting or "default").strip().lower()
    if s in ("highest", "float32", "precision.highest"):
        return FLOAT32
    if s in ("high", "bfloat16_3x", "tensorfloat32", "precision.high"):
        # TPU: three bfloat16 passes, near float32; GPU: TF32. Either way no worse than TF32.
        return TENSORFLOAT32
    if s == "bfloat16":
        return BFLOAT16
    # "default", "fastest", unset, or anything unknown: the backend's own choice (an unknown backend: the worst)
    return _BACKEND_DEFAULT.get(backend or "", BFLOAT16)


def of_run(environment: dict) -> str:
    """The effective precision of a run, from its environment as the kit grades it (`verify.kit_environment`)."""
    emulated = os.environ.get(EMULATED)
    if emulated in ROUNDOFF:
        return emulated
    return effective(environment.get("backend"), environment.get("matmul_precision"))


def tolerances(rtol: float, atol: float, want, precision: str) -> tuple[float, float]:
    """A check's float32 (rtol, atol), widened to what `precision` allows for values of the size of `want`."""
    u = ROUNDOFF.get(precision, ROUNDOFF[BFLOAT16])
    if u == 0.0:
        return rtol, atol
    want = np.asarray(want)
    scale = float(np.max(np.abs(want))) if want.size and want.dtype.kind in "biufc" else 0.0
    scale = scale if np.isfinite(scale) else 0.0
    return max(rtol, SLACK * u), max(atol, SLACK * u * scale)
