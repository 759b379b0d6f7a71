"""Which share of a sweep over the labs `make test` runs; `make test SWEEP=full` runs every sweep whole.

A sweep repeats one check over every lab (every reference with its products in bfloat16, rewritten
with explicit meshes, on every pod size). `make test` runs every other lab of each, the sweeps offset
so that most labs are in one of them; the whole sweeps run before a release (docs/development.md).
`none` (what `make test-other-jax` sets): the student loop runs the references on cpu-8 only (its other tests
keep their cpu-1 runs).
"""

from __future__ import annotations

import os

from labkit import envnames

FULL = os.environ.get(envnames.TEST_SWEEP) == "full"
NONE = os.environ.get(envnames.TEST_SWEEP) == "none"


def share(items: list, offset: int) -> list:
    """`items` whole in the full sweep, else every other one from `offset` (0 or 1)."""
    return list(items) if FULL else list(items)[offset::2]
