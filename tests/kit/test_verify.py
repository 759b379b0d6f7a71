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
from labkit.judge import plaindata, verify

X = np.linspace(-4.0, 4.0, 32, dtype=np.float32)


def encoded(function: str, *args, examined: bool = False) -> dict:
    c = checks.compiled_call(function, *args) if examined else checks.call(function, *args)
    return {"id": c.id, **c.encoded()}


def program_of(fn, *args, **export_options) -> str:
    exported = jax.export.export(jax.jit(fn), **export_options)(*args)
    return base64.b64encode(bytes(exported.serialize())).decode()


def test_every_call_of_a_function_some_test_examines_is_marked_and_no_other():
    calls = verify.mark([encoded("double", X, examined=True), encoded("double", X[:8]), encoded("owners", X)])
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
    assert any(c.startswith("lapack_") for c in verify.custom_calls(
        jax.export.deserialize(bytearray(base64.b64decode(blob))).mlir_module()))
    found = verify.run_program(encoded("cholesky", SPD), blob)
    assert np.allclose(plaindata.decode(found["value"]).value, np.linalg.cholesky(SPD)), found


def test_a_program_that_calls_code_outside_the_allow_list_is_refused(monkeypatch):
    monkeypatch.setattr(verify, "ALLOWED_PATTERN", re.compile("(?!)"))  # LAPACK no longer allowed
    found = verify.run_program(encoded("cholesky", SPD), program_of(jnp.linalg.cholesky, SPD))
    assert "calls code the kit does not run (lapack_" in found["unverified"], found


def test_a_function_that_prints_from_inside_its_program_is_told_to_take_the_print_out():
    def printing(x):
        jax.debug.print("{}", x[0])
        return x * 2.0

    sent = facts.export(printing, (jnp.asarray(X),), {})
    assert "program" not in sent and "jax.debug.print" in sent["unavailable"], sent


def test_custom_call_targets_are_read_from_either_spelling():
    text = ('%0 = stablehlo.custom_call @Sharding(%arg0)\n'
            '%1 = "stablehlo.custom_call"(%0) {call_target_name = "xla_python_cpu_callback"}')
    assert verify.custom_calls(text) == {"Sharding", "xla_python_cpu_callback"}


@pytest.mark.parametrize(("marks", "word"), [({"verified"}, "verified"), ({"reported"}, "reported"),
                                              ({"verified", "reported"}, "partly verified"),
                                              ({"unverified"}, "verified"), (set(), "reported")])
def test_a_run_is_summed_up_in_one_word(marks, word):
    assert verify.judged_by({str(i): {"judged_by": m} for i, m in enumerate(sorted(marks))}) == word
