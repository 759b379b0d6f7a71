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
from labkit.judge.inputs import (
    AsNumpy,
    ByDevices,
    GrownSize,
    Placed,
    by_devices,
    encode_input,
    has_shapes_only,
    placed,
    shaped,
    sizes_of,
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
            "args": [encode_input(a) for a in self.args],
            "kwargs": {k: encode_input(v) for k, v in self.kwargs.items()},
        }
        what = what if self.values else {**what, "values": False}
        return {**what, "facts": True} if self.facts else what

    @property
    def compile_only(self) -> bool:
        """Are some of its inputs shapes only (`shaped`)? Then nothing computes a value: the TPU compiler
        judges its program, on the compile-only TPU configurations alone."""
        return has_shapes_only((self.args, self.kwargs))

    @functools.cached_property
    def id(self) -> str:
        """Equal calls share one id, so a call used by several tests runs once (examined if any asks)."""
        what = {k: v for k, v in self.encoded().items() if k not in ("facts", "values")}
        text = json.dumps(what, sort_keys=True)
        return f"{self.function}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


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


def call(function: str, *args, **kwargs) -> Call:
    """A call of the student's `function` on these inputs. Arrays arrive as JAX arrays on the default device."""
    made = Call(function, tuple(args), dict(kwargs))
    if made.compile_only:
        raise TypeError(
            f"call({function!r}, ...) has an input given by its shape only (shaped), which has no value to "
            "compute: examine its program with compiled_call"
        )
    return made


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


def _topologies_and_why(given) -> bool:
    """Whether `given` is `check`'s `not_judged_on`: a tuple of TPU topology names, and a reason that says something."""
    return (
        isinstance(given, tuple)
        and len(given) == 2
        and isinstance(given[0], tuple)
        and all(isinstance(t, str) for t in given[0])
        and isinstance(given[1], str)
        and bool(given[1].strip())
    )


def check(*, points: float = 1, not_judged_on: tuple[tuple[str, ...], str] | None = None, **calls: Call):
    """Declare the student calls a test needs; the test receives their values by the same names.

    `points` is what the test is worth in a grade (default 1; see labkit/grading/state/policy.py for how
    configurations combine). `not_judged_on`: (TPU topologies, why): the test is skipped on the compile-only
    configurations for those topologies, saying why, before its calls' values are read (`not_judged_for` skips
    from inside a test, whose calls must then have run): for a test whose calls cannot be made there at all.
    """

    if isinstance(points, bool) or not isinstance(points, (int, float)) or not points >= 0:
        raise TypeError(f"check(points=...) takes a number of points >= 0, not {points!r}")
    if not_judged_on is not None and not _topologies_and_why(not_judged_on):
        raise TypeError(f"check(not_judged_on=...) takes (topologies, why), not {not_judged_on!r}")
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
            if not_judged_on is not None:
                not_judged_for(lab_run, *not_judged_on)
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


def planned(calls) -> dict[str, dict]:
    """The calls some tests make, each once (by its id) and encoded for a run: its compiled program examined if any
    of them asks (`compiled_call`), its value read back if any of them reads it (`facts_of` reads none)."""
    once: dict[str, Call] = {}
    for c in calls:
        seen = once.get(c.id)
        once[c.id] = (
            c
            if seen is None
            else dataclasses.replace(c, facts=c.facts or seen.facts, values=c.values or seen.values)
        )
    return {cid: {"id": cid, **c.encoded()} for cid, c in once.items()}


def facts_of(function: str, *args, **kwargs) -> Call:
    """Like `compiled_call`, for a test that reads only the compiled program's facts (`.compiled`), never the value:
    the kit runs the program as for any examined call and does not read its outputs back, so neither the caps on
    what a call returns nor the run's total count them (`labkit.judge.program`). The value a test gets has kind
    "none" unless another test asks the same call with `compiled_call`. For a given program whose output grows
    with the pod past anything a test looks at (lab 13's all-gather of an input grown to 256 x 256 returns 16.8
    million values on 256 devices)."""
    return Call(function, tuple(args), dict(kwargs), facts=True, values=False)
