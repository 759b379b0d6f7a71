"""Which calls a run makes and the kit runs itself, and what the student's process sees of each.

The lab's tests declare calls (`labkit.checks`); the judge collects them as plain data. Before a run, the kit
decides from that list alone, never from anything a run reports: which calls it must run itself (`mark`,
`required`), what the student's process is given of them (`for_the_student`: shapes only where the kit runs
the program), which calls a configuration makes at all (`for_configuration`: a production size only where a
TPU topology is compiled for), and which may take host data (`takes_host_data`). `labkit.judge.verify` runs
them after the notebook.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NotRequired, TypedDict


class CallSpec(TypedDict):
    """One call the lab's tests declare, as every layer passes it on (`checks.Call.encoded` and its id; the JSON
    of calls.json and of the verifier's job, unchanged). Each input is encoded by `labkit.judge.plaindata`:
    an array, its shape alone ("abstract"), or a Python value."""

    id: str
    function: str  # the exercise's name in the notebook
    args: list[Any]
    kwargs: dict[str, Any]
    facts: NotRequired[bool]  # a test reads its compiled program
    values: NotRequired[bool]  # False: no test reads its value, never read back (`checks.facts_of`)
    verify: NotRequired[bool]  # the kit runs its program itself (`mark`)
    # in the verifier's job: why the student's trace at a production size failed
    tpu_refused: NotRequired[str]


def mark(calls: list[CallSpec]) -> list[CallSpec]:
    """The judge's calls, those the kit must run itself marked `verify`: every call of a function whose
    compiled program any test reads (a function the tests examine is one jax.jit can trace)."""
    examined = {c["function"] for c in calls if c.get("facts")}
    return [c | {"verify": True} if c["function"] in examined else c for c in calls]


def for_the_student(calls: list[CallSpec]) -> list[CallSpec]:
    """The calls as the student's process gets them: a call the kit runs itself gets its JAX arrays as
    shapes, dtypes and placements only, so the tests' inputs (hidden ones too) never enter that process
    and no program can hold their answers. Inputs given as numpy arrays (host data the function reads
    on the host, as lab 11's do) and Python values still arrive whole."""
    return [_abstracted(c) if required(c) else c for c in calls]


def _abstracted(call: CallSpec) -> CallSpec:
    def strip(enc: Any) -> Any:
        if not isinstance(enc, dict):
            return enc
        kind = enc.get("kind")
        if kind in ("list", "tuple"):
            return {**enc, "items": [strip(v) for v in enc["items"]]}
        if kind == "dict":
            return {**enc, "items": [[k, strip(v)] for k, v in enc["items"]]}
        if kind == "array" and enc.get("as") != "numpy":
            return {
                "kind": "abstract",
                "dtype": enc["dtype"],
                "shape": enc["shape"],
                **({"place": enc["place"]} if enc.get("place") else {}),
                **({"grow": enc["grow"]} if enc.get("grow") else {}),
            }
        return enc

    return {
        **call,
        "args": [strip(a) for a in call.get("args", [])],
        "kwargs": {k: strip(v) for k, v in call.get("kwargs", {}).items()},
    }


def required(call: CallSpec) -> bool:
    """Must this call's value come from the kit's own run of its program? (See `mark`.)"""
    return bool(call.get("verify"))


def _inputs(call: CallSpec) -> Iterator[dict[str, Any]]:
    """Every encoded input of the kit's call, nested ones included."""
    stack = [*call.get("args", []), *call.get("kwargs", {}).values()]
    while stack:
        enc = stack.pop()
        if not isinstance(enc, dict):
            continue
        yield enc
        items = enc.get("items") if enc.get("kind") in ("list", "tuple", "dict") else None
        stack.extend((v[1] if enc["kind"] == "dict" else v) for v in (items or []))


def takes_host_data(call: CallSpec) -> bool:
    """Do the lab's tests give this call host data (an input as a numpy array, `checks.as_numpy`)? Only such a
    call's function may make arrays from host data inside; the kit decides, from its own call list."""
    return any(enc.get("kind") == "array" and enc.get("as") == "numpy" for enc in _inputs(call))


def compile_only(call: CallSpec) -> bool:
    """Does the lab's test give this call inputs by their shapes alone (`checks.shaped`, a production size)? Its
    program is then only compiled, for a TPU topology, never run. Asked of the kit's own call list, never of
    `for_the_student`'s (where every call the kit runs carries its arrays as shapes)."""
    return any(enc.get("kind") == "abstract" for enc in _inputs(call))


def for_configuration(calls: list[CallSpec], compiles_for_tpu: bool) -> list[CallSpec]:
    """The calls a run makes: those at a production size only where the run's configuration compiles for a TPU
    topology (their tests are skipped everywhere else)."""
    return calls if compiles_for_tpu else [c for c in calls if not compile_only(c)]
