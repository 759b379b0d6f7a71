"""How a lab's tests are written: the calls to make in the student's process, and the checks on what came back.

A lab test names the student's function and the inputs to call it with, and then states
what must hold of the value that came back. The call happens in the student's own
process; the test body runs here, in the judge, on plain data::

    X = np.arange(16, dtype=np.float32)

    @check(got=call("shard_map_double", X))
    def test_doubles_every_element(got):
        expect_close(got, 2 * X)

The test receives a `plaindata.Value` for each call, and `run` (a `LabRun`) if it asks for
it. The `expect_*` helpers raise `Mismatch` with a message written for students: what was
expected against what came back, and, with `hint=`, the likely mistake.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import hashlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit import cost
from labkit.course.configs import DeviceConfig
from labkit.judge import plaindata, precision

# The effective precision of the float32 matrix products of the run a test is looking at (set while
# its body runs): `expect_close` widens its tolerances to it (see `labkit.judge.precision`).
_PRODUCTS = contextvars.ContextVar("labkit_matmul_precision", default=precision.FLOAT32)


# ----------------------------------------------------------------------------------------
# Outcomes other than a plain pass: each carries a message for the student.
# ----------------------------------------------------------------------------------------

class Mismatch(AssertionError):
    """The student's value is not what the test expects."""


class NotDone(Exception):
    """The exercise still raises NotImplementedError."""


class CallFailed(Exception):
    """The student's function raised, or is missing."""


class RunProblem(Exception):
    """The notebook run itself did not finish (timeout, crash, unreadable notebook)."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------------------
# Calls into the student's process.
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    function: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    facts: bool = field(default=False, compare=False)  # also examine the compiled program (not part of the id)

    def encoded(self) -> dict:
        what = {"function": self.function, "args": [_encode_input(a) for a in self.args],
                "kwargs": {k: _encode_input(v) for k, v in self.kwargs.items()}}
        return {**what, "facts": True} if self.facts else what

    @functools.cached_property
    def id(self) -> str:
        """Equal calls share one id, so a call used by several tests runs once (examined if any asks)."""
        text = json.dumps({k: v for k, v in self.encoded().items() if k != "facts"}, sort_keys=True)
        return f"{self.function}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Placed:
    """An input that arrives in the student's process already sharded over a mesh of all its devices."""

    value: Any
    spec: tuple
    axes: tuple = ("data",)
    mesh_shape: tuple | None = None  # None: one axis over every device; (2, -1): a grid that fits (harness.fit_mesh_shape)


@dataclass(frozen=True)
class AsNumpy:
    """An input that arrives as a numpy array rather than a JAX array."""

    value: Any


def call(function: str, *args, **kwargs) -> Call:
    """A call of the student's `function` on these inputs. Arrays arrive as JAX arrays on the default device."""
    return Call(function, tuple(args), dict(kwargs))


def placed(value, spec, axes=("data",), mesh_shape=None) -> Placed:
    """An input already placed on the student's devices: `placed(x, ("data", None))`.

    `mesh_shape=(2, -1)` with `axes=("data", "model")` places it on a grid of every device that fits
    the run: 2 x 4 on eight devices, 1 x 1 on one (see `labkit.judge.harness.fit_mesh_shape`).
    """
    return Placed(np.asarray(value), tuple(spec), tuple(axes), tuple(mesh_shape) if mesh_shape else None)


def _encode_input(value) -> dict:
    if isinstance(value, Placed):
        enc = plaindata.encode(np.asarray(value.value))
        enc["place"] = {"spec": [list(e) if isinstance(e, tuple) else e for e in value.spec],
                        "axes": list(value.axes), "shape": list(value.mesh_shape) if value.mesh_shape else None}
        return enc
    if isinstance(value, AsNumpy):
        enc = plaindata.encode(np.asarray(value.value))
        enc["as"] = "numpy"
        return enc
    if isinstance(value, (list, tuple)):
        return {"kind": type(value).__name__, "items": [_encode_input(v) for v in value]}
    if isinstance(value, dict):
        return {"kind": "dict", "items": [[str(k), _encode_input(v)] for k, v in value.items()]}
    return plaindata.encode(value)


# ----------------------------------------------------------------------------------------
# The run a test looks at.
# ----------------------------------------------------------------------------------------

@dataclass
class LabRun:
    """One notebook run on one configuration, as the judge sees it."""

    label: str  # how the run is named in reports: the configuration, or "student/configuration"
    config: DeviceConfig
    record: Any  # execute.RunRecord

    @property
    def device_count(self) -> int:
        return int(self.record.environment.get("device_count") or self.config.devices or 1)

    @property
    def environment(self) -> dict:
        return self.record.environment

    @property
    def process_count(self) -> int:
        """How many JAX processes ran the notebook (2 on cpu-2x4); the values tests read are process 0's."""
        return int(self.record.environment.get("process_count") or self.config.processes or 1)

    def _per_process(self, c: Call) -> list[dict]:
        self.value(c)  # raises what a test should see when the run or process 0's call failed
        processes = getattr(self.record, "processes", None) or []
        if not processes:
            return [self.record.results[c.id]]
        out = []
        for p in processes:
            result = p.get("results", {}).get(c.id)
            if result is None:
                raise RunProblem(f"no result came back for `{c.function}` from process {p.get('process')}", "error")
            out.append(result)
        return out

    def each_process(self, c: Call) -> list[plaindata.Value]:
        """What `c` returned in every process of the run, process 0 first (one item when there is one process)."""
        values = []
        for number, result in enumerate(self._per_process(c)):
            if "error" in result:
                err = _call_error(c.function, result["error"])
                raise type(err)(f"{err} (on process {number})") if isinstance(err, CallFailed) else err
            values.append(plaindata.decode(result.get("value")))
        return values

    def printed(self, c: Call) -> list[str]:
        """What the call printed in each process, process 0 first."""
        return [str(result.get("stdout", "")) for result in self._per_process(c)]

    def value(self, c: Call) -> plaindata.Value:
        """What the student's function returned for `c`, or the right exception when it did not return."""
        rec = self.record
        if rec.status != "ok":
            raise RunProblem(rec.message or f"the notebook run ended with {rec.status}", rec.status)
        env_error = rec.environment.get("error")
        if env_error:
            raise RunProblem(f"JAX could not start in the notebook: {env_error.get('type')}: "
                             f"{env_error.get('message')}", "error")
        result = rec.results.get(c.id)
        if result is None:
            raise RunProblem(f"no result came back for `{c.function}`", "error")
        if "error" in result:
            raise _call_error(c.function, result["error"])
        value = plaindata.decode(result.get("value"))
        if c.facts:
            value = dataclasses.replace(value, compiled=plaindata.decode_compiled(result.get("facts")))
        return value


def _call_error(function: str, err: dict) -> Exception:
    kind, message, where = err.get("type", ""), err.get("message", ""), err.get("where")
    if kind == "NotImplementedError":
        return NotDone("not implemented yet")
    if kind == "Missing":
        return CallFailed(f"`{function}` is not defined: is its cell still in the notebook, and does it run?")
    if kind in ("NotCallable", "Unverified"):
        return CallFailed(message)
    at = f" at line {where['line']} of its cell: `{where['code']}`" if where and where.get("code") else ""
    return CallFailed(f"`{function}` raised {kind}{at}: {message}" if message else f"`{function}` raised {kind}{at}")


# ----------------------------------------------------------------------------------------
# A lab that only makes sense in one JAX process.
# ----------------------------------------------------------------------------------------

SINGLE_PROCESS_MARK = "labkit_single_process"


def single_process(reason: str):
    """Declare tests meaningless across several JAX processes, in a test module::

        pytestmark = single_process("its inputs live in one process; lab 11 builds global arrays")

    On a multi-process configuration (cpu-2x4) those tests are `skipped` with `reason`, and a lab
    whose tests all say so is not run there at all. The declaration lives with the tests (trusted),
    never in the notebook a student hands in.
    """
    import pytest

    return getattr(pytest.mark, SINGLE_PROCESS_MARK)(reason)


# ----------------------------------------------------------------------------------------
# The decorator.
# ----------------------------------------------------------------------------------------

def check(*, points: float = 1, **calls: Call):
    """Declare the student calls a test needs; the test receives their values by the same names.

    `points` is what the test is worth in a grade (default 1; see labkit/grading/policy.py for how
    configurations combine).
    """

    if isinstance(points, bool) or not isinstance(points, (int, float)) or not points >= 0:
        raise TypeError(f"check(points=...) takes a number of points >= 0, not {points!r}")
    for name, c in calls.items():
        if not isinstance(c, Call):
            raise TypeError(f"check({name}=...) takes call(...), not {type(c).__name__}")

    def decorate(body):
        wants = set(inspect.signature(body).parameters)
        unknown = wants - set(calls) - {"run"}
        if unknown:
            raise TypeError(f"{body.__name__} asks for {sorted(unknown)}, which no call provides")

        @functools.wraps(body)
        def test(lab_run: LabRun):
            values = {name: lab_run.value(c) for name, c in calls.items()}
            if "run" in wants:
                values["run"] = lab_run
            token = _PRODUCTS.set(precision.of_run(lab_run.environment or {}))
            try:
                body(**{k: v for k, v in values.items() if k in wants})
            finally:
                _PRODUCTS.reset(token)

        test.__signature__ = inspect.Signature([inspect.Parameter("lab_run", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
        test.__labkit_calls__ = dict(calls)
        test.__labkit_exercise__ = next(iter(calls.values())).function if calls else ""
        test.__labkit_points__ = points
        return test

    return decorate


# ----------------------------------------------------------------------------------------
# Expectations, with messages for students.
# ----------------------------------------------------------------------------------------

def _fmt(x) -> str:
    arr = np.asarray(x)
    if arr.ndim == 0:
        return np.format_float_positional(arr.item(), trim="-") if arr.dtype.kind == "f" else repr(arr.item())
    return np.array2string(arr, precision=4, threshold=12, edgeitems=3, separator=", ").replace("\n", "")


def _with_hint(message: str, hint: str | None) -> str:
    return f"{message}. {hint}" if hint else message


def describe(got: plaindata.Value) -> str:
    if got.kind == "array":
        return f"an array of shape {got.shape} and dtype {got.dtype}"
    if got.kind in ("int", "float", "bool", "str"):
        return f"the {got.kind} {got.value!r}"
    if got.kind == "none":
        return "None (did the function forget to `return`?)"
    if got.kind in ("list", "tuple"):
        return f"a {got.kind} of {len(got.value)} items"
    return got.description or got.kind


def expect_array(got: plaindata.Value, *, hint: str | None = None) -> np.ndarray:
    """The value must be an array (a Python or numpy number counts as a 0-d array)."""
    if got.kind == "array":
        return got.value
    if got.kind in ("int", "float", "bool"):
        return np.asarray(got.value)
    raise Mismatch(_with_hint(f"expected an array, got {describe(got)}", hint))


def expect_shape(got: plaindata.Value, shape, *, hint: str | None = None) -> None:
    arr = expect_array(got, hint=hint)
    if tuple(arr.shape) != tuple(shape):
        raise Mismatch(_with_hint(f"expected shape {tuple(shape)}, got shape {tuple(arr.shape)}", hint))


def expect_dtype(got: plaindata.Value, dtype, *, hint: str | None = None) -> None:
    arr = expect_array(got, hint=hint)
    want = str(np.dtype(dtype)) if dtype != "bfloat16" else "bfloat16"
    have = got.dtype or str(arr.dtype)
    if have != want:
        raise Mismatch(_with_hint(f"expected dtype {want}, got {have}", hint))


def expect_close(got: plaindata.Value, want, *, rtol: float = 1e-5, atol: float = 1e-6,
                 hint: str | None = None) -> None:
    """Same shape, and every value equal within rtol/atol. Says where the first difference is.

    rtol and atol are for float32 products; a run whose products were less precise (bfloat16, TF32)
    gets the tolerances its precision implies (`labkit.judge.precision.tolerances`).
    """
    want = np.asarray(want)
    rtol, atol = precision.tolerances(rtol, atol, want, _PRODUCTS.get())
    arr = expect_array(got, hint=hint)
    if arr.shape != want.shape:
        raise Mismatch(_with_hint(f"expected shape {want.shape}, got shape {arr.shape}", hint))
    if arr.dtype.kind not in "biufc":
        raise Mismatch(_with_hint(f"expected numbers, got values of dtype {arr.dtype}", hint))
    ok = np.isclose(arr, want, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0]) if arr.ndim else ()
    where = f" at index {list(first)}" if first else ""
    if arr.ndim == 0:
        message = f"expected {_fmt(want)}, got {_fmt(arr)}"
    else:
        message = (f"{len(bad)} of {arr.size} values differ; first{where}: expected {_fmt(want[first])}, "
                   f"got {_fmt(arr[first])} (expected {_fmt(want)}, got {_fmt(arr)})")
    raise Mismatch(_with_hint(message, hint))


def expect_equal(got: plaindata.Value, want, *, hint: str | None = None) -> None:
    """A plain Python value (int, str, bool, ...) equal to `want`."""
    missing = object()
    value = got.value if got.kind in ("int", "float", "bool", "str", "none") else missing
    if got.kind == "array" and got.value.ndim == 0:
        value = got.value.item()
    if value is missing or value != want:
        raise Mismatch(_with_hint(f"expected {want!r}, got {describe(got)}", hint))


def expect_split_across(got: plaindata.Value, devices: int, *, axis: int = 0, hint: str | None = None) -> None:
    """The array must be split along `axis` into `devices` pieces, one on each device."""
    arr = expect_array(got, hint=hint)
    sh = got.sharding
    if sh is None:
        raise Mismatch(_with_hint("expected a JAX array placed on devices, got a plain (numpy or Python) value",
                                  hint))
    if sh.num_devices != devices:
        raise Mismatch(_with_hint(
            f"expected the result on all {devices} devices, but it lives on {sh.num_devices} "
            f"(devices {list(sh.device_ids)})", hint))
    if devices == 1:
        return
    pieces = {tuple(map(tuple, s["index"])) for s in sh.shards}
    cuts = {p[axis] for p in pieces if len(p) > axis}
    if sh.fully_replicated or len(cuts) != devices:
        layout = "a full copy on every device" if sh.fully_replicated else f"{len(cuts)} distinct pieces along axis {axis}"
        raise Mismatch(_with_hint(
            f"expected axis {axis} (length {arr.shape[axis] if arr.ndim > axis else '?'}) split into {devices} "
            f"pieces, one per device; got {layout} ({sh.describe()})", hint))


def expect_replicated(got: plaindata.Value, devices: int, *, hint: str | None = None) -> None:
    """Every one of `devices` devices must hold the whole value."""
    expect_array(got, hint=hint)
    sh = got.sharding
    if sh is None:
        raise Mismatch(_with_hint("expected a JAX array placed on devices, got a plain (numpy or Python) value",
                                  hint))
    if sh.num_devices != devices or not sh.fully_replicated:
        raise Mismatch(_with_hint(f"expected a full copy on each of {devices} devices, got {sh.describe()}", hint))


def expect_close_naming_mistakes(got: plaindata.Value, want, mistakes: dict, *, rtol: float = 1e-5,
                                 atol: float = 1e-6, hint: str | None = None) -> None:
    """Like `expect_close`; when the value is instead what a known mistake gives, the message names the mistake.

    `mistakes` maps a sentence that names a mistake (and its cure) to the value that mistake gives on
    the same inputs and devices, computed by the test. A mistake whose value equals `want` (as many do
    on one device) cannot be told apart from the right answer and is never named.
    """
    want = np.asarray(want)
    rtol, atol = precision.tolerances(rtol, atol, want, _PRODUCTS.get())
    try:
        expect_close(got, want, rtol=rtol, atol=atol)
        return
    except Mismatch as wrong:
        base = str(wrong)
    arr = expect_array(got, hint=hint)
    for mistake, value in mistakes.items():
        value = np.asarray(value)
        if value.shape != arr.shape or arr.dtype.kind not in "biufc":
            continue
        if value.shape == want.shape and np.allclose(value, want, rtol=rtol, atol=atol, equal_nan=True):
            continue
        if np.allclose(arr, value, rtol=rtol, atol=atol, equal_nan=True):
            raise Mismatch(f"{base}. {mistake}")
    raise Mismatch(_with_hint(base, hint))


# ----------------------------------------------------------------------------------------
# Expectations on the compiled program: judge the parallelism, not only the answer.
# ----------------------------------------------------------------------------------------

class FactUnavailable(Mismatch):
    """A check needs a fact of the compiled program that did not come back: it fails, saying why."""


TRACEABLE = ("The checks of parallelism read the compiled program of your function: it must run under jax.jit "
             "(no float(), np.asarray() or Python `if` on array values computed inside it)")


def compiled_call(function: str, *args, **kwargs) -> Call:
    """Like `call`, and the harness also examines the compiled program; the value's `.compiled` holds its facts."""
    return Call(function, tuple(args), dict(kwargs), facts=True)


def collectives_of(got: plaindata.Value) -> tuple:
    """The collectives of the call's compiled program, each once per run, or FactUnavailable with the reason."""
    return _compiled(got, "collectives")[1]


def sent_per_device(got: plaindata.Value) -> float:
    """Bytes one device sends for every collective of the call's compiled program, counted as the cost card
    counts them (labkit.cost: ring costs over each collective's group; a permute's pair is 2 devices, and a
    device sending to itself sends nothing)."""
    return sum(cost.bytes_sent(c.op, cost.shape_bytes(c.shape), cost.permute_width(c.pairs) if c.pairs
                               else max(c.widest, 1))
               for c in collectives_of(got))


def card_of(got: plaindata.Value) -> cost.Card:
    """The cost card of the call's compiled program, as the kit prints it (labkit.cost.card: FLOPs, bytes held
    and bytes sent per device, timed on a chip with `.timing(chip)`), or FactUnavailable with the reason."""
    facts, flops = _compiled(got, "flops")
    memory, found = _compiled(got, "memory")[1], collectives_of(got)
    outputs = facts.outputs if not isinstance(facts.outputs, plaindata.Unavailable) else ()
    return cost.card({"devices": facts.devices, "flops": flops, "memory": memory,
                      "collectives": [{"op": c.op, "shape": c.shape,
                                       **({"pairs": c.pairs} if c.pairs else {"groups": c.groups})} for c in found],
                      "outputs": [{"dtype": o.dtype} for o in outputs]})


def _compiled(got: plaindata.Value, fact: str):
    """The named fact of the call's compiled program, or FactUnavailable with the reason."""
    facts = got.compiled
    if facts is None:
        raise FactUnavailable("this check needs the facts of the compiled program: declare the call with "
                              "compiled_call(...), not call(...)")
    if isinstance(facts, plaindata.Unavailable):
        raise FactUnavailable(f"the compiled program could not be examined ({facts.why}). {TRACEABLE}")
    value = getattr(facts, fact)
    if isinstance(value, plaindata.Unavailable):
        raise FactUnavailable(f"this check cannot be made here: {value.why}")
    return facts, value


def _inputs(got: plaindata.Value, which) -> list:
    _, inputs = _compiled(got, "inputs")
    prefix = f"args[{which}]" if isinstance(which, int) else str(which)
    chosen = [p for p in inputs if p.path == prefix or p.path.startswith(prefix + "[")]
    if not chosen:
        raise FactUnavailable(f"the compiled program has no array input {prefix} (its inputs: "
                              f"{', '.join(p.path for p in inputs) or 'none'})")
    return chosen


def _size(n: int) -> str:
    return f"{n} bytes" if n < 10_000 else f"{n / 1024:.0f} KiB"


def expect_input_split(got: plaindata.Value, which, devices: int, *, name: str | None = None,
                       hint: str | None = None) -> None:
    """Each device holds 1/`devices` of input `which` (a position, or a path such as "args[0]['w']").

    Read from the sharding the compiled program gives the input: the placement the function asked for
    (device_put, shard_map's in_specs, a sharding constraint) decides it. An input whose pieces are
    all held by every device is named as such.
    """
    for p in _inputs(got, which):
        if devices <= 1 or p.bytes == 0:
            continue
        if isinstance(p.device_bytes, plaindata.Unavailable):
            raise FactUnavailable(f"this check cannot be made here: {p.device_bytes.why}")
        if p.device_bytes * devices <= p.bytes:
            continue
        label = name or p.path
        if p.replicated or p.device_bytes >= p.bytes:
            message = (f"every device holds all of {label} ({_size(p.bytes)} on each of {devices} devices), "
                       f"where each should hold 1/{devices} of it")
        else:
            message = (f"each device holds {_size(p.device_bytes)} of {label}'s {_size(p.bytes)}, "
                       f"more than 1/{devices} of it ({p.pieces} distinct pieces)")
        raise Mismatch(_with_hint(message, hint))


def expect_collective(got: plaindata.Value, op: str, devices: int, *, hint: str | None = None) -> None:
    """The compiled program has an `op` (e.g. "all-reduce") that joins all `devices` devices.

    On one device nothing is communicated, and nothing is asked; the facts must still have come back.
    """
    _, found = _compiled(got, "collectives")
    if devices <= 1:
        return
    if any(c.op == op and c.widest >= devices for c in found):
        return
    have = ", ".join(sorted({f"{c.op} over {c.widest}" for c in found})) or "none at all"
    raise Mismatch(_with_hint(f"the compiled program has no {op} over all {devices} devices (its collectives: "
                              f"{have})", hint))


def expect_work_split(got: plaindata.Value, whole_flops: float, devices: int, *, what: str = "the whole batch",
                      hint: str | None = None) -> None:
    """No device does the work of all of it: one device's FLOPs stay well below `whole_flops`.

    `whole_flops` is what the computation's main work costs on all its data at once (counted by the
    test, e.g. its matrix products). A device that computes all of it does at least that, and more for
    the rest of the step; a device of a split computation does about 1/`devices` of it plus that rest,
    which on two devices already comes to three quarters of it. The line is drawn just below the whole.
    """
    _, flops = _compiled(got, "flops")
    if devices <= 1:
        return
    line = 0.95 * whole_flops
    if flops > line:
        raise Mismatch(_with_hint(
            f"one device does {flops:.3g} FLOPs, about the {whole_flops:.3g} that {what} needs: every device "
            f"computes all of it, where each should do about 1/{devices} ({whole_flops / devices:.3g})", hint))


def expect_jitted(got: plaindata.Value, *, allowed=("jit", "pjit", "device_put", "sharding_constraint"),
                  hint: str | None = None) -> None:
    """The function's work happens inside jax.jit: outside it, only placement is allowed."""
    facts, _ = _compiled(got, "top_level")
    loose = sorted(set(facts.top_level) - set(allowed))
    if loose:
        raise Mismatch(_with_hint(f"the work ran op by op, outside any jax.jit ({', '.join(loose)})", hint))


def expect_work_share(got: plaindata.Value, whole_flops: float, devices: int, *, slack: float = 1.5,
                      what: str = "the whole computation", hint: str | None = None) -> None:
    """One device's FLOPs stay within `slack` times its 1/`devices` share of `whole_flops`.

    Tighter than `expect_work_split`: that one catches a device computing everything, this one also
    catches devices that repeat part of each other's work (a grid row whose devices all compute the
    same rows). `slack` leaves room for the small work around the main products.
    """
    _, flops = _compiled(got, "flops")
    if devices <= 1 or flops <= slack * whole_flops / devices:
        return
    raise Mismatch(_with_hint(
        f"one device does {flops:.3g} FLOPs, {flops / whole_flops:.2f} of the {whole_flops:.3g} that {what} needs, "
        f"where its 1/{devices} share is {whole_flops / devices:.3g}: devices repeat each other's work", hint))


def expect_collectives_within(got: plaindata.Value, blocks, *, allowed: str, hint: str | None = None) -> None:
    """Every collective joins only devices of one of `blocks` (sets of the program's device positions).

    Positions are the program's own numbering of its devices, the order of its mesh: on a 2 x 4 grid,
    the blocks {0..3} and {4..7} are its rows, so collectives within them run over the second axis
    only. A collective-permute counts its sources and destinations as joined.
    """
    _, found = _compiled(got, "collectives")
    blocks = [set(b) for b in blocks]
    for c in found:
        for group in (c.groups or [tuple(d for pair in c.pairs for d in pair)]):
            if not any(set(group) <= b for b in blocks):
                raise Mismatch(_with_hint(
                    f"the compiled program has {'an' if c.op[0] in 'aeiou' else 'a'} {c.op} that joins devices "
                    f"{sorted(group)}, where only "
                    f"collectives {allowed} are allowed", hint))


def expect_held_below(got: plaindata.Value, limit: int, *, what: str, hint: str | None = None) -> None:
    """One device's arguments and temporaries (the compiled program's memory analysis) stay below `limit` bytes."""
    _, memory = _compiled(got, "memory")
    held = memory["argument"] + memory["temp"]
    if held >= limit:
        raise Mismatch(_with_hint(f"one device holds {_size(held)} of arguments and temporaries, at least the "
                                  f"{_size(limit)} of {what}", hint))
