"""What the kit reads of a program it runs itself (`labkit.judge.verify`), in the verifier's process.

The module's custom calls, matrix products and per-device parts, read from the parsed StableHLO op by op (never
from its printed text); the caps on what one call's outputs, and a run's, may be, counted before anything is
encoded; and whether an output claimed to be the same on every device is.
"""

from __future__ import annotations

import re
from typing import Any

from labkit.judge import plaindata
from labkit.judge.callplan import CallSpec, compile_only

# What one call's program may return, counted by the verifier before anything is encoded, and what all the calls
# of a run may return together: the tests' values are small (the largest input of any lab is 128 x 128 on up to
# 32 devices; on 256, inputs grown with the pod are up to 512 x 256, and lab 9's calls return 1.2 million values).
MAX_OUTPUT_ARRAYS = 64
MAX_OUTPUT_ELEMENTS = 1 << 18
MAX_OUTPUT_BYTES = 4 << 20
MAX_RUN_ELEMENTS = 1 << 21
# On a pod of more than 32 devices an input grown with it (`checks.by_devices`) is up to devices / 32 times the
# size written, and so is what a call on it returns: one call's caps grow in that proportion past 32 devices
# (8 times on 256: lab 14's step on a model dimension of 256 returns 1,048,577 values, its hidden test's 786,433,
# 1.83 million of the run's 2^21 together; its work problem's, 1,572,865, is never read back), never below; the
# run's total (MAX_RUN_ELEMENTS) stays what it is.


def output_caps(devices: int) -> tuple[int, int]:
    """The values and bytes one call's outputs may have on a pod of `devices` devices (`bounded`):
    MAX_OUTPUT_ELEMENTS and MAX_OUTPUT_BYTES on 1 to 32 devices, times devices / 32 (rounded up) beyond."""
    scale = max(1, -(-int(devices) // plaindata.WRITTEN_FOR_DEVICES))
    return MAX_OUTPUT_ELEMENTS * scale, MAX_OUTPUT_BYTES * scale


# Custom calls an exported program may make: those of sharding itself, and jaxlib's own CPU linear algebra
# (LAPACK kernels jax.export guarantees stable); never a callback into Python or code of the program's own.
# Compared with the exact target names of the parsed module's custom calls (`read_module`).
ALLOWED_CUSTOM_CALLS = frozenset(
    {
        "Sharding",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
        "annotate_device_placement",
        "shape_assertion",
        "AllocateBuffer",
    }
)
ALLOWED_PATTERN = re.compile(r"lapack_[a-z0-9]+_ffi")
# Operations whose float32 products a TPU or GPU may round (`labkit.judge.precision`).
_PRODUCTS = frozenset({"stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution"})
# A product's precision as JAX writes it: `precision_config` (one per operand; none written is DEFAULT), or a dot
# `algorithm` naming the operands' precision type and the passes (bfloat16 six times over is float32's own).
_PRECISION = re.compile(r"precision\s+([A-Z]+)")
_ALGORITHM = re.compile(
    r"lhs_precision_type\s*=\s*(\w+),\s*rhs_precision_type\s*=\s*(\w+).*num_primitive_operations\s*=\s*(\d+)"
)
# What marks a part of a program each device runs on its own block (shard_map): Shardy's, or GSPMD's.
_MANUAL = frozenset({"sdy.manual_computation"})
_MANUAL_TARGETS = frozenset({"SPMDFullToShardShape", "SPMDShardToFullShape"})


# The collectives a StableHLO module can ask for, by the names the compiled program gives them.
_COLLECTIVES = {
    "stablehlo.all_reduce": "all-reduce",
    "stablehlo.reduce_scatter": "reduce-scatter",
    "stablehlo.all_gather": "all-gather",
    "stablehlo.all_to_all": "all-to-all",
    "stablehlo.collective_permute": "collective-permute",
}


# The attributes of an op that say what the design is, whatever the size of its inputs: placement, which
# devices a collective joins and along which dimension, which dimensions a product sums or a transpose moves.
# Shapes, constants' values, slice bounds, paddings and windows (which grow with the inputs) are left out.
_DESIGN_ATTRIBUTES = frozenset(
    {
        "sharding",
        "in_shardings",
        "out_shardings",
        "manual_axes",
        "mhlo.sharding",
        "replica_groups",
        "source_target_pairs",
        "all_gather_dim",
        "scatter_dimension",
        "split_dimension",
        "concat_dimension",
        "split_count",
        "call_target_name",
        "dot_dimension_numbers",
        "dimensions",
        "broadcast_dimensions",
        "permutation",
        "comparison_direction",
        "mesh",
    }
)

# Ops that only move, reshape or retype data, and constants: left out of a design (see `design_of`).
_SHAPE_ONLY = frozenset(
    {
        "stablehlo.constant",
        "stablehlo.reshape",
        "stablehlo.broadcast_in_dim",
        "stablehlo.transpose",
        "stablehlo.slice",
        "stablehlo.convert",
        "stablehlo.bitcast_convert",
        "func.return",
    }
)

_MESH_AXIS = re.compile(r'"[^"]*"\s*=\s*(\d+)')  # an axis of an sdy mesh attribute: "name"=size


def read_module(module_text: str) -> dict[str, Any]:
    """What the kit needs to know of a StableHLO module, read from the parsed module op by op, never from its text:
    {"targets": the exact custom-call target names, "products": does it multiply matrices, "lower_products": how
    many of its float32 products are asked for below precision HIGHEST (`_float32_throughout`), "manual": has it a
    part each device runs on its own block, "written": the collectives it asks for itself, by their HLO
    names (those jit's partitioner adds come later, in the compiled program), "written_sizes": [name,
    dimensions...] of each array a reduce-scatter, all-gather or all-reduce it writes moves (`_sized`)}. "meshes": the axis sizes of each mesh
    the module declares (`sdy.mesh`), in order}. Raises when the text is not a module."""
    from jax.interpreters import (
        mlir,  # JAX's public door to its MLIR bindings (jax._src is not the kit's to use)
    )

    ir = mlir.ir

    targets: set[str] = set()
    written: set[str] = set()
    sized: list[list[Any]] = []
    meshes: list[tuple[int, ...]] = []
    found = {"products": False, "manual": False, "lower_products": 0}

    def visit(op: Any) -> Any:
        name = op.name
        if name in _COLLECTIVES:
            written.add(_COLLECTIVES[name])
            sized.extend(_sized(ir, op, _COLLECTIVES[name]))
        if name == "stablehlo.custom_call":
            target = str(ir.StringAttr(op.attributes["call_target_name"]).value)
            targets.add(target)
            found["manual"] |= target in _MANUAL_TARGETS
        found["products"] |= name in _PRODUCTS
        if name in _PRODUCTS and not _float32_throughout(op):
            found["lower_products"] += 1
        found["manual"] |= name in _MANUAL
        if name == "sdy.mesh" and "mesh" in op.attributes:  # #sdy.mesh<["data"=2, "model"=4]>
            meshes.append(tuple(int(n) for n in _MESH_AXIS.findall(str(op.attributes["mesh"]))))
        return ir.WalkResult.ADVANCE

    with mlir.make_ir_context():
        ir.Module.parse(module_text).operation.walk(visit)
    return {
        "targets": targets,
        "written": sorted(written),
        "written_sizes": sorted(sized)[:MOST_WRITTEN],
        "meshes": meshes,
        **found,
    }


MOST_WRITTEN = 256  # collectives with their dimensions a module's facts carry (records.py bounds the same)


def _sized(ir: Any, op: Any, kind: str) -> list[list[Any]]:
    """[kind, dimensions...] for each array a collective the program writes moves, by the array a device holds
    whole before it: a reduce-scatter's operands, an all-gather's and an all-reduce's results. The compiled
    program's collectives are matched against these by their dimensions (`compiled._stands_for`)."""
    if kind not in ("reduce-scatter", "all-gather", "all-reduce"):
        return []
    values = op.operands if kind == "reduce-scatter" else op.results
    out = []
    for v in values:
        try:
            out.append([kind, *(int(d) for d in ir.RankedTensorType(v.type).shape)])
        except (ValueError, TypeError):  # not a ranked tensor (a token): nothing to match
            continue
    return out


def _float32_throughout(op: Any) -> bool:
    """Whether a product `op` (a dot or a convolution) is float32 throughout where it has float32 operands: every
    operand's precision HIGHEST, or an algorithm of float32 operands (or bfloat16 in six passes, what HIGHEST is on
    a TPU). A product with no float32 operand (bfloat16 ones, say) is what its operands are, and counts as such."""
    if not any("xf32>" in str(v.type) or str(v.type) == "tensor<f32>" for v in list(op.operands)[:2]):
        return True
    if "algorithm" in op.attributes:
        m = _ALGORITHM.search(str(op.attributes["algorithm"]))
        if m is None:
            return False
        kinds = (m.group(1), m.group(2))
        return kinds == ("f32", "f32") or (kinds == ("bf16", "bf16") and int(m.group(3)) >= 6)
    if "precision_config" not in op.attributes:
        return False  # DEFAULT for every operand
    found = _PRECISION.findall(str(op.attributes["precision_config"]))
    return bool(found) and all(p == "HIGHEST" for p in found)


def design_of(module_text: str) -> list[tuple[str, ...]]:
    """The design a StableHLO module is, whatever the size of its inputs: each op from `main` in order, the
    functions it calls inlined (JAX lowers a function once per distinct input shapes, so how many functions a
    module holds depends on the sizes), with the attributes that say what it asks for (`_DESIGN_ATTRIBUTES`).
    Constants and ops that only reshape, broadcast, slice, transpose or convert are left out: JAX leaves out
    those that do nothing at one size (a slice of a whole dimension, two equal constants made one) and not at
    another."""
    from jax.interpreters import mlir

    ir = mlir.ir
    design: list[tuple[str, ...]] = []
    with mlir.make_ir_context():
        module = ir.Module.parse(module_text)
        functions = {
            str(ir.StringAttr(op.attributes["sym_name"]).value): op
            for op in (o.operation for o in module.body.operations)
            if op.name == "func.func"
        }

        def walk(op: Any, depth: int) -> None:
            if depth > 64:
                raise ValueError("functions nested more than 64 deep")
            name = op.name
            if name == "func.call":
                callee = str(op.attributes["callee"]).lstrip("@")
                walk(functions[callee], depth + 1)
                return
            if name not in _SHAPE_ONLY:
                design.append(
                    (
                        name,
                        *(
                            f"{a}={op.attributes[a]}"
                            for a in sorted(op.attributes)
                            if a in _DESIGN_ATTRIBUTES
                        ),
                    )
                )
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        walk(inner.operation, depth + 1)

        walk(functions["main"], 0)
    return design


def same_design(course: list[tuple[str, ...]], production: list[tuple[str, ...]]) -> str | None:
    """Where a program at a production size is not the design of the one at the course size (each `design_of`),
    what differs, said in the kit's words; None where they are the same design.

    The same design asks for the same kinds of op with the same placements, collectives over the same devices and
    the same loops at both sizes; how often each comes may differ (a Python loop over the layers unrolls as
    many times as there are layers). What one size has and the other lacks is named by the op's kind."""
    mine, theirs = set(course), set(production)
    if mine == theirs:
        return None
    lacking = sorted({op[0] for op in mine - theirs})
    added = sorted({op[0] for op in theirs - mine})
    parts = [f"{', '.join(lacking)} only at the course size"] if lacking else []
    parts += [f"{', '.join(added)} only at the production size"] if added else []
    return "; ".join(parts) + (
        " (the same ops asking for other placements or devices)" if lacking == added else ""
    )


def custom_calls(module_text: str) -> set[str]:
    """The custom-call targets a StableHLO module names, exactly (`read_module`)."""
    targets: set[str] = read_module(module_text)["targets"]
    return targets


class TooLarge(Exception):
    """A program's outputs are more than the kit reads back (`MAX_OUTPUT_*`); the message says how much."""


def bounded(value: Any, budget: list[int], devices: int | None = None) -> None:
    """Raise TooLarge when `value`'s outputs pass the caps of one call on `devices` devices (`output_caps`; the
    process's own count unless said), or `budget` (the run's elements left)."""
    import jax
    import numpy as np

    max_elements, max_bytes = output_caps(jax.device_count() if devices is None else devices)
    leaves = jax.tree_util.tree_leaves(value)
    sizes = [int(np.prod(getattr(x, "shape", ()), dtype=np.int64)) for x in leaves]
    nbytes = sum(n * np.dtype(getattr(x, "dtype", np.float64)).itemsize for n, x in zip(sizes, leaves))
    if len(leaves) > MAX_OUTPUT_ARRAYS:
        raise TooLarge(f"it returns {len(leaves)} arrays; the kit reads at most {MAX_OUTPUT_ARRAYS}")
    if sum(sizes) > max_elements or nbytes > max_bytes:
        raise TooLarge(
            f"it returns {sum(sizes)} values ({nbytes} bytes); the kit reads at most {max_elements} "
            f"values and {max_bytes} bytes from one call"
        )
    if sum(sizes) > budget[0]:
        raise TooLarge(
            f"the run's calls return more than {MAX_RUN_ELEMENTS} values together; the kit reads no more"
        )
    budget[0] -= sum(sizes)


def differing(value: Any) -> str | None:
    """Where one block of an output is held by several devices with different values (a copy claimed the same on
    every device that is not): which output and devices, or None. Every device's block is read as the program
    left it."""
    import jax
    import numpy as np

    for number, leaf in enumerate(jax.tree_util.tree_leaves(value)):
        if not isinstance(leaf, jax.Array):
            continue
        seen: dict[str, tuple[int, Any]] = {}
        for shard in leaf.addressable_shards:
            block, data = repr(shard.index), np.asarray(shard.data)
            if block in seen and not _identical(seen[block][1], data):
                return f"output {number}: device {seen[block][0]} and device {shard.device.id} hold different values"
            seen.setdefault(block, (shard.device.id, data))
    return None


def _identical(a: Any, b: Any) -> bool:
    import numpy as np

    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))  # NaN where both are NaN
    return bool(np.all(a == b))


def same_values(one: Any, other: Any) -> bool:
    import jax
    import numpy as np

    def close(
        a: Any, b: Any
    ) -> bool:  # sums taken in another order round otherwise: within float32's error of the values' size
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = float(np.nanmax(np.abs(b))) if b.size and not np.all(np.isnan(b)) else 0.0
        return bool(a.shape == b.shape) and np.allclose(
            a, b, rtol=1e-5, atol=1e-5 * max(1.0, scale), equal_nan=True
        )

    left, right = jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(other)
    return len(left) == len(right) and all(
        _identical(np.asarray(a), np.asarray(b)) or close(a, b) for a, b in zip(left, right)
    )


def inconsistent(devices: int, where: str) -> str:
    """What the row says when an output claimed to be the same on every device is not (see `run_program`)."""
    return (
        f"on {devices} devices this program's value depends on which device's copy is read ({where}): an "
        "output shard_map says is the same on every device (out_specs=P() over an axis) differs from device "
        "to device, which check_vma=False lets through. The kit grades device 0's copy, as plain JAX reads it; "
        "combine the devices' values (jax.lax.psum, all_gather) or keep the output split (out_specs=P('data'))"
    )


def one_lowering(exported: Any, call: CallSpec) -> Any:
    """The exported program made ready to give its value on this configuration's devices, from the one lowering
    whose facts are read, or why not (a string).

    A module exported for several platforms holds one lowering per platform (`jax.lax.platform_dependent`, and
    JAX's own platform rules): run on one and examined on another, its value and its facts would come from two
    programs. The kit decides from its configuration alone which lowering it needs: on a compile-only TPU
    configuration the TPU's, whose facts the TPU compiler gives, run on the CPU devices for the value (JAX's
    platform check set aside for it by the kit, never by the program); the CPU's alone where the harness said the
    TPU could not lower the function (the TPU's facts are then refused, saying so); elsewhere exactly one
    platform's, the one the run's devices are."""
    import dataclasses

    import jax

    from labkit.judge import tpucompile

    platforms = tuple(exported.platforms)
    # on a compile-only TPU configuration the TPU's lowering, or the CPU's where the harness says the TPU could
    # not lower it (the TPU's facts are then refused: a claim that only loses)
    wanted = {("tpu",), *((("cpu",),) if call.get("tpu_refused") else ())} if tpucompile.topology() else None
    if len(platforms) != 1 or (wanted is not None and platforms not in wanted):
        return (
            f"its program was exported for {', '.join(platforms)}, and this configuration judges one lowering"
            f"{' (for tpu)' if wanted else ''}: the kit verifies the value and reads the facts of one and the "
            "same program"
        )
    if platforms == ("tpu",):
        checks = (*exported.disabled_safety_checks, jax.export.DisabledSafetyCheck.platform())
        return dataclasses.replace(exported, disabled_safety_checks=checks)
    return exported


def other_designs(calls: list[CallSpec], programs: dict[str, str]) -> dict[str, str]:
    """Why each call at a production size is not judged, by call id, where its program is not the design the
    same function's call at the course size is (`program.same_design`): the design the kit verifies at the
    course size is the one it reads at the production size, or that call is an error saying so. A function
    that branches on its input's size in Python makes two programs; so does one the tests give no call of
    at the course size, which nothing then verifies."""

    def design(cid: str) -> list[tuple[str, ...]] | None:
        try:
            return design_of(module_text(programs[cid]))
        except Exception:  # noqa: BLE001 - bytes that are no program: `run_program` says so for that call
            return None

    refused = {}
    for call in (c for c in calls if compile_only(c) and c["id"] in programs):
        course = next(
            (
                c["id"]
                for c in calls
                if c["function"] == call["function"] and not compile_only(c) and c["id"] in programs
            ),
            None,
        )
        theirs = design(call["id"])
        mine = design(course) if course is not None else None
        if theirs is None:
            continue
        why = "no call of it at the course size was verified" if mine is None else same_design(mine, theirs)
        if why is not None:
            refused[call["id"]] = (
                "at a production size, the kit judges the design it verified at the course size, and this "
                f"program is another ({why}): a function that branches on its input's size (an `if` on "
                "x.shape, a different code path for large inputs) is judged as what it does at every size, so "
                "write one design for every size"
            )
    return refused


def module_text(blob: str) -> str:
    """The StableHLO text of a serialized exported program."""
    import base64

    import jax

    return str(jax.export.deserialize(bytearray(base64.b64decode(blob))).mlir_module())
