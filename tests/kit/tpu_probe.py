"""Run by test_tpu_compile.py in a process of eight CPU devices compiling for TPU v5e 2x4: prints JSON."""

import base64
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from labkit import checks, cost, facts
from labkit.judge import tpucompile, verify

mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
X = np.ones((8 * 64, 256), np.float32)


def summed_in_bf16(x):
    """Each device's rows in bfloat16, summed over the devices: one all-reduce of 64 x 256 bf16."""
    return jax.shard_map(
        lambda y: jax.lax.psum(y.astype(jnp.bfloat16), "x"), mesh=mesh, in_specs=P("x"), out_specs=P()
    )(x)


def sent(found):
    return sum(
        cost.bytes_sent(c["op"], cost.shape_bytes(c["shape"]), 8) for c in found["facts"]["collectives"]
    )


c = checks.compiled_call("summed_in_bf16", X)
call = {"id": c.id, **c.encoded()}
blob = facts.export(summed_in_bf16, (jnp.asarray(X),), {})["program"]
on_tpu = verify.run_program(call, blob)
topology = os.environ.pop(tpucompile.TOPOLOGY_VARIABLE)
on_cpu = verify.run_program(call, blob)
os.environ[tpucompile.TOPOLOGY_VARIABLE] = topology
again = verify.run_program(call, blob)  # a second student's identical program

big = jax.ShapeDtypeStruct((6 << 30,), jnp.bfloat16)  # 12 GiB in, 12 GiB out: more than a v5e's 16 GiB
doubled = jax.export.export(jax.jit(lambda x: x * 2), platforms=("cpu", "tpu"))(big)
refused = tpucompile.compiled_facts(doubled, doubled.serialize(), topology, None, [big], {}, [0])
small = jax.ShapeDtypeStruct((8,), jnp.float32)
cpu_only = jax.export.export(jax.jit(lambda x: x * 2))(small)
not_for_tpu = tpucompile.compiled_facts(cpu_only, cpu_only.serialize(), topology, None, [small], {}, [0])

store = tpucompile.cache()
cached = {
    "compiles": store.compiles,
    "hits": store.hits,
    "files": sorted(os.listdir(os.environ[tpucompile.CACHE_VARIABLE])),
}

# A call at a production size: its inputs given by their shapes alone (checks.shaped), never made; the
# verifier compiles its program for the topology and runs nothing. 2 GiB in each input, 16 GiB out.
grid = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def product_on_the_grid(x, w):
    rows, cols, tiles = (
        NamedSharding(grid, s) for s in (P("data", None), P(None, "model"), P("data", "model"))
    )
    return jax.jit(lambda x, w: jnp.tanh(x @ w), in_shardings=(rows, cols), out_shardings=tiles)(x, w)


def product_on_every_chip(x, w):
    whole = NamedSharding(grid, P())
    return jax.jit(lambda x, w: jnp.tanh(x @ w), in_shardings=(whole, whole), out_shardings=whole)(x, w)


def at_production_size(function):
    c = checks.compiled_call(
        function.__name__, checks.shaped((1 << 16, 8192)), checks.shaped((8192, 1 << 16))
    )
    call = {"id": c.id, **c.encoded()}
    shapes = tuple(jax.ShapeDtypeStruct(tuple(a["shape"]), np.dtype(a["dtype"])) for a in call["args"])
    before = tpucompile.cache().compiles
    found = verify.run_program(call, facts.export(function, shapes, {})["program"])
    return {**found, "compiles": tpucompile.cache().compiles - before}


split_at_size, whole_at_size = (
    at_production_size(product_on_the_grid),
    at_production_size(product_on_every_chip),
)
os.environ.pop(tpucompile.TOPOLOGY_VARIABLE)
split_on_cpu = at_production_size(product_on_the_grid)
os.environ[tpucompile.TOPOLOGY_VARIABLE] = topology

print(
    json.dumps(
        {
            "tpu": {
                "sent": sent(on_tpu),
                "compiled_for": on_tpu["facts"].get("compiled_for"),
                "shapes": [x["shape"] for x in on_tpu["facts"]["collectives"]],
                "value": "value" in on_tpu,
            },
            "cpu": {
                "sent": sent(on_cpu),
                "compiled_for": on_cpu["facts"].get("compiled_for"),
                "card": cost.lines("summed_in_bf16", "cpu-8", cost.card(on_cpu["facts"]), []),
            },
            "card": cost.lines("summed_in_bf16", "v5e-8", cost.card(on_tpu["facts"]), []),
            "again": again["facts"] == on_tpu["facts"],
            "cache": cached,
            "refused": refused,
            "not_for_tpu": not_for_tpu,
            "digest": len(base64.b64decode(blob)) > 0,
            "production": {
                "split": split_at_size,
                "whole": whole_at_size,
                "on_cpu": split_on_cpu,
            },
        }
    )
)
