"""Compile-only TPU configurations (labkit/judge/tpucompile.py): values from CPU devices, compiled facts
from libtpu's TPU compiler for a topology that is not attached. The probe runs in one process of eight CPU
devices (tpu_probe.py), so libtpu starts once for all of them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from labkit.course import configs
from labkit.judge import tpucompile

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")


def test_the_compile_only_tpu_configurations_are_data_that_name_their_topology_and_their_values():
    rows = {c.name: (c.compile_for, c.devices, c.summary) for c in configs.CONFIGS.values() if c.compile_for}
    assert rows == {
        "v5e-8": ("v5e:2x4", 8, "compiled for TPU v5e 2x4, values from cpu-8"),
        "v6e-8": ("v6e:2x4", 8, "compiled for TPU v6e 2x4, values from cpu-8"),
        "v5p-8": ("v5p:2x2x2", 8, "compiled for TPU v5p 2x2x2, values from cpu-8"),
        "v5e-256": ("v5e:16x16", 256, "compiled for TPU v5e 16x16, values from cpu-256"),
    }
    v5e = configs.by_name("v5e-8")
    env = v5e.environment({"LABKIT_TPU_TOPOLOGY": "v6e:2x4", "HOME": "/h"})
    assert env["LABKIT_TPU_TOPOLOGY"] == "v5e:2x4" and env["JAX_PLATFORMS"] == "cpu"
    assert "LABKIT_TPU_TOPOLOGY" not in configs.by_name("cpu-8").environment(
        {"LABKIT_TPU_TOPOLOGY": "v5e:2x4"}
    )
    assert v5e.on_request and v5e not in configs.graded_by_default()


def test_without_libtpu_each_tpu_configuration_is_skipped_with_the_command_that_adds_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a)
    )
    for name in ("v5e-8", "v6e-8", "v5p-8", "v5e-256"):
        ok, why = configs.by_name(name).availability()
        assert not ok and "make setup EXTRAS=tpu" in why, (name, why)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tpu-cache")
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "8",
        "LABKIT_TPU_TOPOLOGY": "v5e:2x4",
        "LABKIT_TPU_CACHE": str(cache),
    }
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("tpu_probe.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_libtpu
def test_a_bf16_collective_is_judged_by_the_tpu_program_which_sends_bf16_not_float32(probe):
    # XLA:CPU runs a bfloat16 all-reduce in float32: twice the bytes of the TPU program, whose budget it breaks.
    rows, cols, n = 64, 256, 8
    budget = 2 * (n - 1) / n * rows * cols * 2  # a ring all-reduce of rows x cols bfloat16
    assert probe["tpu"]["compiled_for"] == "TPU v5e 2x4" and probe["tpu"]["value"]
    assert probe["tpu"]["shapes"][0].startswith("bf16[64,256]")
    assert probe["tpu"]["sent"] == budget
    assert probe["cpu"]["sent"] == 2 * budget and probe["cpu"]["compiled_for"] is None


@needs_libtpu
def test_the_cost_card_shows_the_tpu_compilers_own_estimate_beside_the_hand_model(probe):
    shown = "\n".join(probe["card"])
    assert "TPU v5e 2x4, the compiler's own estimate: step " in shown and "of HBM traffic per device" in shown
    assert "the compiler's own estimate" not in "\n".join(probe["cpu"]["card"])  # XLA:CPU gives none


@needs_libtpu
def test_a_second_identical_program_is_not_compiled_again(probe):
    # three programs compiled (the bf16 sum, the one over HBM, none for the CPU-only one); the second student's
    # bf16 sum was read from the cache, which keeps what compiled and what the compiler refused
    assert probe["again"] and probe["cache"]["hits"] == 1 and probe["cache"]["compiles"] == 3
    assert len(probe["cache"]["files"]) == 2


@needs_libtpu
def test_a_program_over_the_tpus_memory_is_refused_with_the_compilers_figures(probe):
    why = probe["refused"]["unavailable"]
    assert "TPU compiler (TPU v5e 2x4) refused" in why and "CompileTimeHbmOom" in why and "15.75G" in why


@needs_libtpu
def test_a_program_exported_for_cpu_alone_says_it_was_not_exported_for_the_tpu(probe):
    assert "exported for cpu only" in probe["not_for_tpu"]["unavailable"]


@needs_libtpu
def test_a_call_at_a_production_size_is_compiled_for_the_topology_and_never_run(probe):
    # 16 GiB of output split over a 2 x 4 grid: each chip holds its eighth; the program's own grid is the first
    # mesh tried (the kit's one axis of eight cannot name its outputs' shardings: a second compile)
    split = probe["production"]["split"]
    assert split["value"] == {"kind": "none"} and split["facts"]["compiled_for"] == "TPU v5e 2x4"
    assert split["facts"]["memory"]["output"] == (1 << 16) ** 2 * 4 // 8
    assert split["compiles"] == 1


@needs_libtpu
def test_a_design_that_does_not_fit_a_chip_at_a_production_size_is_refused_with_the_compilers_figures(probe):
    why = probe["production"]["whole"]["facts"]["unavailable"]
    assert "CompileTimeHbmOom" in why and "15.75G" in why, why
    assert "value" in probe["production"]["whole"]  # the test reads the refusal: no value was ever computed


@needs_libtpu
def test_a_call_at_a_production_size_is_not_judged_without_a_tpu_topology(probe):
    assert "compile-only TPU configuration" in probe["production"]["on_cpu"]["unverified"]


@needs_libtpu
def test_a_program_that_reads_its_platform_is_valued_and_examined_on_its_tpu_branch_alone(probe):
    found = probe["platforms"]
    honest = found["honest"]
    assert honest["value"] == 64 * 256 * 8 and [c["op"] for c in honest["facts"]["collectives"]] == [
        "all-reduce"
    ]
    assert found["zeros_on_the_tpu"]["value"] == 0  # the value graded is the TPU branch's, not the CPU's
    assert found["wasteful_on_cpu"]["value"] == honest["value"]
    assert found["wasteful_on_cpu"]["facts"]["collectives"] == honest["facts"]["collectives"]


@needs_libtpu
def test_a_program_exported_for_two_platforms_is_refused_on_a_compile_only_configuration(probe):
    why = probe["platforms"]["both"]["unverified"]
    assert "exported for cpu, tpu" in why and "one and the same program" in why


@needs_libtpu
def test_a_function_that_branches_on_its_inputs_size_is_refused_at_the_production_size(probe):
    assert probe["sizes"]["honest"]["refused"] == []
    (why,) = probe["sizes"]["branches"]["refused"]
    assert "branches on its input's size" in why and "course size" in why


def test_a_production_size_call_is_made_only_on_configurations_that_compile_for_a_tpu():
    from labkit import checks
    from labkit.judge import callplan

    at_size = checks.compiled_call("train_step", {"w": checks.shaped((8192, 32768), "bfloat16")})
    small = checks.compiled_call("train_step", {"w": np.ones((4, 4), np.float32)})
    calls = [{"id": c.id, **c.encoded()} for c in (at_size, small)]
    assert at_size.compile_only and not small.compile_only
    assert at_size.args[0]["w"].nbytes == 8192 * 32768 * 2
    assert callplan.for_configuration(calls, compiles_for_tpu=False) == calls[1:]
    assert callplan.for_configuration(calls, compiles_for_tpu=True) == calls
    assert callplan.for_the_student(callplan.mark(calls))[0]["args"] == calls[0]["args"]  # shapes, as given
    with pytest.raises(TypeError, match="compiled_call"):
        checks.call("train_step", checks.shaped((2, 2)))


def test_a_production_size_test_is_skipped_on_a_cpu_configuration_saying_where_it_runs():
    from labkit import checks

    @checks.check(got=checks.compiled_call("f", checks.shaped((1 << 20,))))
    def test_fits(got):
        raise AssertionError("never reached on cpu-8")

    run = checks.LabRun("cpu-8", configs.by_name("cpu-8"), record=None)
    with pytest.raises(pytest.skip.Exception, match="compile-only TPU configurations .*not on cpu-8"):
        test_fits(run)


def test_the_cache_key_is_the_program_the_topology_and_the_placement():
    key = tpucompile.FactsCache.key
    assert key(b"p", "v5e:2x4", None) == key(b"p", "v5e:2x4", None)
    assert (
        len(
            {
                key(b"p", "v5e:2x4", None),
                key(b"q", "v5e:2x4", None),
                key(b"p", "v6e:2x4", None),
                key(b"p", "v5e:2x4", [2, 4]),
            }
        )
        == 4
    )


def test_doctor_names_libtpu_its_size_and_licence_or_how_to_add_it(monkeypatch):
    from importlib import metadata

    from labkit.machine import doctor

    found = doctor.check_libtpu()
    if HAS_LIBTPU:
        assert found.status == doctor.OK and " MB, licence: " in found.detail and "v5e-256" in found.detail

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    absent = doctor.check_libtpu()
    assert absent.status == doctor.WARN and "make setup EXTRAS=tpu" in absent.fix
    assert "Google Cloud Platform Terms of Service" in absent.fix and "v5e-8" in absent.detail


@needs_libtpu
def test_a_run_forked_warm_with_its_own_environment_still_reaches_the_tpu_compiler_at_once():
    # `import jax` tells libtpu there is no TPU VM to ask about (TPU_SKIP_MDS_QUERY) through os.environ; a
    # warm kernel imported JAX in the warm server and then took its run's environment, without it. Unless the
    # kit says so itself, libtpu asks the cloud's metadata server, and with none to answer, retries for minutes.
    script = """
import os
import jax
os.environ.pop("TPU_SKIP_MDS_QUERY", None)
from labkit.judge import tpucompile
print(len(tpucompile._devices("v5e:2x4")))
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("libtpu was still asking for a metadata server after 90 s")
    assert done.returncode == 0 and done.stdout.split()[-1] == "8", done.stderr[-2000:]
