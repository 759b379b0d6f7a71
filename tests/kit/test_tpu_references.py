"""Every lab's reference passes its public and hidden tests on the compile-only TPU configuration v5e-8:
the checks read the TPU compiler's program (its loops, its async collectives, its own choice of
collective) and must accept a correct design there. One `labkit lab` run per lab; skipped where
libtpu is absent. Slow (about a minute and a half a lab): run it where libtpu is installed."""

import importlib.util

import pytest

# Lab 13's answers are XLA:CPU's: on v5e-8 the TPU compiler sums its small all_gather and psum_scatter
# with an all-reduce (twice the ring prediction) and its FLOPs differ by 2.3% (BENCHMARKS.md).
LAB_13 = pytest.param(
    13,
    marks=pytest.mark.xfail(
        strict=True,
        reason="lab 13's answers are read off XLA:CPU's "
        "programs; the TPU compiler's small-message choice differs",
    ),
)
LABS = [*range(1, 13), LAB_13, 14]
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None

pytestmark = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")


@pytest.mark.parametrize("lab", LABS)
def test_the_reference_passes_every_test_on_v5e_8(kit, lab_outcomes, lab):
    done = kit(
        "lab",
        str(lab),
        "--notebook",
        f"reference/lab-{lab}.ipynb",
        "--configs",
        "v5e-8",
        "--hidden",
        "--timeout",
        "600",
        timeout=1200,
    )  # a shared machine: the TPU compiles add to the notebook run
    outcomes = lab_outcomes(lab)["v5e-8"]
    failed = {
        name: o["message"][:300]
        for name, o in outcomes.items()
        if o["status"] not in ("passed", "skipped", "skip")
    }
    assert not failed, failed
    assert any(o["hidden"] for o in outcomes.values()), "no hidden test ran"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
