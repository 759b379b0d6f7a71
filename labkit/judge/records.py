"""The shapes of what a run writes back, each bounded: decoded here before the kit uses any of it.

Everything a run leaves is the student's word: the harness's results file of a local run, of each
process of a multi-process run and of a pod, and the verifier's `verified.json` (made by a process
that ran the student's exported program). Each is read through `labkit.run.scratch` at most
`MAX_BYTES`, parsed, then converted with msgspec against the schemas below: every string, list and
mapping has a largest length, every number a type, every field its kind. What does not fit raises
`Malformed` (a ValueError) naming the first field that is wrong, and that unit's row says so; the
rest of the class is graded as usual. Fields the kit does not know are dropped, never passed on.

The value of a call (`labkit.judge.plaindata`'s encoding) is checked at its top level here (its kind,
its shape, at most `plaindata.MAX_ELEMENTS` items); what lies deeper is decoded by `plaindata.decode`,
which takes anything malformed as a value that fails its test.
"""

from __future__ import annotations

import json
import threading
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from labkit.judge import plaindata

# A run's results file, or the verifier's: more than this is not read (the largest lab's reference
# writes well under a tenth of it; a program sent for the kit to run is at most facts.PROGRAM_MAX_BYTES).
MAX_BYTES = 16 << 20
# The verifier's verified.json: what its caps on returned values let through (labkit.judge.program: 2 million
# values, at most 16 bytes each, base64 makes 22), and room.
VERIFIED_MAX_BYTES = 64 << 20
MOST_CALLS = 2_000  # results in one file: the labs' tests make at most a few dozen calls
MOST_COLLECTIVES = 20_000  # as labkit.judge.hlo.MOST
MOST_DEVICES = 1 << 16
MOST_STEPS = 400  # as labkit.judge.timeline.MOST_STEPS

Name = Annotated[str, Meta(max_length=200)]
Line = Annotated[str, Meta(max_length=2_000)]
Text = Annotated[str, Meta(max_length=20_000)]
Count = Annotated[int, Meta(ge=0, le=1 << 62)]
Device = Annotated[int, Meta(ge=0, le=MOST_DEVICES)]
Shape = Annotated[list[Count], Meta(max_length=64)]
Number = Annotated[float, Meta(ge=-1e30, le=1e30)]  # finite: no NaN or infinity


class Malformed(ValueError):
    """A record that does not fit its schema; the message names where."""


class _Record(Struct, omit_defaults=True):
    pass


class Unavailable(_Record):
    unavailable: Line


class Memory(_Record):
    argument: Count | UnsetType = UNSET
    output: Count | UnsetType = UNSET
    temp: Count | UnsetType = UNSET
    alias: Count | UnsetType = UNSET
    unavailable: Line | UnsetType = UNSET


class Collective(_Record):
    op: Name
    shape: Text = ""  # a tuple's shape names each of its arrays
    groups: (
        Annotated[list[Annotated[list[Device], Meta(max_length=MOST_DEVICES)]], Meta(max_length=MOST_DEVICES)]
        | UnsetType
    ) = UNSET
    pairs: (
        Annotated[
            list[Annotated[list[Device], Meta(min_length=2, max_length=2)]], Meta(max_length=MOST_DEVICES)
        ]
        | UnsetType
    ) = UNSET


class Placement(_Record):
    path: Line
    shape: Shape
    dtype: Name
    bytes: Count
    device_bytes: Count | UnsetType = UNSET
    replicated: bool | UnsetType = UNSET
    pieces: Count | UnsetType = UNSET
    sharding: Line | UnsetType = UNSET
    unavailable: Line | UnsetType = UNSET


Placements = Annotated[list[Placement], Meta(max_length=10_000)]


class Estimate(_Record):
    """The compiler's own figures for one device (the TPU compiler's `optimal_seconds` and cost analysis)."""

    seconds: Number
    flops: Number = 0.0
    bytes: Number = 0.0


class Step(_Record):
    """One step of a device's timeline (`labkit.judge.timeline.steps`): numbers and the kit's own op names only."""

    op: Literal[
        "compute",
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "collective-permute",
        "all-to-all",
        "done",
        "loop",
    ]
    flops: Number | UnsetType = UNSET
    bytes: Number | UnsetType = UNSET
    sent: Number | UnsetType = UNSET
    width: Device | UnsetType = UNSET
    tag: Count | UnsetType = UNSET
    times: Annotated[int, Meta(ge=0, le=MOST_COLLECTIVES)] | UnsetType = UNSET  # a loop that sends
    length: Annotated[int, Meta(ge=0, le=MOST_STEPS)] | UnsetType = UNSET


class Facts(_Record):
    """`labkit.facts.gather`'s record of a compiled program (each part may be `{"unavailable": why}`)."""

    devices: Annotated[int, Meta(ge=1, le=MOST_DEVICES)] | UnsetType = UNSET
    top_level: Annotated[list[Name], Meta(max_length=1_000)] | UnsetType = UNSET
    memory: Memory | UnsetType = UNSET
    flops: Number | Unavailable | UnsetType = UNSET
    collectives: Annotated[list[Collective], Meta(max_length=MOST_COLLECTIVES)] | Unavailable | UnsetType = (
        UNSET
    )
    inputs: Placements | Unavailable | UnsetType = UNSET
    outputs: Placements | Unavailable | UnsetType = UNSET
    seconds: Number | UnsetType = UNSET
    timeline: Annotated[list[Step], Meta(max_length=MOST_STEPS)] | Unavailable | UnsetType = UNSET
    unavailable: Line | UnsetType = UNSET
    # Added by the kit's verifier, never the student's process: what the program was compiled for (a
    # compile-only TPU configuration), the compiler's estimate there, and the collectives the program
    # itself asks for (its exported StableHLO), as against those the compiler put in.
    compiled_for: Line | UnsetType = UNSET
    compiler: Estimate | UnsetType = UNSET
    written: Annotated[list[Name], Meta(max_length=16)] | UnsetType = UNSET
    written_sizes: (
        Annotated[list[Annotated[list[Name | Count], Meta(max_length=65)]], Meta(max_length=256)] | UnsetType
    ) = UNSET


class Value(_Record):
    """A call's value, as `plaindata.encode` writes it (checked at its top level: see the module's text)."""

    kind: Literal[
        "none", "bool", "int", "float", "str", "list", "tuple", "dict", "array", "too-large", "object"
    ]
    value: Any = UNSET  # a bool, int, float or string, or {"float": "nan"}
    items: Annotated[list[Any], Meta(max_length=plaindata.MAX_ELEMENTS)] | UnsetType = UNSET
    dtype: Name | UnsetType = UNSET
    shape: Shape | UnsetType = UNSET
    data: Annotated[list[Any], Meta(max_length=plaindata.MAX_ELEMENTS)] | UnsetType = UNSET
    # the elements' little-endian bytes in base64 (`plaindata`): at most MAX_ELEMENTS of 16 bytes (complex128)
    bytes: Annotated[str, Meta(max_length=(plaindata.MAX_ELEMENTS * 16 + 2) // 3 * 4)] | UnsetType = UNSET
    jax: bool | UnsetType = UNSET
    sharding: Annotated[dict[Name, Any], Meta(max_length=32)] | UnsetType | None = UNSET
    type: Line | UnsetType = UNSET
    repr: Text | UnsetType = UNSET


class Where(_Record):
    line: int | None = None
    code: Line = ""


class Error(_Record):
    type: Line
    message: Text = ""
    where: Where | None = None


class Result(_Record):
    """One call's record, as the harness writes it."""

    id: Name
    value: Value | UnsetType = UNSET
    error: Error | UnsetType = UNSET
    facts: Facts | UnsetType = UNSET
    # what the kernel sent for the kit to run (`facts.export`): read by labkit.judge.verify, never kept
    program: Annotated[dict[Name, Any], Meta(max_length=32)] | UnsetType = UNSET
    stdout: Text | UnsetType = UNSET


Environment = Annotated[dict[Name, Any], Meta(max_length=64)]


class Payload(_Record):
    """What the harness writes: the environment it saw, one result per call."""

    environment: Environment = {}
    results: Annotated[list[Result], Meta(max_length=MOST_CALLS)] = []


class Found(_Record):
    """One call as the verifier found it: its value and facts, or why it could not run it."""

    value: Value | UnsetType = UNSET
    facts: Facts | UnsetType = UNSET
    unverified: Line | UnsetType = UNSET
    unrunnable: Line | UnsetType = UNSET
    products: bool | UnsetType = UNSET  # whether its program multiplies matrices (labkit.judge.precision)
    finding: Line | UnsetType = UNSET  # copies of a value claimed equal that differ (labkit.judge.program)


class Verified(_Record):
    """The verifier's `verified.json`."""

    results: Annotated[dict[Name, Found], Meta(max_length=MOST_CALLS)]
    environment: Environment = {}
    seconds: float | UnsetType = UNSET


class Ended(_Record):
    """A pod's record of how its kernel ended (`labkit.grading.running.pods.ENDED`)."""

    status: Literal["ok", "error", "skipped"]
    message: Line = ""
    isolation: Name = ""
    timed_out: bool = False
    died: bool = False
    disk: Line | None = None
    failure: Line | None = None
    returncode: int | None = None
    seconds: float = 0.0


# ----------------------------------------------------------------------------------------
# Decoding.
# ----------------------------------------------------------------------------------------


def parse(data: bytes | str, limit: int = MAX_BYTES) -> Any:
    """JSON text as plain data (the standard library's reader: NaN and Infinity as Python writes them), raising
    `Malformed` for anything it cannot read, nesting too deep for it included."""
    if len(data) > limit:
        raise Malformed(f"it is more than {limit >> 20} MB")
    try:
        return json.loads(data)
    except RecursionError:
        raise Malformed("it is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise Malformed(f"it is not JSON ({str(e)[:200]})") from None


# One conversion at a time. msgspec builds a schema's type information at its first use, and two threads
# doing so at once (the judge reads each configuration's results in a thread of its own) crashed the
# kit's process with a segmentation fault: about one start in 75, with 16 threads converting a payload
# each for the first time (msgspec 0.22, Python 3.13). Conversions are small; the lock costs nothing.
_CONVERTING = threading.Lock()


def _convert(data: Any, schema: type) -> dict[str, Any]:
    try:
        with _CONVERTING:
            found = msgspec.to_builtins(msgspec.convert(data, schema))
    except RecursionError:
        raise Malformed("it is nested too deeply") from None
    except msgspec.ValidationError as e:
        raise Malformed(str(e)[:300]) from None
    if not isinstance(found, dict):  # every schema here is a Struct: a dict or nothing
        raise Malformed(f"expected an object, got {type(found).__name__}")
    return found


def payload(data: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(environment, results by call id) from a harness's payload (plain data, `parse`'s)."""
    found = _convert(data, Payload)
    results: dict[str, dict[str, Any]] = {}
    for result in found.get("results", []):
        if result["id"] in results:
            raise Malformed(f"two results for the call {result['id']!r}")
        results[result["id"]] = result
    environment: dict[str, Any] = found.get("environment", {})
    return environment, results


def verified(data: bytes | str) -> dict[str, dict[str, Any]]:
    """The verifier's findings by call id, from the text of its `verified.json`."""
    results: dict[str, dict[str, Any]] = verified_file(data)["results"]
    return results


def verified_file(data: bytes | str) -> dict[str, Any]:
    """The verifier's `verified.json` whole: {"results": findings by call id, "environment": its own, "seconds"}."""
    found = _convert(parse(data, VERIFIED_MAX_BYTES), Verified)
    found.setdefault("results", {})
    found.setdefault("environment", {})
    return found


def ended(data: bytes | str) -> dict[str, Any]:
    """A pod's record of how its run ended, from its text."""
    return _convert(parse(data), Ended)


def facts(data: Any) -> dict[str, Any]:
    """One call's facts (plain data), bounded and typed as `Facts`."""
    return _convert(data, Facts)
