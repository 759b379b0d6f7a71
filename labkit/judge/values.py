"""Expectations on the value a call returned, with messages written for students: what was expected against
what came back, and, with `hint=`, the likely mistake (each raises `Mismatch`). A lab's tests import them
from `labkit.checks`; the expectations on compiled programs are in `labkit/judge/compiled.py`.
"""

from __future__ import annotations

import contextvars

import numpy as np

from labkit.judge import plaindata, precision
from labkit.judge.outcomes import Mismatch, fmt, with_hint

# The effective precision of the float32 matrix products of the run a test is looking at (`checks.check` sets
# it while the test's body runs): `expect_close` widens its tolerances to it (see `labkit.judge.precision`).
PRODUCTS = contextvars.ContextVar("labkit_matmul_precision", default=precision.FLOAT32)


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
    raise Mismatch(with_hint(f"expected an array, got {describe(got)}", hint))


def expect_shape(got: plaindata.Value, shape, *, hint: str | None = None) -> None:
    arr = expect_array(got, hint=hint)
    if tuple(arr.shape) != tuple(shape):
        raise Mismatch(with_hint(f"expected shape {tuple(shape)}, got shape {tuple(arr.shape)}", hint))


def expect_dtype(got: plaindata.Value, dtype, *, hint: str | None = None) -> None:
    arr = expect_array(got, hint=hint)
    want = str(np.dtype(dtype)) if dtype != "bfloat16" else "bfloat16"
    have = got.dtype or str(arr.dtype)
    if have != want:
        raise Mismatch(with_hint(f"expected dtype {want}, got {have}", hint))


def expect_close(
    got: plaindata.Value, want, *, rtol: float = 1e-5, atol: float = 1e-6, hint: str | None = None
) -> None:
    """Same shape, and every value equal within rtol/atol. Says where the first difference is.

    rtol and atol are for float32 products; a run whose products were less precise (bfloat16, TF32)
    gets the tolerances its precision implies (`labkit.judge.precision.tolerances`).
    """
    want = np.asarray(want)
    rtol, atol = precision.tolerances(rtol, atol, want, PRODUCTS.get())
    arr = expect_array(got, hint=hint)
    if arr.shape != want.shape:
        raise Mismatch(with_hint(f"expected shape {want.shape}, got shape {arr.shape}", hint))
    if arr.dtype.kind not in "biufc":
        raise Mismatch(with_hint(f"expected numbers, got values of dtype {arr.dtype}", hint))
    ok = np.isclose(arr, want, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0]) if arr.ndim else ()
    where = f" at index {list(first)}" if first else ""
    if arr.ndim == 0:
        message = f"expected {fmt(want)}, got {fmt(arr)}"
    else:
        message = (
            f"{len(bad)} of {arr.size} values differ; first{where}: expected {fmt(want[first])}, "
            f"got {fmt(arr[first])} (expected {fmt(want)}, got {fmt(arr)})"
        )
    raise Mismatch(with_hint(message, hint))


def expect_equal(got: plaindata.Value, want, *, hint: str | None = None) -> None:
    """A plain Python value (int, str, bool, ...) equal to `want`."""
    missing = object()
    value = got.value if got.kind in ("int", "float", "bool", "str", "none") else missing
    if got.kind == "array" and got.value.ndim == 0:
        value = got.value.item()
    if value is missing or value != want:
        raise Mismatch(with_hint(f"expected {want!r}, got {describe(got)}", hint))


def expect_split_across(
    got: plaindata.Value, devices: int, *, axis: int = 0, hint: str | None = None
) -> None:
    """The array must be split along `axis` into `devices` pieces, one on each device."""
    arr = expect_array(got, hint=hint)
    sh = got.sharding
    if sh is None:
        raise Mismatch(
            with_hint("expected a JAX array placed on devices, got a plain (numpy or Python) value", hint)
        )
    if sh.num_devices != devices:
        raise Mismatch(
            with_hint(
                f"expected the result on all {devices} devices, but it lives on {sh.num_devices} "
                f"(devices {list(sh.device_ids)})",
                hint,
            )
        )
    if devices == 1:
        return
    pieces = {tuple(map(tuple, s["index"])) for s in sh.shards}
    cuts = {p[axis] for p in pieces if len(p) > axis}
    if sh.fully_replicated or len(cuts) != devices:
        layout = (
            "a full copy on every device"
            if sh.fully_replicated
            else f"{len(cuts)} distinct pieces along axis {axis}"
        )
        raise Mismatch(
            with_hint(
                f"expected axis {axis} (length {arr.shape[axis] if arr.ndim > axis else '?'}) split into {devices} "
                f"pieces, one per device; got {layout} ({sh.describe()})",
                hint,
            )
        )


def expect_replicated(got: plaindata.Value, devices: int, *, hint: str | None = None) -> None:
    """Every one of `devices` devices must hold the whole value."""
    expect_array(got, hint=hint)
    sh = got.sharding
    if sh is None:
        raise Mismatch(
            with_hint("expected a JAX array placed on devices, got a plain (numpy or Python) value", hint)
        )
    if sh.num_devices != devices or not sh.fully_replicated:
        raise Mismatch(
            with_hint(f"expected a full copy on each of {devices} devices, got {sh.describe()}", hint)
        )


def expect_close_naming_mistakes(
    got: plaindata.Value,
    want,
    mistakes: dict,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    hint: str | None = None,
) -> None:
    """Like `expect_close`; when the value is instead what a known mistake gives, the message names the mistake.

    `mistakes` maps a sentence that names a mistake (and its cure) to the value that mistake gives on
    the same inputs and devices, computed by the test. A mistake whose value equals `want` (as many do
    on one device) cannot be told apart from the right answer and is never named.
    """
    want = np.asarray(want)
    rtol, atol = precision.tolerances(rtol, atol, want, PRODUCTS.get())
    try:
        expect_close(got, want, rtol=rtol, atol=atol)
        return
    except Mismatch as wrong:
        base = str(wrong)
    arr = expect_array(got, hint=hint)
    for mistake, given in mistakes.items():
        value = np.asarray(given)
        if value.shape != arr.shape or arr.dtype.kind not in "biufc":
            continue
        if value.shape == want.shape and np.allclose(value, want, rtol=rtol, atol=atol, equal_nan=True):
            continue
        if np.allclose(arr, value, rtol=rtol, atol=atol, equal_nan=True):
            raise Mismatch(f"{base}. {mistake}")
    raise Mismatch(with_hint(base, hint))
