"""A test that reads only a compiled program's facts (`checks.facts_of`): the kit runs the program and reads none
of its outputs back, so they count against no cap (`labkit.judge.program`), and the call stays the one
`compiled_call` makes.

Lab 13's tests read the bytes each device sends and the card's FLOPs, never a value: on 256 devices its given
all-gather of an input grown to 256 x 256 returns 16.8 million values, past anything the kit reads back.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace

import jax
import numpy as np

from labkit import checks
from labkit.judge import plaindata, program, verify
from labkit.judge.judge import _Plugin

X = np.linspace(-4.0, 4.0, 32, dtype=np.float32)


def program_of(fn, *args) -> str:
    return base64.b64encode(bytes(jax.export.export(jax.jit(fn))(*args).serialize())).decode()


def test_facts_of_is_the_call_compiled_call_makes_with_its_value_left_unread():
    facts_only, examined = checks.facts_of("f", X), checks.compiled_call("f", X)
    assert facts_only.id == examined.id  # one call: its cost card and its runs are compiled_call's
    assert facts_only.encoded() == examined.encoded() | {"values": False}
    assert "values" not in examined.encoded() and "values" not in checks.call("f", X).encoded()


def test_the_kit_runs_the_program_and_reads_back_its_facts_and_no_value():
    too_many = program.MAX_OUTPUT_ELEMENTS + 1  # more values than one call may return on one device
    blob = program_of(lambda x: jax.numpy.tile(x, too_many // len(X) + 1), X)
    asked = checks.compiled_call("tile", X)
    refused = verify.run_program({"id": asked.id, **asked.encoded()}, blob)
    assert "return only what the exercise asks for" in refused["unverified"]
    only = checks.facts_of("tile", X)
    budget = [program.MAX_RUN_ELEMENTS]
    found = verify.run_program({"id": only.id, **only.encoded()}, blob, budget)
    assert plaindata.decode(found["value"]).kind == "none" and budget == [program.MAX_RUN_ELEMENTS]
    assert found["facts"]["outputs"][0]["shape"][0] > too_many  # the facts of the program that ran


def test_a_call_one_test_reads_the_value_of_is_read_back_whoever_else_asks_it():
    def test_of(*calls):
        return SimpleNamespace(function=SimpleNamespace(__labkit_calls__=dict(enumerate(calls))))

    def planned(*items):
        plugin = _Plugin([], [], jobs=1, timeout=1.0)
        plugin.pytest_collection_finish(SimpleNamespace(items=list(items)))
        return {c["id"]: c for c in plugin.calls}

    only, examined, other = checks.facts_of("f", X), checks.compiled_call("f", X), checks.facts_of("f", X[:8])
    for items in ([test_of(only), test_of(examined)], [test_of(examined), test_of(only)]):
        calls = planned(*items)
        assert "values" not in calls[only.id] and calls[only.id]["facts"]  # read back, and examined
    calls = planned(test_of(only), test_of(other))
    assert calls[only.id]["values"] is False and calls[other.id]["values"] is False
