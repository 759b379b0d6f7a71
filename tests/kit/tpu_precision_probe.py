"""Run by test_tpu_precision.py in a process with v5e-8's environment: prints JSON.

A float32 product whose operand is gathered: `x @ all_gather(w)` over eight devices. Exported as the harness
exports a student's call (`facts.export`, at the configuration's precision), and once more at JAX's default
precision, as a notebook that lowered it would; each compiled by libtpu for TPU v5e 2x4."""

import base64
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from labkit import checks, cost, facts
from labkit.judge import tpucompile, verify

mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
X = np.ones((256, 512), np.float32)
W = np.ones((512, 1024), np.float32)


def gathered(x, w):
    """Each device's rows of x times the whole of w, gathered from its rows on every device."""
    return jax.shard_map(
        lambda a, b: a @ jax.lax.all_gather(b, "x", tiled=True),
        mesh=mesh,
        in_specs=(P("x", None), P("x", None)),
        out_specs=P("x", None),
    )(x, w)


def seen(blob: str) -> dict:
    raw = base64.b64decode(blob)
    exported = jax.export.deserialize(bytearray(raw))
    found = tpucompile.compiled_facts(
        exported, raw, os.environ[tpucompile.TOPOLOGY_VARIABLE], (8,), [X, W], {}, [0, 1]
    )
    return {
        "precision": [
            line.split("precision = ", 1)[1].split("]")[0] + "]"
            for line in exported.mlir_module().splitlines()
            if "stablehlo.dot_general" in line and "precision = " in line
        ],
        "gathered": [c["shape"].split("{")[0] for c in found["collectives"]],
        "sent": sum(cost.bytes_sent(c["op"], cost.shape_bytes(c["shape"]), 8) for c in found["collectives"]),
        "compiler_bytes": found["compiler"]["bytes"],
    }


args = (jnp.asarray(X), jnp.asarray(W))
as_configured = facts.export(gathered, args, {})["program"]
with jax.default_matmul_precision("default"):
    lowered = facts.export(gathered, args, {})["program"]
c = checks.compiled_call("gathered", X, W)
call = {"id": c.id, **c.encoded()}
print(
    json.dumps(
        {
            "configured": seen(as_configured),
            "lowered": seen(lowered),
            "judged": sorted(verify.run_program(call, as_configured)),
            "refused": verify.run_program(call, lowered).get("unverified", ""),
        }
    )
)
