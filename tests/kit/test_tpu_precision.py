"""One matmul precision for every TPU judge: the compile-only TPU configurations export at precision highest, as
the `tpu` configuration runs (configs.ACCELERATOR_MATMUL_PRECISION), so the program libtpu compiles for their
topology moves float32 operands as float32; a program exported at less is refused, never judged cheaper. The probe
(tpu_precision_probe.py) runs in one process with v5e-8's own environment; skipped where libtpu is absent."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.course import configs

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
pytestmark = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")


@pytest.fixture(scope="module")
def probe():
    env = configs.by_name("v5e-8").environment(dict(os.environ))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("tpu_precision_probe.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_float32_product_exported_on_v5e_8_is_at_precision_highest_and_its_operands_move_as_float32(probe):
    configured = probe["configured"]
    assert configured["precision"] == ["[HIGHEST, HIGHEST]"]
    # w gathered whole: 7/8 of 512 x 1024 float32 sent by each device
    assert configured["gathered"] == ["f32[512,1024]"] and configured["sent"] == 7 / 8 * 512 * 1024 * 4
    assert "facts" in probe["judged"] and "unverified" not in probe["judged"], probe["judged"]


def test_the_same_design_at_jaxs_default_precision_would_move_half_the_bytes_and_is_refused(probe):
    lowered, configured = probe["lowered"], probe["configured"]
    # what the compile-only configurations judged before: libtpu gathers the bfloat16 operand it multiplies
    assert lowered["precision"] == [] and lowered["gathered"] == ["bf16[512,1024]"]
    assert (
        lowered["sent"] == configured["sent"] / 2 and lowered["compiler_bytes"] < configured["compiler_bytes"]
    )
    assert "ask for a precision below highest" in probe["refused"], probe["refused"]
