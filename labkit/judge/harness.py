"""The last cell of every executed notebook: call the student's functions on the judge's inputs.

This runs inside the student's kernel, after the student's own cells. It reads the calls
to make, calls each function, and writes back plain data (see `plaindata`): what came back,
or what was raised. It decides nothing: the judge, in another process, compares.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import traceback

from labkit import envnames, facts
from labkit.judge import plaindata

_STUDENT_FILE_MARKERS = ("/ipykernel_", "<ipython-input", "<cell")


def _first_line(text: str, limit: int = 400, whole: int = 1500) -> str:
    """The message's first line; all of it, on one line, where the first line ends in a colon: JAX's errors
    that begin so ("... can't be statically inferred given the mesh:") give the reason and the fix after it."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return " ".join(lines)[:whole]
    return lines[0][:limit] if lines else ""


def describe_exception(exc: BaseException) -> dict:
    """The type, first line of the message, and the student's own line that raised, if any."""
    where = None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if any(m in (frame.filename or "") for m in _STUDENT_FILE_MARKERS):
            where = {"line": frame.lineno, "code": (frame.line or "").strip()[:200]}
            break
    return {"type": type(exc).__name__, "message": _first_line(exc) or "", "where": where}


def fit_mesh_shape(shape, devices: int) -> tuple[int, ...]:
    """The mesh shape a placed input asked for, on `devices` devices: None is one axis over them all; a -1
    takes the devices the other sizes leave, and each other size is kept where it divides what is left,
    else cut to the largest size that does (`(2, -1)`: 2 x 4 on eight devices, 1 x 1 on one, 1 x 3 on three)."""
    if not shape:
        return (devices,)
    if -1 not in shape:
        return tuple(shape)
    left, fitted = devices, []
    for size in shape:
        fitted.append(-1 if size == -1 else math.gcd(size, left))
        left //= 1 if size == -1 else fitted[-1]
    return tuple(left if size == -1 else size for size in fitted)


def _materialise(enc: dict):
    """An input, decoded in the student's process: arrays become JAX arrays unless asked otherwise; an
    abstract one (`callplan.for_the_student`) becomes a jax.ShapeDtypeStruct, placed as asked."""
    kind = enc.get("kind")
    if kind == "abstract":
        import jax
        import numpy as np

        shape = tuple(enc["shape"])
        if enc.get("grow") and shape:  # the shape of an input that grows with the pod (`checks.by_devices`)
            shape = plaindata.grown_shape(shape, enc["grow"], jax.device_count())
        return jax.ShapeDtypeStruct(
            shape,
            np.dtype(enc["dtype"]),
            sharding=_sharding(enc["place"]) if enc.get("place") else None,
        )
    value = plaindata.decode(enc).value
    if kind == "int" and enc.get("grow"):  # a size that grows as an axis of its length (`checks.sizes_of`)
        import jax

        return plaindata.grown_shape((int(value),), enc["grow"], jax.device_count())[0]
    if kind == "array" and enc.get("grow"):
        import jax

        value = plaindata.grown(value, enc["grow"], jax.device_count())
    if kind in ("list", "tuple"):
        items = [_materialise(v) for v in enc["items"]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _materialise(v) for k, v in enc["items"]}
    if kind == "array":
        if enc.get("as") == "numpy":
            return value
        import jax
        import jax.numpy as jnp

        placement = enc.get("place")
        if placement:
            return jax.device_put(value, _sharding(placement))
        return jnp.asarray(value)
    return value


def _sharding(placement: dict):
    """The NamedSharding a test asks an input to arrive with (`checks.placed`)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    names = tuple(placement["axes"])
    shape = fit_mesh_shape(placement.get("shape"), jax.device_count())
    # each process's devices together, in process order: a pod may list them interleaved, and
    # a mesh in that order would give a process blocks that are not contiguous
    devices = sorted(jax.devices(), key=lambda d: d.process_index)  # stable: keeps the order within one
    mesh = Mesh(np.array(devices).reshape(shape), names)
    spec = PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in placement["spec"]])
    return NamedSharding(mesh, spec)


def join_distributed() -> None:
    """Join the other processes of a multi-process run (the kit's first cell, before the student's).

    The configuration sets LABKIT_COORDINATOR, LABKIT_NUM_PROCESSES, LABKIT_PROCESS_ID,
    LABKIT_LOCAL_DEVICE_IDS and LABKIT_CPU_COLLECTIVES; without them (one process) this does nothing.
    A process that cannot join ends its kernel: a run that pretends to be one process of two
    would only produce results that look right and are not.
    """
    coordinator = os.environ.get(envnames.COORDINATOR)
    if not coordinator:
        if tpu_hosts(os.environ) > 1:
            # Every worker of a multi-host TPU slice runs this same notebook (the workshop script runs
            # it on all of them); on Cloud TPU, JAX finds the coordinator and its peers by itself.
            import jax

            jax.distributed.initialize()
        return
    import jax

    process, timeout = (
        os.environ.get(envnames.PROCESS_ID, "0"),
        float(os.environ.get(envnames.JOIN_TIMEOUT, "60")),
    )
    if process != "0" and not _reachable(coordinator, timeout):
        # JAX's client aborts the whole process when the coordinator never answers: say why first.
        print(
            f"labkit: process {process} could not join the others: nothing answered at {coordinator} "
            f"within {timeout:g} s (did process 0 start?)",
            file=sys.__stderr__,
            flush=True,
        )
        os._exit(3)
    try:
        if os.environ.get(envnames.CPU_COLLECTIVES):
            jax.config.update("jax_cpu_collectives_implementation", os.environ[envnames.CPU_COLLECTIVES])
        local = os.environ.get(envnames.LOCAL_DEVICE_IDS)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=int(os.environ[envnames.NUM_PROCESSES]),
            process_id=int(os.environ[envnames.PROCESS_ID]),
            local_device_ids=[int(i) for i in local.split(",")] if local else None,
            initialization_timeout=int(os.environ.get(envnames.JOIN_TIMEOUT, "60")),
        )
    except Exception as e:  # noqa: BLE001 - whatever stopped the join, say so and stop this process
        print(
            f"labkit: process {os.environ.get(envnames.PROCESS_ID)} could not join the others at "
            f"{coordinator}: {type(e).__name__}: {_first_line(e)}",
            file=sys.__stderr__,
            flush=True,
        )
        os._exit(3)


def leave_distributed() -> None:
    """Leave the other processes of a multi-process run together (the kit's last cell, after the harness).

    Process 0 holds JAX's coordination service; were its kernel to end while a peer still ran a cell (a
    slower process on a loaded machine), the peer's JAX client would abort that process. `jax.distributed.
    shutdown` waits for every process at a barrier first. A failure here is said, never raised: the run's
    results are written by then."""
    if not os.environ.get(envnames.COORDINATOR):
        return
    import jax

    try:
        jax.distributed.shutdown()
    except Exception as e:  # noqa: BLE001 - the results are written: say why the processes did not leave together
        print(
            f"labkit: process {os.environ.get(envnames.PROCESS_ID)} could not leave the others together: "
            f"{type(e).__name__}: {_first_line(e)}",
            file=sys.__stderr__,
            flush=True,
        )


def tpu_hosts(env) -> int:
    """How many hosts a `tpu` run spans: LABKIT_TPU_HOSTS, which the workshop script sets on a slice."""
    if env.get("JAX_PLATFORMS") != "tpu":
        return 1
    try:
        return max(1, int(env.get(envnames.TPU_HOSTS) or 1))
    except ValueError:
        return 1


def _reachable(address: str, timeout: float) -> bool:
    """True once something accepts TCP connections at host:port, trying for up to `timeout` seconds."""
    import socket
    import time

    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


class _Tee(io.TextIOBase):
    """Writes to the notebook's stdout and keeps a copy (what one call printed)."""

    def __init__(self, out, limit: int = 4000):
        self.out, self.limit, self.kept = out, limit, []
        self.size = 0

    def write(self, text):
        if self.size < self.limit:
            self.kept.append(text[: self.limit - self.size])
            self.size += len(self.kept[-1])
        return self.out.write(text)

    def flush(self):
        self.out.flush()


def environment() -> dict:
    try:
        import jax

        devices = jax.devices()
        return {
            "jax_version": jax.__version__,
            "backend": jax.default_backend(),
            "device_count": jax.device_count(),
            "local_device_count": jax.local_device_count(),
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "device_kind": devices[0].device_kind if devices else "",
            # what float32 matrix products were asked to be (None: the backend's default); see labkit.judge.precision
            "matmul_precision": jax.config.jax_default_matmul_precision,
        }
    except Exception as e:  # noqa: BLE001 - JAX could not start: say so, the judge reports it
        return {"error": describe_exception(e)}


def call_one(namespace: dict, call: dict, settle=None) -> dict:
    """Call one student function as `call` says; the record says what came back or what was raised.

    `settle`, when given, runs after the student's function returns and before its value is
    encoded (the sealed harness puts back whatever the function patched).
    """
    name = call["function"]
    record = {"id": call["id"]}
    fn = namespace.get(name)
    if fn is None:
        record["error"] = {"type": "Missing", "message": f"`{name}` is not defined", "where": None}
        return record
    if not callable(fn):
        record["error"] = {
            "type": "NotCallable",
            "message": f"`{name}` is a {type(fn).__name__}, not a function",
            "where": None,
        }
        return record
    printed = _Tee(sys.stdout)
    traced = False
    try:
        args = [_materialise(a) for a in call.get("args", [])]
        kwargs = {k: _materialise(v) for k, v in call.get("kwargs", {}).items()}
        traced = _abstract(args, kwargs)
        if traced:  # a call the kit runs itself: here it is only traced and exported
            with contextlib.redirect_stdout(printed):
                record["program"] = facts.export(fn, args, kwargs, settle, raising=True)
            record["stdout"] = "".join(printed.kept)
            return record
        with contextlib.redirect_stdout(printed):
            out = fn(*args, **kwargs)
        if settle is not None:
            settle()
        try:
            import jax

            out = jax.block_until_ready(out)
        except Exception:  # noqa: BLE001 - the student's value may fail anyhow; encode says what it is
            pass
        record["value"] = plaindata.encode(out)
    except Exception as e:  # noqa: BLE001 - the student's code may raise anything
        record["error"] = describe_exception(e)
        if traced and type(e).__name__ in _NEEDS_VALUES:
            record["error"]["message"] = (
                f"a test examines this function's compiled program, so it runs under "
                f"jax.jit, where its inputs have no values yet: {record['error']['message']}"
            )
    else:
        if call.get("facts"):
            record["facts"] = examine(fn, args, kwargs, settle)
        if call.get("verify") and _one_process():
            record["program"] = facts.export(
                fn, args, kwargs, settle
            )  # the kit runs it itself: labkit.judge.verify
    record["stdout"] = "".join(printed.kept)  # what the call printed in this process
    return record


# What JAX raises when Python code asks a traced array for a value (`if x.sum() > 0`, `np.asarray(x)`).
_NEEDS_VALUES = {
    "ConcretizationTypeError",
    "TracerArrayConversionError",
    "TracerBoolConversionError",
    "TracerIntegerConversionError",
}


def _abstract(args, kwargs) -> bool:
    """Does the call carry inputs as shapes only (`callplan.for_the_student`)?"""
    stack = [*args, *kwargs.values()]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif type(v).__name__ == "ShapeDtypeStruct":
            return True
    return False


def _one_process() -> bool:
    try:
        import jax

        return jax.process_count() == 1
    except Exception:  # noqa: BLE001 - JAX could not say: no program is sent, the kit judges the call unverified
        return False


def examine(fn, args, kwargs, settle=None) -> dict:
    """The facts of the compiled program behind the call (see `facts`), asked for by the judge's call."""
    import time

    started = time.perf_counter()
    try:
        found = facts.gather(fn, args, kwargs, settle)
        found["seconds"] = round(time.perf_counter() - started, 4)  # what examining this call cost
        return found
    except Exception as e:  # noqa: BLE001 - whatever stopped it, the facts are missing, not wrong
        if settle is not None:
            settle()
        return {
            "unavailable": f"the compiled program could not be examined: {type(e).__name__}: {_first_line(e)}"
        }


def run(namespace: dict, calls_path: str, results_path: str) -> None:
    """The harness cell. In a run the kit made, the harness sealed at kernel start does the work."""
    if _SEALED is not None:
        _SEALED(namespace)
        return
    with open(calls_path) as f:
        calls = json.load(f)["calls"]
    results = [call_one(namespace, call) for call in calls]
    payload = {"environment": environment(), "results": results}
    with open(results_path, "w") as f:
        json.dump(payload, f)
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------
# The sealed harness: bound when the kernel starts, before any of the student's cells.
# ----------------------------------------------------------------------------------------

_SEALED = None
_MISSING = object()
# Modules whose attributes the harness relies on: a patch made by the student's cells is undone
# before every value is encoded. Classes likewise (a property of jax.Array patched to lie).
_GUARDED_MODULES = (
    "builtins",
    "json",
    "math",
    "io",
    "contextlib",
    "traceback",
    "hmac",
    "hashlib",
    "numpy",
    "base64",
    "jax",
    "jax.numpy",
    "jax.sharding",
    "jax.export",
    "jax.experimental.multihost_utils",
    "jax.stages",
    "labkit",
    "labkit.judge",
    "labkit.judge.plaindata",
    "labkit.facts",
    "labkit.judge.harness",
)


class _World:
    """What the harness relies on, as it was when the kernel started; `restore()` puts it back."""

    def __init__(self, modules, classes):
        self.modules = {
            name: (sys.modules[name], dict(vars(sys.modules[name])))
            for name in modules
            if name in sys.modules
        }
        self.classes = {}
        for cls in classes:
            self.classes[cls] = dict(vars(cls))

    def restore(self) -> None:
        for name, (module, saved) in self.modules.items():
            sys.modules[name] = module
            d = vars(module)
            for k, v in saved.items():
                if d.get(k, _MISSING) is not v:
                    d[k] = v
        for cls, saved in self.classes.items():
            now = dict(vars(cls))
            for k, v in saved.items():
                if now.get(k, _MISSING) is not v:
                    with contextlib.suppress(AttributeError, TypeError):
                        setattr(cls, k, v)
            for k in now.keys() - saved.keys():
                with contextlib.suppress(AttributeError, TypeError):
                    delattr(cls, k)


def _guarded_classes(array_classes) -> list:
    import jax
    import jax.sharding
    import jax.stages

    # JAX's array classes (every subclass of jax.Array so far: JAX's own) and its shard class, through
    # public API and without starting a backend (a multi-process run joins the others after this)
    classes = [*sorted(array_classes, key=lambda c: (c.__module__, c.__qualname__)), jax.Shard, jax.Device]
    classes += [v for v in vars(jax.sharding).values() if isinstance(v, type)]
    classes += [v for v in vars(jax.stages).values() if isinstance(v, type)]  # how facts are read
    return list(dict.fromkeys(classes))


def cap_streams(limit: int) -> None:
    """Send at most `limit` characters of what the cells print (stdout and stderr together); a note marks the cut.

    The friendly half of the output limit: the kernel cuts what it sends. The process running
    papermill also refuses any message much larger than the limit, whatever the cells do to this.
    The cut is made where ipykernel's streams hand their buffered text to the kernel's messages
    (IPython wraps and restores the streams' `write` around every cell, so `write` is no place for it).
    """
    stream_class = type(sys.stdout)
    original = getattr(stream_class, "_flush_buffers", None)
    if original is None:  # not an ipykernel stream: what is printed goes to the run's log, which is cut
        return
    state = {"left": limit, "noted": False}
    note = f"\n[labkit: output cut here: the run's outputs passed {limit} characters]\n"

    def _flush_buffers(self):
        for parent, chunk in original(self):
            data = chunk
            if len(data) > state["left"]:
                data, state["left"] = data[: state["left"]], 0
                if not state["noted"]:
                    state["noted"] = True
                    data += note
            else:
                state["left"] -= len(data)
            if data:
                yield parent, data

    stream_class._flush_buffers = _flush_buffers


def seal(key_file: str) -> None:
    """Kernel start-up, before the student's cells: bind the harness to the run's calls, paths and key.

    `key_file` (JSON: key, calls, results) is read and removed. The sealed harness writes
    results with an HMAC under the run's key, which only it holds in this kernel: a results
    file written by anything else (a cell, a process left behind) is refused by the kit.
    Before encoding each value it puts back every module attribute and class attribute the
    harness relies on, so patches made by the student's cells cannot change what is reported.
    """
    global _SEALED
    import hashlib
    import hmac
    import importlib

    # imported now, before the student's cells, so that the modules and classes kept are the real ones
    for name in (
        "numpy",
        "base64",
        "jax",
        "jax.numpy",
        "jax.sharding",
        "jax.stages",
        "jax.export",
        "jax.experimental.multihost_utils",
    ):
        importlib.import_module(name)
    # JAX's array classes, kept now; the modules that define them are guarded too (found by the classes,
    # not by private names)
    array_classes = plaindata.seal_array_classes()
    guarded = (*_GUARDED_MODULES, *sorted({c.__module__ for c in array_classes}))

    with open(key_file) as f:
        spec = json.load(f)
    os.unlink(key_file)
    key = spec["key"].encode()
    results_path = spec["results"]
    with open(spec["calls"]) as f:
        calls = json.load(f)["calls"]
    json_dumps, hmac_new, sha256, opener, dump_one = json.dumps, hmac.new, hashlib.sha256, open, call_one
    environment_of = environment

    def sealed(namespace: dict) -> None:
        world.restore()
        results = [dump_one(namespace, call, settle=world.restore) for call in calls]
        world.restore()
        payload = {"environment": environment_of(), "results": results}
        text = json_dumps(payload, sort_keys=True, separators=(",", ":"))
        mac = hmac_new(key, text.encode(), sha256).hexdigest()
        with opener(results_path, "w") as f:
            f.write(json_dumps({"payload": text, "mac": mac}))
        sys.stdout.flush()

    _SEALED = sealed
    world = _World(guarded, _guarded_classes(array_classes))
    if spec.get("output"):
        cap_streams(int(spec["output"]))
