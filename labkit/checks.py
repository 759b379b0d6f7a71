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

import dataclasses
import functools
import hashlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit.course.configs import DeviceConfig
from labkit.judge import budgets, plaindata, precision
from labkit.judge.compiled import (
    TRACEABLE,
    FactUnavailable,
    card_of,
    collectives_of,
    expect_collective,
    expect_collectives_within,
    expect_fits_each_chip,
    expect_held_below,
    expect_input_split,
    expect_jitted,
    expect_sent_within,
    expect_steps_within,
    expect_work_share,
    expect_work_split,
    sent_parts,
    sent_per_device,
)
from labkit.judge.outcomes import CallFailed, Mismatch, NotDone, RunProblem
from labkit.judge.publictests import public_tests
from labkit.judge.values import (
    PRODUCTS,
    describe,
    expect_array,
    expect_close,
    expect_close_naming_mistakes,
    expect_dtype,
    expect_equal,
    expect_replicated,
    expect_shape,
    expect_split_across,
)

# What a lab's tests import: the expectations on values are written in labkit/judge/values.py, those on
# compiled programs in labkit/judge/compiled.py.
__all__ = [
    "SINGLE_PROCESS_MARK",
    "TRACEABLE",
    "AsNumpy",
    "ByDevices",
    "Call",
    "CallFailed",
    "FactUnavailable",
    "GrownSize",
    "LabRun",
    "Mismatch",
    "NotDone",
    "Placed",
    "RunProblem",
    "by_devices",
    "call",
    "card_of",
    "check",
    "collectives_of",
    "compiled_call",
    "describe",
    "expect_array",
    "expect_close",
    "expect_close_naming_mistakes",
    "expect_collective",
    "expect_collectives_within",
    "expect_dtype",
    "expect_equal",
    "expect_fits_each_chip",
    "expect_held_below",
    "expect_input_split",
    "expect_jitted",
    "expect_replicated",
    "expect_sent_within",
    "expect_shape",
    "expect_split_across",
    "expect_steps_within",
    "expect_work_share",
    "expect_work_split",
    "facts_of",
    "judged_on_tpu_only",
    "not_judged_for",
    "placed",
    "public_tests",
    "sent_parts",
    "sent_per_device",
    "shaped",
    "single_process",
    "sizes_of",
]


# ----------------------------------------------------------------------------------------
# Calls into the student's process.
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    function: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    facts: bool = field(
        default=False, compare=False
    )  # also examine the compiled program (not part of the id)
    # read its value back (`facts_of`: its compiled program's facts alone; not part of the id)
    values: bool = field(default=True, compare=False)

    def encoded(self) -> dict:
        what = {
            "function": self.function,
            "args": [_encode_input(a) for a in self.args],
            "kwargs": {k: _encode_input(v) for k, v in self.kwargs.items()},
        }
        what = what if self.values else {**what, "values": False}
        return {**what, "facts": True} if self.facts else what

    @property
    def compile_only(self) -> bool:
        """Are some of its inputs shapes only (`shaped`)? Then nothing computes a value: the TPU compiler
        judges its program, on the compile-only TPU configurations alone."""
        return _has_shapes_only((self.args, self.kwargs))

    @functools.cached_property
    def id(self) -> str:
        """Equal calls share one id, so a call used by several tests runs once (examined if any asks)."""
        what = {k: v for k, v in self.encoded().items() if k not in ("facts", "values")}
        text = json.dumps(what, sort_keys=True)
        return f"{self.function}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Placed:
    """An input that arrives in the student's process already sharded over a mesh of all its devices."""

    value: Any
    spec: tuple
    axes: tuple = ("data",)
    mesh_shape: tuple | None = (
        None  # None: one axis over every device; (2, -1): a grid that fits (harness.fit_mesh_shape)
    )


@dataclass(frozen=True)
class Shaped:
    """An input given by its shape and dtype alone, never made: a call at a production size, whose program only
    the TPU compiler looks at (`shaped`)."""

    shape: tuple
    dtype: str

    @property
    def nbytes(self) -> int:
        import ml_dtypes  # noqa: F401 - numpy then knows bfloat16

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


# How a test that only the TPU compiler's program can judge says it was skipped on a configuration that
# compiles for no TPU (a production size, or a design XLA:CPU compiles the same as another): the tests of the
# kit and the reports tell such a skip from any other by it.
TPU_ONLY_SKIP = "judged by the TPU compiler alone"
PRODUCTION_SIZE_SKIP = f"a production size, {TPU_ONLY_SKIP}"


def judged_on_tpu_only(run: LabRun, why: str) -> None:
    """Skip the test on a configuration that compiles for no TPU, saying `why` its CPU program cannot tell.

    For a check on the compiled program where XLA:CPU writes two designs alike (a reduce-scatter as an
    all-reduce and a slice); the compile-only TPU configurations (v5e-8, ...) judge the TPU program."""
    if not run.config.compile_for:
        _skip_off_tpu(f"{TPU_ONLY_SKIP}, as {why}", run.config)


def not_judged_for(run: LabRun, topologies: tuple[str, ...], why: str) -> None:
    """Skip the test on the compile-only configurations for these TPU `topologies`, saying `why`.

    For a check on the compiled program where that topology's compiler writes the designs the test tells apart
    alike (libtpu sends a reduce-scatter over a 256-device axis as an all-reduce, as it sends the whole product
    made and cut); the other configurations still judge it."""
    import pytest

    if run.config.compile_for in topologies:
        pytest.skip(f"not judged on {run.config.name}: {why}")


def _skip_off_tpu(what: str, config: DeviceConfig) -> None:
    """Skip a test only the TPU compiler judges, on `config` (which compiles for no TPU), saying where it runs."""
    import pytest

    pytest.skip(
        f"{what}: it runs on the compile-only TPU configurations (CONFIGS=v5e-8, v5e-256, ...), not on {config.name}"
    )


def _has_shapes_only(value) -> bool:
    if isinstance(value, Shaped) or (isinstance(value, ByDevices) and isinstance(value.value, Shaped)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_shapes_only(v) for v in value)
    if isinstance(value, dict):
        return any(_has_shapes_only(v) for v in value.values())
    return False


@dataclass(frozen=True, eq=False)
class ByDevices:
    """A test's input whose rows (or another axis) grow with the pod (`by_devices`): as written on pods of up to
    as many devices as it has rows, copied (each copy shifted) until its rows divide over every device on a
    larger one."""

    value: np.ndarray
    shift: float
    axis: int | tuple[int, ...] = 0
    per_device: int = 1
    grid_rows: int = 1
    pieces: int = 0
    widen: bool = False

    def on(self, run: LabRun) -> np.ndarray:
        """The input as `run` got it: what a test's expected value is computed from (an input given by its
        shape alone, `shaped`, as the shape it grew to)."""
        if isinstance(self.value, Shaped):
            shape = list(self.value.shape)
            for a, copies in plaindata.copies_along(self.value.shape, self.grow(), run.device_count).items():
                shape[a] *= copies
            return Shaped(tuple(shape), self.value.dtype)
        return plaindata.grown(self.value, self.grow(), run.device_count)

    def grow(self) -> dict:
        """How the input grows, as its encoding says it (the axis only where it is not the rows, so that a
        call's id is what it was before axes were named)."""
        axis = list(self.axis) if isinstance(self.axis, tuple) else self.axis
        return (
            {"shift": self.shift}
            | ({"axis": axis} if axis else {})
            | ({"per_device": self.per_device} if self.per_device != 1 else {})
            | ({"grid_rows": self.grid_rows} if self.grid_rows != 1 else {})
            | ({"pieces": self.pieces} if self.pieces else {})
            | ({"widen": True} if self.widen else {})
        )


def by_devices(
    value,
    shift: float = 0.0,
    axis: int | tuple[int, ...] = 0,
    per_device: int = 1,
    grid_rows: int = 1,
    pieces: int | None = None,
    widen: bool = False,
) -> ByDevices:
    """An input sized for every pod: `X = by_devices(np.linspace(-4, 4, 32), shift=0.125)`.

    On 1 to 32 devices the call gets X as written; on 256 it gets eight copies of it, one after another, the
    k-th shifted by k * `shift` (so that no two devices hold the same block when `shift` is not 0). A test
    computes what it expects from `X.on(run)`, the input its run got. The call's id, and so what the kit runs
    and records, is the same on every configuration. `axis=1` grows the columns instead, for an input a design
    splits by columns over every device (a 2 x 128 grid's 128); `axis=(0, 1)` grows both, one after the other,
    for a matrix whose rows one result splits over every device and whose columns a grid splits. `per_device=k`
    grows a larger pod's copies until each device gets k rows (or a multiple) along the first axis named, for a
    design that cuts each device's rows again (k micro-batches) or that one row a device would compile
    differently. `grid_rows=k` grows it until it divides over one row of a k x n/k grid (the 128 of a 2 x 128
    grid on 256 devices) rather than over every device: for a dimension a design splits over the grid's other
    axis alone (lab 14's model dimension, which only the 'model' axis cuts). `pieces=k`, for a design that cuts
    each device's block again into k pieces for every device (a ring all-reduce's n pieces: k = 1), keeps it as
    written on pods of up to sqrt(rows / k) devices (1024 rows: 1 to 32) and grows it on a larger one until
    each device's rows are a multiple of k x devices (65,536 rows on 256). A `shaped` input grows its shape the
    same way (`by_devices(shaped((8, d, d)))`: a production size with a layer for each of up to 256 stages).
    `widen=True` gives each device `per_device` rows of the first axis named on every pod of more than 32 devices,
    even one with no more devices than the axis has rows: for a problem that must stay wide enough per device
    (lab 14's work budget: its 256 hidden units become 8 for each device of a 2 x 128 grid's row, 1,024)."""
    value = value if isinstance(value, Shaped) else np.asarray(value)
    axes = plaindata.axes_of(axis)
    if not axes or len(set(axes)) < len(axes) or not all(0 <= a < len(value.shape) for a in axes):
        raise TypeError(f"by_devices: an array with the axes {axis} to grow, not one of shape {value.shape}")
    if int(per_device) < 1:
        raise TypeError(f"by_devices: per_device is a count of rows, 1 or more, not {per_device!r}")
    if int(grid_rows) < 1:
        raise TypeError(f"by_devices: grid_rows is a count of the grid's rows, 1 or more, not {grid_rows!r}")
    if pieces is not None and int(pieces) < 1:
        raise TypeError(f"by_devices: pieces is a count of pieces a device, 1 or more, not {pieces!r}")
    return ByDevices(
        value,
        float(shift),
        axes if len(axes) > 1 else axes[0],
        int(per_device),
        int(grid_rows),
        int(pieces or 0),
        bool(widen),
    )


# How an axis of a `by_devices` input grows, of what its `grow` says, that only the first axis named takes.
_FIRST_AXIS_ONLY = ("per_device", "pieces", "widen")


@dataclass(frozen=True, eq=False)
class GrownSize:
    """A size a call takes (a count of rows or columns, for a function that takes sizes, not arrays): as written
    on pods up to its length, grown on a larger one as the axis of a `by_devices` input it measures (`sizes_of`)."""

    value: int
    grow: dict

    def on(self, run: LabRun) -> int:
        """The size as `run`'s call got it: the length that axis of the input reached on its pod."""
        return self.value * plaindata.copies_along((self.value,), self.grow, run.device_count)[0]


def sizes_of(x: ByDevices) -> tuple:
    """The shape of `x`, as the sizes a call takes that grow with the pod as `x` does: `call("predict_sent",
    "psum", sizes_of(X))` with `X = by_devices(..., axis=(0, 1))` gives the student's function X's shape as
    written on 1 to 32 devices and the shape `X.on(run)` has on a larger pod (each size a `GrownSize`, each
    axis that does not grow a plain int). For a function that takes sizes and an examined program that takes
    `x`: both are asked at the size the run's pod gave `x`."""
    if not isinstance(x, ByDevices) or isinstance(x.value, Shaped):
        raise TypeError(f"sizes_of: an input made by by_devices of an array, not {type(x).__name__}")
    grow, axes = x.grow(), plaindata.axes_of(x.axis)
    sizes: list = [int(n) for n in x.value.shape]
    for i, a in enumerate(axes):
        taken = ("shift", "axis") if i == 0 else ("shift", "axis", *_FIRST_AXIS_ONLY)
        kept = {k: v for k, v in grow.items() if k not in taken}
        sizes[a] = GrownSize(sizes[a], {"axis": 0} | kept)
    return tuple(sizes)


@dataclass(frozen=True)
class AsNumpy:
    """An input that arrives as a numpy array rather than a JAX array (`AsNumpy(by_devices(x, shift=...))`
    grows with the pod as `by_devices` says)."""

    value: Any


def call(function: str, *args, **kwargs) -> Call:
    """A call of the student's `function` on these inputs. Arrays arrive as JAX arrays on the default device."""
    made = Call(function, tuple(args), dict(kwargs))
    if made.compile_only:
        raise TypeError(
            f"call({function!r}, ...) has an input given by its shape only (shaped), which has no value to "
            "compute: examine its program with compiled_call"
        )
    return made


def shaped(shape, dtype="float32") -> Shaped:
    """An input of this shape and dtype that is never made: `compiled_call("train_step", shaped((8192, 32768)))`.

    The student's function is traced on it (as `jax.ShapeDtypeStruct`) and its program compiled for a TPU
    topology, never run: a production size no CPU could hold. Such a test runs on the compile-only TPU
    configurations (`v5e-8`, `v5e-256`, ...) and is skipped on every other, saying so.
    """
    import ml_dtypes  # noqa: F401 - JAX's own: numpy then knows bfloat16 by name

    return Shaped(tuple(int(n) for n in shape), str(np.dtype(dtype)))


def placed(value, spec, axes=("data",), mesh_shape=None) -> Placed:
    """An input already placed on the student's devices: `placed(x, ("data", None))`.

    `mesh_shape=(2, -1)` with `axes=("data", "model")` places it on a grid of every device that fits
    the run: 2 x 4 on eight devices, 1 x 1 on one (see `labkit.judge.harness.fit_mesh_shape`).
    """
    value = value if isinstance(value, ByDevices) else np.asarray(value)
    return Placed(value, tuple(spec), tuple(axes), tuple(mesh_shape) if mesh_shape else None)


def _encode_input(value) -> dict:
    if isinstance(value, Shaped):
        return {"kind": "abstract", "shape": list(value.shape), "dtype": value.dtype}
    if isinstance(value, GrownSize):  # an int that grows with the pod in the student's process (`sizes_of`)
        return {"kind": "int", "value": int(value.value), "grow": dict(value.grow)}
    if isinstance(value, ByDevices):
        inner = (
            _encode_input(value.value) if isinstance(value.value, Shaped) else plaindata.encode(value.value)
        )
        return inner | {"grow": value.grow()}
    if isinstance(value, Placed):
        enc = _encode_input(value.value)
        enc["place"] = {
            "spec": [list(e) if isinstance(e, tuple) else e for e in value.spec],
            "axes": list(value.axes),
            "shape": list(value.mesh_shape) if value.mesh_shape else None,
        }
        return enc
    if isinstance(value, AsNumpy):
        inner = value.value
        enc = _encode_input(inner) if isinstance(inner, ByDevices) else plaindata.encode(np.asarray(inner))
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
    # what the budget checks of the test measured on this run (`labkit.judge.budgets`), for the judge to carry out
    budgets: list[dict] = field(default_factory=list)

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
                raise RunProblem(
                    f"no result came back for `{c.function}` from process {p.get('process')}", "error"
                )
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
            raise RunProblem(
                f"JAX could not start in the notebook: {env_error.get('type')}: {env_error.get('message')}",
                "error",
            )
        result = rec.results.get(c.id)
        if result is None:
            raise RunProblem(f"no result came back for `{c.function}`", "error")
        if "error" in result:
            raise _call_error(c.function, result["error"])
        value = plaindata.decode(result.get("value"))
        if c.facts:
            value = dataclasses.replace(value, compiled=plaindata.decode_compiled(result.get("facts")))
        return value


def _precision_of(lab_run: LabRun, calls) -> str:
    """The precision a test's float32 checks allow: its run's (`precision.of_run`) where any of its calls' values
    passed through a matrix product (the kit read the program it ran: `products`; a call the kit did not run
    may have), else float32: no product, nothing to round."""
    results = getattr(lab_run.record, "results", {}) or {}
    calls = list(calls)
    if calls and all(results.get(c.id, {}).get("products", True) is False for c in calls):
        return precision.FLOAT32
    return precision.of_run(lab_run.environment or {})


def _findings(lab_run: LabRun, calls) -> str:
    """What the kit found running the programs of a test's calls itself (`verify.verify`'s `finding`), in one line."""
    results = getattr(lab_run.record, "results", {}) or {}
    found = dict.fromkeys(str(f) for c in calls if isinstance(f := results.get(c.id, {}).get("finding"), str))
    return "; ".join(found)


def _call_error(function: str, err: dict) -> Exception:
    kind, message, where = err.get("type", ""), err.get("message", ""), err.get("where")
    if kind == "NotImplementedError":
        return NotDone("not implemented yet")
    if kind == "Missing":
        return CallFailed(f"`{function}` is not defined: is its cell still in the notebook, and does it run?")
    if kind in ("NotCallable", "Unverified"):
        return CallFailed(message)
    at = f" at line {where['line']} of its cell: `{where['code']}`" if where and where.get("code") else ""
    return CallFailed(
        f"`{function}` raised {kind}{at}: {message}" if message else f"`{function}` raised {kind}{at}"
    )


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

    `points` is what the test is worth in a grade (default 1; see labkit/grading/state/policy.py for how
    configurations combine).
    """

    if isinstance(points, bool) or not isinstance(points, (int, float)) or not points >= 0:
        raise TypeError(f"check(points=...) takes a number of points >= 0, not {points!r}")
    for name, c in calls.items():
        if not isinstance(c, Call):
            raise TypeError(f"check({name}=...) takes call(...), not {type(c).__name__}")

    def decorate(body):
        wants = set(inspect.signature(body).parameters)
        compile_only = any(c.compile_only for c in calls.values())
        unknown = wants - set(calls) - {"run"}
        if unknown:
            raise TypeError(f"{body.__name__} asks for {sorted(unknown)}, which no call provides")

        @functools.wraps(body)
        def test(lab_run: LabRun):
            if compile_only and not lab_run.config.compile_for:
                _skip_off_tpu(PRODUCTION_SIZE_SKIP, lab_run.config)
            values = {name: lab_run.value(c) for name, c in calls.items()}
            if "run" in wants:
                values["run"] = lab_run
            whose = {id(values[name]): (c.function, c.compile_only) for name, c in calls.items()}
            token = PRODUCTS.set(_precision_of(lab_run, calls.values()))
            try:
                with budgets.measuring(lab_run.label, whose, lab_run.budgets):
                    body(**{k: v for k, v in values.items() if k in wants})
            except (
                AssertionError
            ) as failed:  # Mismatch too: a finding of the kit's own run of the program is named
                found = _findings(lab_run, calls.values())
                if not found:
                    raise
                raise Mismatch(f"{str(failed).strip() or 'assertion failed'} (and: {found})") from None
            finally:
                PRODUCTS.reset(token)

        test.__signature__ = inspect.Signature(
            [inspect.Parameter("lab_run", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        )
        test.__labkit_calls__ = dict(calls)
        test.__labkit_exercise__ = next(iter(calls.values())).function if calls else ""
        test.__labkit_points__ = points
        return test

    return decorate


# ----------------------------------------------------------------------------------------
# Expectations on the compiled program: judge the parallelism, not only the answer.
# ----------------------------------------------------------------------------------------


def compiled_call(function: str, *args, **kwargs) -> Call:
    """Like `call`, and the harness also examines the compiled program; the value's `.compiled` holds its facts."""
    return Call(function, tuple(args), dict(kwargs), facts=True)


def facts_of(function: str, *args, **kwargs) -> Call:
    """Like `compiled_call`, for a test that reads only the compiled program's facts (`.compiled`), never the value:
    the kit runs the program as for any examined call and does not read its outputs back, so neither the caps on
    what a call returns nor the run's total count them (`labkit.judge.program`). The value a test gets has kind
    "none" unless another test asks the same call with `compiled_call`. For a given program whose output grows
    with the pod past anything a test looks at (lab 13's all-gather of an input grown to 256 x 256 returns 16.8
    million values on 256 devices)."""
    return Call(function, tuple(args), dict(kwargs), facts=True, values=False)
