"""The inputs a lab's test gives a call, and how they are sent to the student's process.

An input is a plain value (an array, a number, a list of them), or one of these: `shaped` (a shape alone, never
made: a production size), `placed` (an array already sharded over the student's devices), `by_devices` (an array
sized for every pod, grown on one larger than the tests were written for), `sizes_of` (the sizes such an array
grows to, for a function that takes sizes) and `AsNumpy` (an array that arrives as numpy). `encode_input` writes
any of them as the plain data the student's process makes them from (`labkit.judge.harness`); what a test expects
is computed from `X.on(run)`, the input as the run's pod got it. `labkit.checks` exports them to lab tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from labkit.judge import plaindata


class LabRun(Protocol):
    """What an input reads of the run a test looks at (`checks.LabRun`): the kit's own count of its devices."""

    device_count: int


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


def has_shapes_only(value) -> bool:
    if isinstance(value, Shaped) or (isinstance(value, ByDevices) and isinstance(value.value, Shaped)):
        return True
    if isinstance(value, (list, tuple)):
        return any(has_shapes_only(v) for v in value)
    if isinstance(value, dict):
        return any(has_shapes_only(v) for v in value.values())
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
            return Shaped(
                plaindata.grown_shape(self.value.shape, self.grow(), run.device_count), self.value.dtype
            )
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
        return plaindata.grown_shape((self.value,), self.grow, run.device_count)[0]


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


def encode_input(value) -> dict:
    if isinstance(value, Shaped):
        return {"kind": "abstract", "shape": list(value.shape), "dtype": value.dtype}
    if isinstance(value, GrownSize):  # an int that grows with the pod in the student's process (`sizes_of`)
        return {"kind": "int", "value": int(value.value), "grow": dict(value.grow)}
    if isinstance(value, ByDevices):
        inner = (
            encode_input(value.value) if isinstance(value.value, Shaped) else plaindata.encode(value.value)
        )
        return inner | {"grow": value.grow()}
    if isinstance(value, Placed):
        enc = encode_input(value.value)
        enc["place"] = {
            "spec": [list(e) if isinstance(e, tuple) else e for e in value.spec],
            "axes": list(value.axes),
            "shape": list(value.mesh_shape) if value.mesh_shape else None,
        }
        return enc
    if isinstance(value, AsNumpy):
        inner = value.value
        enc = encode_input(inner) if isinstance(inner, ByDevices) else plaindata.encode(np.asarray(inner))
        enc["as"] = "numpy"
        return enc
    if isinstance(value, (list, tuple)):
        return {"kind": type(value).__name__, "items": [encode_input(v) for v in value]}
    if isinstance(value, dict):
        return {"kind": "dict", "items": [[str(k), encode_input(v)] for k, v in value.items()]}
    return plaindata.encode(value)
