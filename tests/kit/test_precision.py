"""Checks that hold on every backend: tolerances follow the precision of the run's matrix products.

On CPU a float32 product is exact float32; a TPU rounds its operands to bfloat16 by default and an
NVIDIA GPU to TF32. The kit's accelerator configurations ask for full float32, and a check's
tolerance widens to the precision a run reports (`labkit.judge.precision`). The proof that every
reference and every test holds when products are done in bfloat16 runs here, on CPU: each lab's
reference with a first cell (precision/bfloat16_products.py) that makes every XLA dot round its
float32 operands to bfloat16, as a TPU does by default.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest
import sweep

from labkit.checks import LabRun, Mismatch, call, check, expect_close
from labkit.course import catalog, configs
from labkit.judge import plaindata, precision

ROOT = Path(__file__).resolve().parents[2]
FIRST_CELL = Path(__file__).parent / "precision" / "bfloat16_products.py"


def test_cpu_products_are_float32_whatever_is_asked():
    assert precision.effective("cpu", None) == precision.FLOAT32
    assert precision.effective("cpu", "high") == precision.FLOAT32
    assert precision.effective("cpu", "bfloat16") == precision.FLOAT32  # XLA:CPU multiplies float32 exactly


def test_each_accelerator_has_its_own_default_and_highest_is_float32_everywhere():
    assert precision.effective("tpu", None) == precision.BFLOAT16
    assert precision.effective("gpu", "default") == precision.TENSORFLOAT32
    assert precision.effective("tpu", "highest") == precision.effective("gpu", "float32") == precision.FLOAT32
    assert precision.effective("gpu", "high") == precision.TENSORFLOAT32


def test_the_accelerator_configurations_ask_for_a_precision_that_is_float32():
    for name in ("tpu", "gpu"):
        env = configs.CONFIGS[name].environment({})
        backend = configs.CONFIGS[name].platform
        assert precision.effective(backend, env["JAX_DEFAULT_MATMUL_PRECISION"]) == precision.FLOAT32


def test_float32_keeps_a_checks_own_tolerances():
    assert precision.tolerances(1e-5, 1e-6, np.ones(3) * 100, precision.FLOAT32) == (1e-5, 1e-6)


def test_bfloat16_widens_tolerances_with_the_unit_roundoff_and_the_size_of_the_values():
    rtol, atol = precision.tolerances(1e-5, 1e-6, np.array([-4.0, 2.0]), precision.BFLOAT16)
    assert rtol == precision.SLACK * 2**-8 and atol == precision.SLACK * 2**-8 * 4.0


def _judged(environment: dict, got: np.ndarray, want: np.ndarray, **result) -> str:
    """Run one check on a made-up run that returned `got` and reported `environment`: 'passed' or the message."""
    c = call("f", 1)
    record = SimpleNamespace(
        status="ok",
        environment=environment,
        message="",
        results={c.id: {"value": plaindata.encode(got), **result}},
    )

    @check(got=c)
    def test(got):
        expect_close(got, want, rtol=1e-5, atol=1e-6)

    try:
        test(LabRun("cpu-8", configs.CONFIGS["cpu-8"], record))
    except Mismatch as e:
        return str(e)
    return "passed"


WANT = np.linspace(-1.0, 1.0, 8)
OFF_BY_BFLOAT16 = (WANT * (1 + 2**-8)).astype(np.float32)  # one bfloat16 rounding away


def test_a_float32_run_off_by_a_bfloat16_rounding_fails():
    assert "values differ" in _judged({"backend": "cpu", "matmul_precision": None}, OFF_BY_BFLOAT16, WANT)


def test_a_run_whose_products_were_bfloat16_passes_with_the_tolerance_that_implies():
    assert _judged({"backend": "tpu", "matmul_precision": None}, OFF_BY_BFLOAT16, WANT) == "passed"


def test_a_notebooks_own_bfloat16_setting_widens_nothing_for_a_five_percent_wrong_answer(monkeypatch):
    monkeypatch.delenv(precision.EMULATED, raising=False)
    from labkit.judge import verify

    # what the notebook chose (jax_default_matmul_precision="bfloat16", `return 1.9 * x`) is not the configuration's
    environment = verify.kit_environment(
        {"backend": "cpu", "matmul_precision": "bfloat16"}, configs.CONFIGS["cpu-8"].environment({})
    )
    assert environment["matmul_precision"] is None
    assert "values differ" in _judged(environment, WANT * 0.95, WANT)
    assert "values differ" in _judged({"backend": "cpu", "matmul_precision": "bfloat16"}, WANT * 0.95, WANT)


def test_a_check_whose_values_pass_through_no_product_keeps_its_tolerances_on_any_backend():
    assert "values differ" in _judged(
        {"backend": "tpu", "matmul_precision": None}, OFF_BY_BFLOAT16, WANT, products=False
    )


def test_a_bfloat16_run_ten_percent_off_still_fails():
    assert "values differ" in _judged({"backend": "tpu", "matmul_precision": None}, WANT * 1.1, WANT)


# ----------------------------------------------------------------------------------------
# The proof: every reference, every test, products in bfloat16.
# ----------------------------------------------------------------------------------------


def test_the_first_cell_rounds_every_kind_of_product_to_bfloat16_operands(tmp_path):
    probe = f"""
exec(open({str(FIRST_CELL)!r}).read())
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
rng = np.random.default_rng(0)
a = rng.normal(size=(8, 16)).astype(np.float32); b = rng.normal(size=(16, 4)).astype(np.float32)
r = lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
want = r(a) @ r(b)
layer = nnx.Linear(16, 4, rngs=nnx.Rngs(0))
got = {{"dot": jnp.dot(a, b), "matmul": jnp.asarray(a) @ b, "einsum": jnp.einsum("ij,jk->ik", a, b),
       "jit": jax.jit(jnp.dot)(a, b), "lax": jax.lax.dot_general(a, b, (((1,), (0,)), ((), ()))),
       "nnx": layer(a) - layer.bias[...]}}
kernel = np.asarray(layer.kernel[...], np.float64)
for name, value in got.items():
    expect = r(a) @ r(kernel) if name == "nnx" else want
    exact = a.astype(np.float64) @ (kernel if name == "nnx" else b)
    value = np.asarray(value, np.float64)
    print(name, bool(np.abs(value - expect).max() < 1e-5), bool(np.abs(value - exact).max() > 1e-3))
grad = np.asarray(jax.grad(lambda x: jnp.sum(jnp.dot(x, b)))(a), np.float64)
print("grad", bool(np.abs(grad - r(b).sum(1)).max() < 1e-5), bool(np.abs(grad - b.sum(1)).max() > 1e-4))
print("setting", jax.config.jax_default_matmul_precision)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    for name in ("dot", "matmul", "einsum", "jit", "lax", "nnx", "grad"):
        assert lines.get(name) == "True True", (name, done.stdout, done.stderr[-2000:])
    assert lines["setting"] == "bfloat16"


def _with_first_cell(lab: int, folder: Path) -> Path:
    nb = nbformat.read(ROOT / "reference" / f"lab-{lab}.ipynb", as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(FIRST_CELL.read_text()))
    path = folder / f"lab-{lab}-bfloat16.ipynb"
    nbformat.write(nb, path)
    return path


# Tests whose subject is the FLOP count of the compiled program itself: the first cell rounds each
# product's operands with two conversions per element, which a TPU does not have and which
# cost_analysis() counts as FLOPs, so under it such a count is the emulation's, not the hardware's.
COUNTS_THE_EMULATION = {
    13: {
        "test_predict_flops_is_within_2_percent_of_the_compiled_program",
        "test_predict_flops_on_another_mlp_is_within_2_percent_of_the_compiled_program",
    }
}


@pytest.mark.parametrize("lab", sweep.share([lab.number for lab in catalog.labs()], 1))
def test_every_reference_passes_every_test_with_products_in_bfloat16(
    lab, kit, lab_report, tmp_path, monkeypatch
):
    notebook = _with_first_cell(lab, tmp_path)
    monkeypatch.setenv(
        precision.EMULATED, precision.BFLOAT16
    )  # the kit grades as if on a TPU: its first cell rounds
    done = kit("lab", str(lab), "--notebook", str(notebook), "--configs", "cpu-8", "--hidden")
    report = lab_report(lab)
    left_out = COUNTS_THE_EMULATION.get(lab, set())
    assert left_out <= {o["test"] for o in report["outcomes"]}, "a test left out here is no longer in the lab"
    failed = {
        o["test"]: o.get("message")
        for o in report["outcomes"]
        if o["status"] not in ("passed", "skipped") and o["test"] not in left_out
    }
    assert (done.returncode == 0 or left_out) and not failed, (failed, done.stdout[-3000:])
    # the notebook's own setting is not what the kit grades by: the configuration's is (none, on cpu-8)
    assert report["runs"]["cpu-8"]["environment"]["matmul_precision"] is None
