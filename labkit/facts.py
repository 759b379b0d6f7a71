"""Facts about the compiled program behind one exercise call, gathered in the student's process as plain data.

Values and output placement cannot tell a parallel solution from one that copies everything to
every device; the compiled program can. After the student's function has returned (and its value
has been encoded), the harness traces the same function again under `jax.jit`, on the same inputs'
shapes, dtypes and placements, compiles it, and reads:

* `collectives`: every all-reduce, all-gather, reduce-scatter, collective-permute and all-to-all of
  the optimised HLO, with its replica groups (or, for a collective-permute, its source-target pairs);
* `memory`: per-device bytes of arguments, outputs and temporaries (`compiled.memory_analysis()`);
* `flops`: what one device computes (`compiled.cost_analysis()`);
* `timeline`: one device's steps in the program's schedule order (`labkit.judge.timeline`), for its picture;
* `inputs` / `outputs`: for each array, its global bytes and the bytes one device holds under the
  sharding the compiled program gave it;
* `top_level`: the primitives of the traced program outside any inner `jax.jit` (an exercise about
  jit shows there whether the work ran op by op).

An eager `shard_map` or a loop of jitted steps is traced into one program: its facts describe the
whole call. An array the function makes from host data (`jax.make_array_from_process_local_data`,
`jax.make_array_from_callback`, `jax.device_put` of a numpy array to a mesh) becomes an input of the
traced program, placed as it was made (named `made[k]`): traced as a constant, it would be folded
away on one process and refused on several (jit cannot close over an array of other processes). The student's Python runs a second time (not its computations); what it prints then is
dropped. A fact the backend does not give is `{"unavailable": why}`, and so is the whole record when
the function cannot be traced: the judge then fails the checks that need it, never passes them.
"""

from __future__ import annotations

import contextlib
import io

from labkit import envnames
from labkit.judge import hlo, timeline
from labkit.judge.hlo import COLLECTIVES, collectives_in, parse_groups  # noqa: F401 - read by the tests and checks


def _first_line(text) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _unavailable(what: str, exc: BaseException | None = None) -> dict:
    why = f"{what}: {type(exc).__name__}: {_first_line(exc)}" if exc is not None else what
    return {"unavailable": why[:400]}


# ----------------------------------------------------------------------------------------
# Tracing and compiling the call again (needs JAX).
# ----------------------------------------------------------------------------------------

_MESH_SETTERS = (("jax", "set_mesh"), ("jax.sharding", "set_mesh"), ("jax.sharding", "use_mesh"))


_MAKERS = (
    "make_array_from_process_local_data",
    "make_array_from_callback",
    "make_array_from_single_device_arrays",
)


class _Made:
    """Arrays made from host data while tracing: recorded on a first trace, inputs of the next.

    `record` is a list of ShapeDtypeStructs (the first trace calls the real maker and notes what it
    made); with `given` (the traced inputs that stand for them) each maker returns the next one.
    """

    def __init__(self, given=None):
        self.record: list = []
        self.given = list(given) if given is not None else None
        self.inside = 0  # a maker may call another (device_put): only the outermost counts

    def next_given(self):
        """The traced input that stands for the next array made, or None on the first trace."""
        if self.given is None or len(self.record) >= len(self.given):
            return None
        self.record.append(None)
        return self.given[len(self.record) - 1]

    def make(self, original, *args, **kwargs):
        """`original(*args, **kwargs)`, recorded; on a second trace, the input that stands for it."""
        import jax

        if self.inside:
            return original(*args, **kwargs)
        stand_in = self.next_given()
        if stand_in is not None:
            return stand_in
        self.inside += 1
        try:
            array = original(*args, **kwargs)
        finally:
            self.inside -= 1
        # Inside jit a maker may give a tracer: its placement is the sharding it was asked for.
        asked = [a for a in (*args, *kwargs.values()) if isinstance(a, jax.sharding.Sharding)]
        sharding = asked[0] if asked else getattr(array, "sharding", None)
        self.record.append(jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=sharding))
        return array

    def maker(self, original):
        return lambda *args, **kwargs: self.make(original, *args, **kwargs)


def _placing(original, explicit_puts: dict | None = None, made: _Made | None = None):
    """`jax.device_put` for the trace: what it does eagerly, placing an array, becomes a sharding constraint.

    Under jit, a device_put to an Auto mesh's NamedSharding is dropped when lowering; in the student's
    eager call it moved the data, and that placement is what the later computation ran on.
    """
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding

    def device_put(x, device=None, *args, **kwargs):
        leaves = jax.tree_util.tree_leaves(x)
        if (
            isinstance(device, NamedSharding)
            and not args
            and not kwargs
            and leaves
            and all(isinstance(v, jax.core.Tracer) for v in leaves)
            and all(t == AxisType.Auto for t in getattr(device.mesh, "axis_types", ()))
        ):
            return jax.tree_util.tree_map(lambda v: jax.lax.with_sharding_constraint(v, device), x)
        if explicit_puts is not None and isinstance(device, NamedSharding) and not args and not kwargs:
            for v in leaves:  # an Explicit mesh: `_trace` gives an input placed so its own placement
                explicit_puts[id(v)] = device
        if (
            made is not None
            and isinstance(device, NamedSharding)
            and not args
            and not kwargs
            and isinstance(x, np.ndarray)
        ):
            return made.make(original, x, device)
        return original(x, device, *args, **kwargs)

    return device_put


def _resharding(original, explicit_puts: dict | None):
    """`jax.reshard` for the trace: an input it moves to an Explicit mesh is traced as placed there."""
    import jax
    from jax.sharding import NamedSharding

    def reshard(x, sharding, *args, **kwargs):
        if explicit_puts is not None and isinstance(sharding, NamedSharding):
            for v in jax.tree_util.tree_leaves(x):
                explicit_puts[id(v)] = sharding
        return original(x, sharding, *args, **kwargs)

    return reshard


@contextlib.contextmanager
def _traceable(seen: list, explicit_puts: dict | None = None, made: _Made | None = None):
    """While tracing: `jax.set_mesh(mesh)` only records its mesh (it cannot be entered inside jit), and so
    does `jax.make_mesh` for an Explicit mesh; `jax.device_put` to a mesh constrains the array's sharding
    instead (and, with `jax.reshard`, notes where an input goes), and an array made from host data goes
    through `made`."""
    import importlib

    import jax

    @contextlib.contextmanager
    def record(mesh, *args, **kwargs):
        seen.append(mesh)
        yield mesh

    def making_mesh(original):
        def make_mesh(
            *args, **kwargs
        ):  # an Explicit mesh made inside the function is the one jit must run in
            mesh = original(*args, **kwargs)
            if any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
                seen.append(mesh)
            return mesh

        return make_mesh

    saved = []
    for module_name, attr in _MESH_SETTERS:
        module = importlib.import_module(module_name)
        if hasattr(module, attr):
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, record)
    saved.append((jax, "make_mesh", jax.make_mesh))
    jax.make_mesh = making_mesh(jax.make_mesh)
    saved.append((jax, "device_put", jax.device_put))
    jax.device_put = _placing(jax.device_put, explicit_puts, made)
    if hasattr(jax, "reshard"):  # eagerly, resharding an input moves it as device_put does
        saved.append((jax, "reshard", jax.reshard))
        jax.reshard = _resharding(jax.reshard, explicit_puts)
    if made is not None:
        for attr in _MAKERS:
            if hasattr(jax, attr):
                saved.append((jax, attr, getattr(jax, attr)))
                setattr(jax, attr, made.maker(getattr(jax, attr)))
    try:
        yield
    finally:
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)


def _path_name(path) -> str:
    import jax

    first, rest = path[0], path[1:]
    where = "args" if getattr(first, "idx", None) == 0 else "kwargs"
    return where + jax.tree_util.keystr(tuple(rest))


def array_positions(leaves: list) -> list[int]:
    """Which of a call's leaves (`tree_leaves((args, kwargs))`) are the traced program's inputs: its arrays,
    or their shapes (a `jax.ShapeDtypeStruct`); every other leaf is a constant of the program."""
    import jax

    return [i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct))]


def _trace(fn, args, kwargs, how=None):
    """The call traced under jax.jit: arrays become abstract inputs (placed ones keep their sharding).

    An input the function itself places with `jax.device_put` on an Explicit mesh is traced as placed
    there: eagerly, that call moved the data before any computation, as an input already placed would.
    An array it makes from host data is an input too, placed as the first trace made it (`_Made`).
    `how(jitted, *specs)` is what is done with the jitted program (its `trace`, unless told otherwise).
    Returns what `how` gave, the inputs' names, and their abstract values.
    """
    return _Tracer(fn, args, kwargs, how or (lambda jitted, *specs: jitted.trace(*specs))).result()


class _Tracer:
    """One call of `fn`, traced as often as it takes to see what it places and makes (see `_trace`).

    Each trace runs `program`: the call with its arrays replaced by the traced inputs (`arrays` are their
    positions among the call's leaves, `values`), those of the arrays it makes itself after them."""

    def __init__(self, fn, args, kwargs, how):
        import jax
        from jax.sharding import NamedSharding

        self.fn, self.how = fn, how
        leaves, self.tree = jax.tree_util.tree_flatten_with_path((tuple(args), dict(kwargs)))
        self.values = [leaf for _, leaf in leaves]
        self.arrays = array_positions(self.values)
        self.names = [_path_name(leaves[i][0]) for i in self.arrays]
        self.structs = []
        for i in self.arrays:
            x = self.values[i]
            sharding = x.sharding if isinstance(x.sharding, NamedSharding) else None
            self.structs.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding))
        self.inputs: list = []  # the traced inputs of the last trace
        self.making: list[_Made] = []  # the _Made of each trace, the one under way last

    def program(self, *traced):
        import jax

        self.inputs[:] = traced[: len(self.arrays)]
        if self.making[-1].given is not None:
            self.making[-1].given = list(traced[len(self.arrays) :])
        filled = list(self.values)
        for i, t in zip(self.arrays, traced):
            filled[i] = t
        a, kw = jax.tree_util.tree_unflatten(self.tree, filled)
        return self.fn(*a, **kw)

    def traced_with(self, structs, made_structs=()):
        """`how` of the program traced on `structs` (and the made arrays' `made_structs`), the inputs the
        function placed itself by the id of their traced input, and the traced inputs."""
        import jax

        seen: list = []
        puts: dict = {}
        self.making.append(_Made([] if made_structs else None))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with _traceable(seen, puts, self.making[-1]):
                try:
                    return self.how(jax.jit(self.program), *structs, *made_structs), puts, list(self.inputs)
                except Exception:
                    if not seen:
                        raise
            # The function entered a mesh with jax.set_mesh: trace it again inside that mesh.
            puts.clear()
            self.making.append(_Made([] if made_structs else None))
            with jax.set_mesh(seen[-1]), _traceable([], puts, self.making[-1]):
                return self.how(jax.jit(self.program), *structs, *made_structs), puts, list(self.inputs)

    def result(self):
        import jax

        structs = self.structs
        first = None
        try:
            first = self.traced_with(structs)
        except Exception:
            if not self._made():  # nothing made from host data: the trace failed
                raise
        made = self._made()
        # A second trace, the arrays the function made given to it as inputs.
        traced, puts, given = self.traced_with(structs, made) if made else first
        placed = [puts.get(id(t)) for t in given]
        if any(p is not None and s.sharding is None for p, s in zip(placed, structs)):
            structs = [
                jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p)
                if p is not None and s.sharding is None
                else s
                for s, p in zip(structs, placed)
            ]
            traced = self.traced_with(structs, made)[0]
        return traced, self.names + [f"made[{k}]" for k in range(len(made))], structs + list(made)

    def _made(self) -> list:
        """The arrays the last trace made from host data, as abstract values."""
        return [m for m in self.making[-1].record if m is not None]


def _placements(shardings, structs, names) -> list[dict]:
    import numpy as np

    out = []
    for name, struct, sharding in zip(names, structs, shardings):
        shape = tuple(struct.shape)
        item = np.dtype(struct.dtype).itemsize
        whole = int(np.prod(shape, dtype=np.int64)) * item
        entry = {"path": name, "shape": list(shape), "dtype": str(struct.dtype), "bytes": whole}
        if sharding is None:  # an input the program never reads: jax.jit pruned it and placed it nowhere
            entry.update(_unavailable("its per-device share: the program never reads it"))
            out.append(entry)
            continue
        try:
            entry["device_bytes"] = int(np.prod(sharding.shard_shape(shape), dtype=np.int64)) * item
            entry["replicated"] = bool(sharding.is_fully_replicated)
            blocks = {
                tuple((s.start, s.stop) for s in idx) for idx in sharding.devices_indices_map(shape).values()
            }
            entry["pieces"] = len(blocks)
            entry["sharding"] = str(sharding)[:200]
        except Exception as e:  # noqa: BLE001 - a sharding that cannot say: the fact is missing, not wrong
            entry.update(_unavailable("its per-device share", e))
        out.append(entry)
    return out


def _memory(compiled) -> dict:
    try:
        stats = compiled.memory_analysis()
    except Exception as e:  # noqa: BLE001
        return _unavailable("memory_analysis() raised", e)
    if stats is None:
        return _unavailable("memory_analysis() gives nothing on this backend")
    try:
        return {
            "argument": int(stats.argument_size_in_bytes),
            "output": int(stats.output_size_in_bytes),
            "temp": int(stats.temp_size_in_bytes),
            "alias": int(stats.alias_size_in_bytes),
        }
    except Exception as e:  # noqa: BLE001
        return _unavailable("memory_analysis() lacks the sizes", e)


def _raise(exc: BaseException):
    raise exc


def _flops(compiled):
    try:
        cost = compiled.cost_analysis()
    except Exception as e:  # noqa: BLE001
        return _unavailable("cost_analysis() raised", e)
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost:
        return _unavailable("cost_analysis() gives no FLOPs on this backend")
    # An analysis without a "flops" entry is one of a program that does no arithmetic (it only moves
    # data: a transpose, an all-to-all): its FLOPs are none, not unknown.
    return float(cost.get("flops", 0.0))


def _compiler_estimate(compiled) -> dict | None:
    """The compiler's own step time and per-device work, where it gives them (`optimal_seconds`: TPU). A time
    that is not above zero is no estimate: libtpu gives a negative one for a program whose loops it does not
    model (a collective matmul's windowed loop: -3.8 s for lab 14's reference at a production size)."""
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        if cost and cost.get("optimal_seconds") is not None and float(cost["optimal_seconds"]) > 0:
            return {
                "seconds": float(cost["optimal_seconds"]),
                "flops": float(cost.get("flops", 0.0)),
                "bytes": float(cost.get("bytes accessed", 0.0)),
            }
    except Exception:  # noqa: BLE001 - an estimate the backend cannot give is simply not shown
        pass
    return None


def _top_level(jaxpr) -> list[str]:
    return sorted({eqn.primitive.name for eqn in jaxpr.eqns})


def gather(fn, args, kwargs, settle=None) -> dict:
    """The facts of `fn(*args, **kwargs)` compiled under jax.jit, or `{"unavailable": why}`.

    `settle`, when given, runs after the student's code has been traced and before anything is
    read from the compiled program (the sealed harness puts back whatever the trace patched).
    """
    return examine(fn, args, kwargs, settle)[0]


def examine(fn, args, kwargs, settle=None) -> tuple[dict, object]:
    """`gather`'s facts, and the compiled program they were read from (None where it did not compile),
    which the verifier runs rather than compiling the same program a second time."""
    try:
        traced, names, structs = _trace(fn, args, kwargs)
        top_level = _top_level(traced.jaxpr.jaxpr)
        lowered = traced.lower()
    except Exception as e:  # noqa: BLE001 - the student's code may raise anything when traced
        return _unavailable("jax.jit could not trace the function to examine its compiled program", e), None
    finally:
        if settle is not None:
            settle()
    try:
        compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001
        return _unavailable("the traced program did not compile", e), None
    import jax

    # the first input the program keeps gives its devices: one it does not use is pruned, its sharding None
    placed = [s for s in jax.tree_util.tree_leaves(compiled.input_shardings[0]) if s is not None]
    devices = len(placed[0].device_set) if structs and placed else jax.device_count()
    facts = {
        "devices": devices,
        "top_level": top_level,
        "memory": _memory(compiled),
        "flops": _flops(compiled),
    }
    if estimate := _compiler_estimate(compiled):  # the TPU compiler's own figures (XLA:CPU gives none)
        facts["compiler"] = estimate
    try:
        text = hlo.printed(compiled)
    except Exception as e:  # noqa: BLE001
        text, unread = None, e
    if isinstance(facts["flops"], float):
        try:
            facts["flops"] += hlo.loop_flops(text) if text is not None else _raise(unread)
        except Exception as e:  # noqa: BLE001
            facts["flops"] = _unavailable("the work of the program's loops could not be counted", e)
    try:
        facts["collectives"] = collectives_in(text, devices) if text is not None else _raise(unread)
    except Exception as e:  # noqa: BLE001
        facts["collectives"] = _unavailable("the optimised HLO could not be read", e)
    try:  # one device's steps in the compiled program's schedule order (labkit.judge.timeline): the picture's
        facts["timeline"] = timeline.steps(text, devices) if text is not None else _raise(unread)
    except Exception as e:  # noqa: BLE001
        facts["timeline"] = _unavailable("the program's schedule could not be read", e)
    try:
        shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0], is_leaf=lambda s: s is None)
        facts["inputs"] = _placements(shardings, structs, names)
    except Exception as e:  # noqa: BLE001
        facts["inputs"] = _unavailable("the compiled program's input shardings could not be read", e)
    try:
        outs, _ = jax.tree_util.tree_flatten_with_path(lowered.out_info)
        shardings = jax.tree_util.tree_leaves(compiled.output_shardings)
        facts["outputs"] = _placements(
            shardings, [s for _, s in outs], ["out" + jax.tree_util.keystr(p) for p, _ in outs]
        )
    except Exception as e:  # noqa: BLE001
        facts["outputs"] = _unavailable("the compiled program's output shardings could not be read", e)
    return facts, compiled


def _exported(jax, jitted, specs):
    """jax.export's program; on a compile-only TPU configuration (LABKIT_TPU_TOPOLOGY) its TPU lowering alone,
    which the verifier both runs on the CPU devices (the value) and compiles for the topology (the facts,
    `judge.tpucompile`): one lowering for both. One TPU cannot lower is exported for CPU alone, and the
    verifier then says the TPU compiler could not have it."""
    import os

    if os.environ.get(envnames.TPU_TOPOLOGY):
        try:
            return jax.export.export(jitted, platforms=("tpu",))(*specs)
        except Exception as e:  # noqa: BLE001 - the CPU-only export below raises whatever is the student's
            _TPU_REFUSED.append(f"{type(e).__name__}: {_first_line(e)}")
    return jax.export.export(jitted)(*specs)


_TPU_REFUSED: list[str] = []  # why the last export could not lower for the TPU (`export` sends it along)


PROGRAM_MAX_BYTES = 4 << 20  # a serialized program larger than this is not sent to the kit


def export(fn, args, kwargs, settle=None, raising: bool = False) -> dict:
    """The call's program, serialized with `jax.export` (traced as `gather` traces it), or `{"unavailable": why}`.

    The kit runs it itself, in a process where no student code ran (`labkit.judge.verify`): the value graded
    and the program examined are then one and the same. Its inputs are the call's arrays, in the order
    of `jax.tree_util.tree_leaves((args, kwargs))`; anything else the call was given is a constant of it.
    The arrays may be jax.ShapeDtypeStructs: the function is then traced without ever seeing a value.
    `raising`: an exception the student's code raised while traced is raised, not described.
    """
    import base64

    import jax

    _TPU_REFUSED.clear()

    def traced_and_exported(jitted, *specs):  # a trace tried again (in the function's mesh) starts afresh
        _TPU_REFUSED.clear()
        return jitted.trace(*specs), _exported(jax, jitted, specs)

    try:
        (traced, exported), names, _ = _trace(fn, args, kwargs, how=traced_and_exported)
    except Exception as e:  # the student's code may raise anything when traced
        if "callback" in str(e).lower():
            return _unavailable(
                "the function calls back into Python inside its program (jax.debug.print, or a "
                "callback), which cannot be exported: take it out of the graded function"
            )
        if raising:
            raise
        return _unavailable("jax.export could not export the function's program", e)
    finally:
        if settle is not None:
            settle()
    if any(n.startswith("made[") for n in names):
        return {
            **_unavailable(
                "the function makes arrays from host data inside: its program has inputs the kit "
                "does not give"
            ),
            "host_data": True,
        }
    try:
        blob = bytes(exported.serialize())
    except Exception as e:  # noqa: BLE001
        return _unavailable("the exported program could not be serialized", e)
    if len(blob) > PROGRAM_MAX_BYTES:
        return _unavailable(f"the exported program is {len(blob)} bytes, more than {PROGRAM_MAX_BYTES}")
    # What ran outside any inner jax.jit (`gather`'s `top_level`), read from the trace, as the examination does.
    return {
        "program": base64.b64encode(blob).decode("ascii"),
        "top_level": _top_level(traced.jaxpr.jaxpr),
        **({"tpu_refused": _TPU_REFUSED[-1][:300]} if _TPU_REFUSED else {}),
    }
