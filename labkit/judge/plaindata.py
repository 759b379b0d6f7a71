"""Values that cross the boundary between a student's process and the judge, as plain JSON.

The student's process encodes what its functions returned: numbers, strings, arrays as
their little-endian bytes in base64 with their dtype and shape (read back with a fixed dtype from
`_WIRE`, never as an object), and, for JAX arrays, which devices hold which shard. The kit's own
inputs cross the other way in the same form. A list of numbers (`"data"`), the form before, is still
read. The judge decodes that into `Value` objects. A call can also carry the facts of its compiled
program (see `facts`), decoded here into `Compiled`. Nothing is pickled, so no object from
the student's process can run code in the judge or claim to equal anything.
"""

from __future__ import annotations

import base64
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# An array larger than this is not carried across; the judge sees it as too large.
MAX_ELEMENTS = 2_000_000
# The largest pod the tests' arrays are written for (`checks.by_devices`): as written on 1 to 32 devices.
WRITTEN_FOR_DEVICES = 32
# The dtypes an array crosses in, each as the little-endian bytes of its wire dtype (bfloat16 as float32, as
# the judge reads it). Bytes, not a list of numbers: writing, hashing (`checks.Call.id`) and reading a
# million floats as JSON numbers took a second or more each, for every run of labs 12-14.
_WIRE = {
    **{t: t for t in ("float16", "float32", "float64", "complex64", "complex128", "bool")},
    **{f"{s}int{b}": f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)},
    "bfloat16": "float32",
}


def copies_for(rows: int, devices: int, per_device: int = 1, pieces: int = 0) -> int:
    """How many copies of a test's input of `rows` rows a run on `devices` devices gets (`checks.by_devices`):
    one where the devices are no more than the rows and the rows divide over them, else the fewest whose rows
    divide over every device, `per_device` rows or a multiple of them to each where the devices outnumber the rows
    (32 rows: once on 1 to 32 devices, 8 times on 256; with per_device=2, 16 times on 256; 384 rows: once on 1 to
    128 devices, twice on 256, where 384 would not split). With `pieces` k, each device's rows are cut again into k
    pieces a device: one where k x devices x devices are no more than the rows, else the fewest whose rows give
    each device a multiple of k x devices (and of `per_device`) (1024 rows, k = 1: once on 1 to 32 devices, 64
    times on 256)."""
    least = devices * devices * int(pieces) if pieces else devices
    if rows < 1 or devices < 1:
        return 1
    if least <= rows:
        # enough rows: as written where they divide over the devices (every test's input on 1 to 32), else the
        # fewest copies whose rows do, so that a design that splits them over every device can run at all
        return 1 if pieces or rows % devices == 0 else devices // math.gcd(rows, devices)
    each = max(1, int(per_device))
    wanted = devices * (math.lcm(each, int(pieces) * devices) if pieces else each)
    return wanted // math.gcd(rows, wanted)


def axes_of(axis) -> tuple[int, ...]:
    """The axes an input grows along (`checks.by_devices`), from an int or a list of them."""
    return tuple(int(a) for a in axis) if isinstance(axis, (list, tuple)) else (int(axis),)


def copies_along(shape: tuple[int, ...], grow: dict, devices: int) -> dict[int, int]:
    """How many copies along each axis a test's input of `shape` gets on `devices` devices, as its encoding's
    `grow` says (`checks.by_devices`): `per_device` rows a device for the first axis it names, one for the rest;
    with `grid_rows` k, over the n / k devices of one row of a k x n/k grid (as `placed`'s `mesh_shape=(k, -1)`
    fits it: 1 x n where k does not divide n) rather than over every device; with `pieces`, the first axis named
    is cut again on each device into that many pieces a device (`copies_for`)."""
    per_device, pieces = int(grow.get("per_device", 1)), int(grow.get("pieces", 0))
    over = devices // math.gcd(int(grow.get("grid_rows", 1)), devices) if devices > 0 else devices
    copies = {}
    for i, a in enumerate(axes_of(grow.get("axis", 0))):
        first = i == 0
        copies[a] = copies_for(
            shape[a] if len(shape) > a else 0, over, per_device if first else 1, pieces if first else 0
        )
        if first and grow.get("widen") and devices > WRITTEN_FOR_DEVICES and len(shape) > a and shape[a] >= 1:
            # `widen`: per_device rows a device on any pod past 32 devices, even one no wider than the axis
            wanted = over * per_device
            copies[a] = max(copies[a], wanted // math.gcd(shape[a], wanted))
    return copies


def grown_shape(shape: tuple[int, ...], grow: dict, devices: int) -> tuple[int, ...]:
    """The shape a test's input of `shape` has on `devices` devices (`grown`'s, for an input given by its shape
    alone or a size that grows as an axis of its length: `checks.shaped`, `checks.sizes_of`)."""
    grew = list(shape)
    for a, copies in copies_along(tuple(shape), grow, devices).items():
        if a < len(grew):
            grew[a] *= copies
    return tuple(grew)


def grown(value: np.ndarray, grow: dict, devices: int) -> np.ndarray:
    """A test's input as a run on `devices` devices gets it (`checks.by_devices`, `grow` its encoding's): the
    array as written, then each further copy of it along the axis (its rows unless said) shifted by `shift` more
    than the last, so that no two devices' blocks are alike. Along several axes, each in turn, the later axes'
    copies shifted past every earlier copy."""
    value = np.asarray(value)
    shift = float(grow["shift"])
    for a, copies in copies_along(value.shape, grow, devices).items():
        if copies > 1:
            value = np.concatenate(
                [value + np.asarray(k * shift, value.dtype) for k in range(copies)], axis=a
            )
            shift *= copies
    return value


# ----------------------------------------------------------------------------------------
# Encoding: runs in the student's process, for inputs in the judge too.
# ----------------------------------------------------------------------------------------


def _number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}  # nan, inf, -inf
    return v


def _array_payload(arr: np.ndarray) -> dict:
    if arr.size > MAX_ELEMENTS:
        return {"kind": "too-large", "shape": list(arr.shape), "dtype": str(arr.dtype)}
    dtype = arr.dtype.name
    wire = _WIRE.get(dtype)
    if wire is None:
        return {"kind": "object", "type": f"array of {dtype}", "repr": repr(arr)[:300]}
    raw = np.ascontiguousarray(arr, dtype=np.dtype(wire).newbyteorder("<")).tobytes()
    return {
        "kind": "array",
        "dtype": dtype,
        "shape": list(arr.shape),
        "bytes": base64.b64encode(raw).decode(),
    }


def _spec_entry(e):
    if e is None or isinstance(e, str):
        return e
    return [str(a) for a in e]


def sharding_of(x) -> dict | None:
    """Where a JAX array lives: its devices, shards and, for a NamedSharding, mesh and spec."""
    s = getattr(x, "sharding", None)
    if s is None or not hasattr(s, "device_set"):
        return None
    info: dict[str, Any] = {
        "type": type(s).__name__,
        "device_ids": sorted(int(d.id) for d in s.device_set),
        "fully_replicated": bool(s.is_fully_replicated),
        "fully_addressable": bool(s.is_fully_addressable),
    }
    mesh = getattr(s, "mesh", None)
    spec = getattr(s, "spec", None)
    if mesh is not None and spec is not None:
        info["mesh"] = {str(k): int(v) for k, v in mesh.shape.items()}
        info["spec"] = [_spec_entry(e) for e in spec]
    shards = []
    for sh in getattr(x, "addressable_shards", []):
        shards.append(
            {
                "device": int(sh.device.id),
                "index": _index(sh.index, x.shape),
                "replica_id": int(sh.replica_id),
                "process": int(sh.device.process_index),
            }
        )
    if not s.is_fully_addressable:
        # Several processes hold the array: this process sees only its own shards, but the sharding
        # knows every device's block, and which process that device belongs to.
        shards, seen = [], {}
        for device, index in s.devices_indices_map(tuple(x.shape)).items():
            block = _index(index, x.shape)
            replica = seen.setdefault(str(block), 0)
            seen[str(block)] += 1
            shards.append(
                {
                    "device": int(device.id),
                    "index": block,
                    "replica_id": replica,
                    "process": int(device.process_index),
                }
            )
        shards.sort(key=lambda sh: (sh["process"], sh["device"]))
    info["shards"] = shards
    info["processes"] = sorted({sh["process"] for sh in shards})
    return info


def _index(index, shape) -> list[list[int]]:
    out = []
    for sl, dim in zip(index, shape):
        start, stop, _ = sl.indices(dim)
        out.append([start, stop])
    return out


def _host_value(x) -> np.ndarray:
    """The whole value of a JAX array, in this process.

    An array spread over several processes cannot be read from one of them: every process
    gathers it (a collective: the harness encodes the same values in the same order everywhere).
    """
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def encode(value, depth: int = 0) -> dict:
    """Encode a value as plain JSON-able data. Never raises for odd values: they become "object"."""
    if depth > 20:
        return {"kind": "object", "type": "nested too deeply", "repr": ""}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, (bool, np.bool_)):
        return {"kind": "bool", "value": bool(value)}
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return {"kind": "int", "value": int(value)}
    if isinstance(value, (float, np.floating)) and type(value).__module__ in ("builtins", "numpy"):
        return {"kind": "float", "value": _number(float(value))}
    if isinstance(value, str):
        return {"kind": "str", "value": value[:100_000]}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return {"kind": type(value).__name__, "items": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict) and type(value) is dict:
        return {"kind": "dict", "items": [[str(k), encode(v, depth + 1)] for k, v in value.items()]}
    if type(value) is np.ndarray:
        return _array_payload(value)
    if _is_jax_array(value):
        try:
            payload = _array_payload(_host_value(value))
        except Exception as e:  # noqa: BLE001 - e.g. a value the backend cannot fetch
            payload = {"kind": "object", "type": "jax.Array", "repr": f"could not read values: {e}"[:300]}
        payload["jax"] = True
        payload["sharding"] = sharding_of(value)
        return payload
    return {"kind": "object", "type": type(value).__name__, "repr": _safe_repr(value)}


# JAX's concrete array class, once known, and the classes that subclassed `jax.Array` when the harness
# was sealed (before the student's cells). Module attributes, so the harness's guard puts them back.
_ARRAY_TYPE = None
_SEALED_ARRAY_CLASSES: frozenset = frozenset()


def jax_array_classes() -> frozenset:
    """Every class that subclasses `jax.Array` now, found through public API and without starting a
    backend (a multi-process run must join the others first). Called before the student's cells,
    these are JAX's own."""
    import jax

    seen, todo = set(), [jax.Array]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return frozenset(seen)


def seal_array_classes() -> frozenset:
    """Keep the classes `jax_array_classes` finds now: later, only an array of one of them is JAX's."""
    global _SEALED_ARRAY_CLASSES
    _SEALED_ARRAY_CLASSES = jax_array_classes()
    return _SEALED_ARRAY_CLASSES


def array_type() -> type:
    """JAX's concrete array class: the type of an array JAX made (public API; starts the backend)."""
    global _ARRAY_TYPE
    if _ARRAY_TYPE is None:
        import jax

        _ARRAY_TYPE = type(jax.device_put(0))
    return _ARRAY_TYPE


def _is_jax_array(value) -> bool:
    """Only JAX's own array type: an object that subclasses or registers as `jax.Array` is not one.

    A process that never imported JAX holds no JAX array, and a value that is no `jax.Array` at all is
    not one either: neither starts a backend to find out. The judge encodes the tests' inputs with this
    function, and a backend started there (libtpu on a TPU VM) would hold the chips the kernel needs."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    try:
        kind = type(value)
        if not issubclass(kind, jax.Array):
            return False
        return kind is array_type() and (not _SEALED_ARRAY_CLASSES or kind in _SEALED_ARRAY_CLASSES)
    except Exception:  # noqa: BLE001 - a hostile value's type() may raise anything: not an array
        return False


def _safe_repr(value) -> str:
    try:
        return repr(value)[:300]
    except Exception:  # noqa: BLE001 - the student's __repr__ may raise anything
        return "<unprintable>"


# ----------------------------------------------------------------------------------------
# Decoding: runs in the judge.
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sharding:
    """Where an array lived in the student's process."""

    type: str
    device_ids: tuple[int, ...]
    fully_replicated: bool
    fully_addressable: bool
    mesh: dict[str, int] | None
    spec: tuple | None
    shards: tuple[dict, ...]
    processes: tuple[int, ...] = (0,)  # the JAX processes whose devices hold a shard

    @property
    def num_devices(self) -> int:
        return len(self.device_ids)

    def describe(self) -> str:
        where = f"{self.num_devices} device{'s' if self.num_devices != 1 else ''}"
        if len(self.processes) > 1:
            where += f" of {len(self.processes)} processes"
        if self.spec is not None:
            spec = ", ".join(repr(e) if not isinstance(e, list) else repr(tuple(e)) for e in self.spec)
            mesh = ", ".join(f"'{k}': {v}" for k, v in (self.mesh or {}).items())
            return f"{self.type}(mesh={{{mesh}}}, spec=P({spec})) on {where}"
        return f"{self.type} on {where}"


@dataclass(frozen=True)
class Value:
    """A decoded value: `.value` is a Python or numpy value; arrays also carry shape, dtype and sharding."""

    kind: str
    value: Any = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    sharding: Sharding | None = None
    is_jax: bool = False
    description: str = field(default="")
    compiled: Any = None  # Compiled | Unavailable: the facts of the call's compiled program, when asked for

    def __repr__(self) -> str:
        if self.kind == "array":
            return f"Value({self.value!r}, dtype={self.dtype}, shape={self.shape})"
        return f"Value({self.kind}: {self.description or self.value!r})"


def _unnumber(v):
    if isinstance(v, dict) and "float" in v:
        return float(v["float"])
    return v


def _decode_array(data: dict) -> np.ndarray:
    dtype = data["dtype"]
    shape = tuple(int(s) for s in data["shape"])
    if min(shape, default=0) < 0 or math.prod(shape) > MAX_ELEMENTS:
        raise ValueError(f"not a shape an array may carry: {shape}")
    if "bytes" in data:
        wire = np.dtype(_WIRE[dtype]).newbyteorder("<")
        arr = np.frombuffer(base64.b64decode(data["bytes"], validate=True), dtype=wire)
        return arr.astype(wire.newbyteorder("="), copy=True).reshape(shape)
    flat = data["data"]
    if dtype.startswith("complex"):
        arr = np.array([complex(_unnumber(a), _unnumber(b)) for a, b in flat], dtype=dtype)
    else:
        np_dtype = "float32" if dtype == "bfloat16" else dtype
        arr = np.array([_unnumber(v) for v in flat], dtype=np_dtype)
    return arr.reshape(shape)


def decode(data: dict) -> Value:
    if not isinstance(data, dict):
        return Value("object", description="malformed value")
    kind = data.get("kind")
    if kind == "none":
        return Value("none", None)
    if kind in ("bool", "int", "str"):
        return Value(kind, {"bool": bool, "int": int, "str": str}[kind](data["value"]))
    if kind == "float":
        return Value("float", float(_unnumber(data["value"])))
    if kind in ("list", "tuple"):
        items = tuple(decode(v) for v in data.get("items", []))
        return Value(kind, list(items) if kind == "list" else items)
    if kind == "dict":
        return Value("dict", {str(k): decode(v) for k, v in data.get("items", [])})
    if kind == "array":
        sh = data.get("sharding")
        sharding = None
        if sh:
            sharding = Sharding(
                type=str(sh.get("type")),
                device_ids=tuple(int(i) for i in sh.get("device_ids", [])),
                fully_replicated=bool(sh.get("fully_replicated")),
                fully_addressable=bool(sh.get("fully_addressable", True)),
                mesh=sh.get("mesh"),
                spec=tuple(sh["spec"]) if sh.get("spec") is not None else None,
                shards=tuple(sh.get("shards", [])),
                processes=tuple(int(p) for p in sh.get("processes", [0])),
            )
        try:
            array = _decode_array(data)
        except (KeyError, ValueError, TypeError):  # binascii.Error is a ValueError
            return Value("object", description="a malformed array")
        return Value(
            "array",
            array,
            dtype=data["dtype"],
            shape=tuple(int(s) for s in data["shape"]),
            sharding=sharding,
            is_jax=bool(data.get("jax")),
        )
    if kind == "too-large":
        return Value(
            "too-large",
            dtype=data.get("dtype"),
            shape=tuple(data.get("shape", ())),
            description=f"an array of shape {tuple(data.get('shape', ()))}, too large to check",
        )
    return Value("object", description=f"a {data.get('type', 'value')}: {data.get('repr', '')}"[:300])


# ----------------------------------------------------------------------------------------
# Facts of the compiled program behind a call (see `facts`), decoded in the judge.
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unavailable:
    """A fact the student's process could not give, and why."""

    why: str


@dataclass(frozen=True)
class Collective:
    op: str  # all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all
    shape: str
    groups: tuple[tuple[int, ...], ...] = ()  # devices that take part together (not for collective-permute)
    pairs: tuple[tuple[int, int], ...] = ()  # (source, destination), for collective-permute

    @property
    def widest(self) -> int:
        """How many devices the largest group joins (for a collective-permute: how many send)."""
        if self.pairs:
            return len({a for a, _ in self.pairs})
        return max((len(g) for g in self.groups), default=0)


@dataclass(frozen=True)
class Placement:
    """One input or output of the compiled program: its bytes, and what one device holds of it."""

    path: str  # args[1], args[0]['w'], out[0]...
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    device_bytes: int | Unavailable
    replicated: bool = False
    pieces: int = 1


@dataclass(frozen=True)
class Compiled:
    """What the compiled program of one call does; any field may be `Unavailable`, saying why."""

    devices: int
    collectives: tuple[Collective, ...] | Unavailable
    memory: dict | Unavailable  # per device: argument, output, temp, alias bytes
    flops: float | Unavailable
    inputs: tuple[Placement, ...] | Unavailable
    outputs: tuple[Placement, ...] | Unavailable
    top_level: tuple[str, ...] = ()
    # The collectives the program asks for itself (None: not read, as in a student's own `check`), and the
    # chip it was compiled for (None: the configuration's own backend).
    written: tuple[str, ...] | None = None
    compiled_for: str | None = None
    # (kind, dimensions) of each array a reduce-scatter, all-gather or all-reduce the program writes moves
    written_sizes: tuple[tuple[str, tuple[int, ...]], ...] | None = None


def _maybe(data, build):
    if isinstance(data, dict) and "unavailable" in data:
        return Unavailable(str(data["unavailable"]))
    try:
        return build(data)
    except Exception as e:  # noqa: BLE001 - malformed facts are missing facts
        return Unavailable(f"malformed fact ({type(e).__name__})")


def _placement(d: dict) -> Placement:
    device_bytes = Unavailable(str(d["unavailable"])) if "unavailable" in d else int(d["device_bytes"])
    return Placement(
        str(d["path"]),
        tuple(int(s) for s in d["shape"]),
        str(d["dtype"]),
        int(d["bytes"]),
        device_bytes,
        bool(d.get("replicated", False)),
        int(d.get("pieces", 1)),
    )


def _collective(d: dict) -> Collective:
    return Collective(
        str(d["op"]),
        str(d.get("shape", "")),
        tuple(tuple(int(i) for i in g) for g in d.get("groups", [])),
        tuple((int(a), int(b)) for a, b in d.get("pairs", [])),
    )


def decode_compiled(data) -> Compiled | Unavailable:
    """The facts a call's record carries, or `Unavailable` (the record says why, or nothing came)."""
    if data is None:
        return Unavailable("no facts of the compiled program came back for this call")
    if not isinstance(data, dict) or "unavailable" in data:
        return Unavailable(str(data.get("unavailable") if isinstance(data, dict) else "malformed facts"))
    return Compiled(
        devices=int(data.get("devices") or 1),
        collectives=_maybe(data.get("collectives"), lambda v: tuple(_collective(c) for c in v)),
        memory=_maybe(data.get("memory"), lambda v: {str(k): int(n) for k, n in v.items()}),
        flops=_maybe(data.get("flops"), float),
        inputs=_maybe(data.get("inputs"), lambda v: tuple(_placement(p) for p in v)),
        outputs=_maybe(data.get("outputs"), lambda v: tuple(_placement(p) for p in v)),
        top_level=tuple(str(p) for p in data.get("top_level", [])),
        written=tuple(str(w) for w in data["written"]) if isinstance(data.get("written"), list) else None,
        compiled_for=str(data["compiled_for"]) if data.get("compiled_for") else None,
        written_sizes=_written_sizes(data.get("written_sizes")),
    )


def _written_sizes(data) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    if not isinstance(data, list):
        return None
    try:
        return tuple((str(w[0]), tuple(int(d) for d in w[1:])) for w in data)
    except (TypeError, ValueError, IndexError):
        return None
