"""An exported program's own shardings made concrete on the devices the kit runs or compiles it for.

`jax.export` keeps each input's and output's sharding on an abstract mesh (its axis names, sizes and
types, no devices). The verifier (CPU devices) and the TPU compile (a topology's devices) both give
them devices the same way: one mesh per distinct abstract mesh, the first devices of the list in order.
Where the program names no mesh, both run or compile it in the kit's own (`kits_mesh`). The verifier's
inputs are placed by `placed_inputs`, in each context mesh of `mesh_shapes` in turn.
"""

from __future__ import annotations

from typing import Any


class Placer:
    """Call it with a sharding from `exported.in_shardings_jax(None)`: that sharding on `devices`, or None
    where the program names none (an input it leaves to the caller's placement)."""

    def __init__(self, devices: list[Any]):
        self.devices = devices
        self.meshes: dict[tuple, Any] = {}

    def __call__(self, sharding: Any) -> Any:
        import numpy as np
        from jax.sharding import AbstractMesh, Mesh, NamedSharding

        if not (isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, AbstractMesh)):
            return None
        abstract = sharding.mesh
        key = (abstract.axis_sizes, abstract.axis_names, abstract.axis_types)
        if key not in self.meshes:
            self.meshes[key] = Mesh(
                np.array(self.devices).reshape(abstract.axis_sizes),
                abstract.axis_names,
                axis_types=abstract.axis_types,
            )
        return NamedSharding(self.meshes[key], sharding.spec)

    def first_mesh(self) -> Any:
        """The mesh of the first of the program's shardings made concrete, or None."""
        return next(iter(self.meshes.values()), None)

    def kits_mesh(self, shape: tuple | None = None) -> Any:
        """The kit's own mesh over the devices, for a program that names none: axes `devices`, `devices1`, ...
        of `shape` (None: one axis of every device)."""
        import numpy as np
        from jax.sharding import Mesh

        shape = shape or (len(self.devices),)
        return Mesh(
            np.array(self.devices).reshape(shape), tuple(f"devices{i or ''}" for i in range(len(shape)))
        )


class Unverified(Exception):
    """The call's program could not be run by the kit; the message says why, in the student's terms."""


def placed_inputs(exported, arrays: list, shape: tuple | None, copies: bool = False):
    """(the inputs, the mesh to run in, the outputs' shardings) on the devices the program was exported for.

    A program exported for n devices runs only in a context of n devices. An input the student's
    function placed itself (or took already placed) has a sharding in the program and is placed so;
    one it did not (the test's plain array, on the default device) is left to the compiler, in a mesh
    of the first n devices of `shape` (a program that tiles its outputs over a 2-D mesh of its own
    needs a 2-D one), as jit placed it in the student's call; with `shape` None, or `copies`, it is
    copied to each (in the mesh of `shape`, whose axes the program's outputs may name).
    """
    import contextlib

    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    n = exported.nr_devices
    if n > jax.device_count():
        raise Unverified(
            f"its program was made for {n} devices and this configuration has {jax.device_count()}"
        )
    devices = jax.devices()[:n]
    concrete = Placer(devices)  # the program's own sharding on this process's devices, or None

    kits = concrete.kits_mesh(shape)
    out = []
    everywhere = NamedSharding(kits, PartitionSpec())
    for x, sharding in zip(arrays, exported.in_shardings_jax(None), strict=True):
        placed = concrete(sharding) or (
            everywhere if (shape is None or copies) and len(x.sharding.device_set) != n else None
        )
        out.append(x if placed is None else jax.device_put(x, placed))
    outputs = [concrete(s) for s in exported.out_shardings_jax(None)]
    context: Any = (
        contextlib.nullcontext() if n == 1 or shape is None else jax.set_mesh(concrete.first_mesh() or kits)
    )
    return out, context, outputs


def mesh_shapes(n: int) -> list:
    """The context meshes tried, in order: one axis of n devices, then every 2-D split, then none (a copy on each)."""
    return [(n,), *[(a, n // a) for a in range(2, n) if n % a == 0], None]


def relabelled(value, shardings: list):
    """The outputs on the meshes the program names (same devices, same blocks: its axis names, not the kit's)."""
    import jax

    leaves, tree = jax.tree_util.tree_flatten(value)
    if len(leaves) != len(shardings):
        return value
    return jax.tree_util.tree_unflatten(
        tree,
        [
            x if s is None or not isinstance(x, jax.Array) else jax.device_put(x, s)
            for x, s in zip(leaves, shardings)
        ],
    )
