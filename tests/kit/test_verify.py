"""The kit's own run of an exported program (labkit/judge/verify.py): what it runs, what it refuses, and why.

These call the verifier's pieces in this process, on one CPU device; the battery in test_sandbox.py
runs them through the whole pipeline against a stolen key and a function that knows it is traced.
"""

from __future__ import annotations

import base64
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit import checks, facts
from labkit.judge import callplan, plaindata, verify

X = np.linspace(-4.0, 4.0, 32, dtype=np.float32)


def encoded(function: str, *args, examined: bool = False) -> dict:
    c = checks.compiled_call(function, *args) if examined else checks.call(function, *args)
    return {"id": c.id, **c.encoded()}


def program_of(fn, *args, **export_options) -> str:
    exported = jax.export.export(jax.jit(fn), **export_options)(*args)
    return base64.b64encode(bytes(exported.serialize())).decode()


def test_every_call_of_a_function_some_test_examines_is_marked_and_no_other():
    calls = callplan.mark(
        [encoded("double", X, examined=True), encoded("double", X[:8]), encoded("owners", X)]
    )
    assert [bool(c.get("verify")) for c in calls] == [True, True, False]


def test_the_value_comes_from_running_the_program_on_the_calls_own_inputs():
    found = verify.run_program(encoded("double", X), program_of(lambda x: x * 2.0, X))
    assert np.allclose(plaindata.decode(found["value"]).value, 2 * X)


def test_the_compiled_facts_are_read_from_the_same_program():
    found = verify.run_program(encoded("double", X, examined=True), program_of(lambda x: x * 2.0, X))
    assert found["facts"]["flops"] == pytest.approx(len(X))
    assert found["facts"]["outputs"][0]["shape"] == [len(X)]


def test_a_program_made_for_other_inputs_is_refused():
    found = verify.run_program(encoded("double", X), program_of(lambda x: x * 2.0, X[:4]))
    assert "takes other inputs than the call gives" in found["unverified"]


def test_bytes_that_are_not_a_program_are_refused():
    found = verify.run_program(encoded("double", X), base64.b64encode(b"not a program").decode())
    assert "could not be read" in found["unverified"]


SPD = np.eye(4, dtype=np.float32) * 2.0


def test_jaxlibs_own_linear_algebra_is_run():
    blob = program_of(jnp.linalg.cholesky, SPD)
    assert any(
        c.startswith("lapack_")
        for c in verify.custom_calls(jax.export.deserialize(bytearray(base64.b64decode(blob))).mlir_module())
    )
    found = verify.run_program(encoded("cholesky", SPD), blob)
    assert np.allclose(plaindata.decode(found["value"]).value, np.linalg.cholesky(SPD)), found


def test_a_program_that_calls_code_outside_the_allow_list_is_refused(monkeypatch):
    monkeypatch.setattr(verify, "ALLOWED_PATTERN", re.compile("(?!)"))  # LAPACK no longer allowed
    found = verify.run_program(encoded("cholesky", SPD), program_of(jnp.linalg.cholesky, SPD))
    assert "calls code the kit does not run ('lapack_" in found["unverified"], found


A = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(8, 8)


@pytest.mark.parametrize(
    "precision",
    [None, jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH, jax.lax.DotAlgorithmPreset.BF16_BF16_F32],
)
def test_a_tpu_judge_refuses_float32_products_asked_for_below_its_precision_highest(monkeypatch, precision):
    # A TPU judge compiles every float32 product at precision highest (configs.ACCELERATOR_MATMUL_PRECISION): a
    # program exported at less (one bfloat16 pass: half the bytes an all-gather of its operands moves) would be
    # judged cheaper than the same design.
    program = program_of(lambda a, b: jnp.dot(a, b, precision=precision), A, A)
    call = encoded("matmul", A, A)
    assert "unverified" not in verify.run_program(call, program)  # a CPU configuration sets no precision
    monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    found = verify.run_program(call, program)
    assert "1 of its float32 matrix products ask for a precision below highest" in found.get(
        "unverified", ""
    ), found


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST),
        lambda a, b: jnp.dot(a, b, precision=jax.lax.DotAlgorithmPreset.F32_F32_F32),
        lambda a, b: jnp.dot(a, b, precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6),
        lambda a, b: jnp.dot(
            a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
        ),  # bfloat16 operands: as they are
    ],
)
def test_a_tpu_judge_runs_float32_products_at_highest_and_products_of_bfloat16_operands(monkeypatch, fn):
    monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    found = verify.run_program(encoded("matmul", A, A), program_of(fn, A, A))
    assert "unverified" not in found, found


def test_a_function_that_prints_from_inside_its_program_is_told_to_take_the_print_out():
    def printing(x):
        jax.debug.print("{}", x[0])
        return x * 2.0

    sent = facts.export(printing, (jnp.asarray(X),), {})
    assert "program" not in sent and "jax.debug.print" in sent["unavailable"], sent


def _calling(*targets):
    """A function whose program makes custom calls to `targets` (code of its own, as jax.ffi.ffi_call writes it)."""

    def fn(x):
        for target in targets:
            x = x + jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        return x

    return fn


def test_custom_call_targets_are_read_exactly_from_the_parsed_module():
    text = jax.jit(_calling('Sharding"x', "AllocateBuffer", "lapack_spotrf_ffi")).lower(X).as_text()
    assert '@"Sharding\\22x"' in text  # the printed name begins with an allowed one ...
    assert verify.custom_calls(text) == {
        'Sharding"x',
        "AllocateBuffer",
        "lapack_spotrf_ffi",
    }  # ... the name does not


def test_a_custom_call_whose_name_begins_with_an_allowed_one_is_refused():
    target = 'Sharding"x'
    blob = program_of(
        _calling(target), X, disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(target)]
    )
    found = verify.run_program(encoded("double", X), blob)
    assert "calls code the kit does not run ('Sharding\"x')" in found.get("unverified", ""), found


def test_a_call_that_returns_more_than_the_kit_reads_is_refused_before_it_is_encoded(monkeypatch):
    big, encoded_values = encoded("double", np.zeros(300_000, np.float32)), []
    six = program_of(lambda x: tuple(x + i for i in range(6)), jax.ShapeDtypeStruct((300_000,), np.float32))
    with monkeypatch.context() as patched:
        patched.setattr(plaindata, "encode", lambda v, depth=0: encoded_values.append(v) or {"kind": "none"})
        found = verify.run_program(big, six)
    assert "the kit reads at most" in found.get("unverified", "") and not encoded_values, found
    many = program_of(lambda x: tuple(x + i for i in range(verify.program.MAX_OUTPUT_ARRAYS + 1)), X)
    assert "arrays" in verify.run_program(encoded("double", X), many).get("unverified", "")
    budget = [len(X) * 3]
    for expected in (True, True, True, False):  # the run's calls share one allowance
        assert (
            "value" in verify.run_program(encoded("double", X), program_of(lambda x: x * 2.0, X), budget)
        ) is expected


# ----------------------------------------------------------------------------------------
# The kit alone decides how a call is judged: a run's record forged to ask for less, through verify.verify.
# ----------------------------------------------------------------------------------------


def _planted(n: int = len(X)) -> dict:
    return plaindata.encode(np.full(n, 7.0, np.float32))


def test_nothing_the_kernel_wrote_decides_how_a_call_is_judged(tmp_path):
    from labkit.course import configs
    from labkit.run import execute
    from labkit.run.allowance import Limits

    honest, unrunnable, host_data, nothing, no_product, stray = (
        encoded(name, X, examined=True) for name in ("a", "b", "c", "d", "e", "f")
    )
    calls = callplan.mark([honest, unrunnable, host_data, nothing, no_product])
    allocating = program_of(_calling("AllocateBuffer"), X)
    record = execute.RunRecord(
        "cpu-8",
        "ok",
        seconds=1.0,
        environment={"device_count": 1, "backend": "tpu", "matmul_precision": "bfloat16"},
    )  # the environment swapped
    record.results = {
        honest["id"]: {
            "id": honest["id"],
            "program": {"program": program_of(lambda x: x @ (2.0 * jnp.eye(32)), X)},
            "judged_by": "reported",
        },
        unrunnable["id"]: {"id": unrunnable["id"], "value": _planted(), "program": {"program": allocating}},
        host_data["id"]: {
            "id": host_data["id"],
            "value": _planted(),
            "facts": {"flops": 1},
            "program": {"unavailable": "made", "host_data": True},
        },  # the frame-walking forgery's record
        nothing["id"]: {"id": nothing["id"], "value": _planted(), "program": {}},
        no_product["id"]: {
            "id": no_product["id"],
            "program": {"program": program_of(lambda x: x * 2.0, X)},
            "products": True,
            "finding": "planted",
        },
        stray["id"]: {"id": stray["id"], "value": _planted()},  # no call of the kit's
    }
    env = execute.environment_of(configs.CONFIGS["cpu-8"])
    verify.verify(record, calls, tmp_path, env, Limits(memory=3 << 30), timeout=240)
    results = record.results
    assert results[honest["id"]]["judged_by"] == "verified", results[honest["id"]]
    assert np.allclose(plaindata.decode(results[honest["id"]]["value"]).value, 2 * X)
    assert results[honest["id"]]["products"] is True and results[no_product["id"]]["products"] is False
    assert "finding" not in results[no_product["id"]]
    for cid, why in (
        (unrunnable["id"], "no way to run it"),
        (host_data["id"], "host data"),
        (nothing["id"], "sent no program"),
    ):
        assert results[cid]["judged_by"] == "unverified" and why in results[cid]["error"]["message"], results[
            cid
        ]
        assert "value" not in results[cid] and "facts" not in results[cid]
    assert stray["id"] not in results
    assert record.environment["device_count"] == 8, record.environment  # the verifier's own count
    assert record.environment["backend"] == "cpu" and record.environment["matmul_precision"] is None


def test_only_a_call_the_tests_give_host_data_may_keep_its_report():
    given = {"id": "1", **checks.call("f", checks.AsNumpy(X)).encoded()}
    assert callplan.takes_host_data(given) and not callplan.takes_host_data(encoded("f", X))


# ----------------------------------------------------------------------------------------
# The re-run is the student's program: lab 4's shard_map that keeps device 0's rows, on eight devices.
# ----------------------------------------------------------------------------------------

EIGHT_DEVICES = """
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from labkit import checks, facts
from labkit.judge import plaindata, verify

def sum_of_squares(r):
    return jnp.sum(r ** 2)

def first_rows_tiled(x):  # each device's sums, tiled to the full length; out_specs=P() keeps one device's
    mesh = Mesh(np.array(jax.devices()), ("data",))
    per = jax.shard_map(lambda b: jnp.tile(jax.vmap(sum_of_squares)(b), x.shape[0] // b.shape[0]), mesh=mesh,
                        in_specs=P("data"), out_specs=P(), check_vma=False)
    return jnp.stack([per(x), jax.vmap(sum_of_squares)(x)], axis=0)

def right(x):
    mesh = Mesh(np.array(jax.devices()), ("data",))
    per = jax.shard_map(lambda b: jax.vmap(sum_of_squares)(b), mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    return jnp.stack([per(x), jax.vmap(sum_of_squares)(x)], axis=0)

x = np.arange(64.0, dtype=np.float32).reshape(32, 2)
c = checks.compiled_call("shard_map_vs_vmap", x)
out = {}
for fn in (first_rows_tiled, right):
    sent = facts.export(fn, [jax.ShapeDtypeStruct(x.shape, x.dtype)], {})
    found = verify.run_program({"id": c.id, **c.encoded()}, sent["program"])
    out[fn.__name__] = {"plain": np.asarray(fn(jnp.asarray(x))).tolist(),
                        "kit": np.asarray(plaindata.decode(found["value"]).value).tolist(),
                        "finding": found.get("finding")}
print(json.dumps(out))
"""


def test_the_kits_run_of_a_shard_map_that_keeps_one_devices_rows_gives_what_plain_jax_gives(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8")
    done = subprocess.run(
        [sys.executable, "-c", EIGHT_DEVICES],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    tiled = out["first_rows_tiled"]
    assert (
        tiled["plain"][0][4:8] == tiled["plain"][0][:4] != tiled["plain"][1][4:8]
    )  # device 0's rows, repeated
    assert tiled["kit"] == tiled["plain"], tiled
    assert "differs from device to device" in (tiled["finding"] or ""), tiled
    assert out["right"]["kit"] == out["right"]["plain"] and out["right"]["finding"] is None, out["right"]


@pytest.mark.parametrize(
    ("marks", "word"),
    [
        ({"verified"}, "verified"),
        ({"reported"}, "reported"),
        ({"verified", "reported"}, "partly verified"),
        ({"unverified"}, "verified"),
        (set(), "reported"),
    ],
)
def test_a_run_is_summed_up_in_one_word(marks, word):
    assert verify.judged_by({str(i): {"judged_by": m} for i, m in enumerate(sorted(marks))}) == word


def test_without_the_kits_own_run_a_cpu_configurations_device_count_stands(tmp_path):
    from labkit.course import configs
    from labkit.run import execute
    from labkit.run.allowance import Limits

    host_side = encoded(
        "owners", X
    )  # no test examines it: its report is kept, not the environment it came with
    record = execute.RunRecord(
        "cpu-8",
        "ok",
        environment={"device_count": 1, "backend": "tpu", "matmul_precision": "bfloat16", "process_count": 1},
    )
    record.results = {host_side["id"]: {"id": host_side["id"], "value": _planted(), "products": False}}
    verify.verify(
        record,
        callplan.mark([host_side]),
        tmp_path,
        execute.environment_of(configs.CONFIGS["cpu-8"]),
        Limits(),
        timeout=60,
    )
    run = checks.LabRun("cpu-8", configs.CONFIGS["cpu-8"], record)
    assert run.device_count == 8 and run.environment["backend"] == "cpu", run.environment
    assert (
        record.results[host_side["id"]]["judged_by"] == "reported"
        and "products" not in record.results[host_side["id"]]
    )
