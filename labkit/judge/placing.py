"""An exported program's own shardings made concrete on the devices the kit runs or compiles it for.

`jax.export` keeps each input's and output's sharding on an abstract mesh (its axis names, sizes and
types, no devices). The verifier (CPU devices) and the TPU compile (a topology's devices) both give
them devices the same way: one mesh per distinct abstract mesh, the first devices of the list in order.
Where the program names no mesh, both run or compile it in the kit's own (`kits_mesh`).
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
