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
from labkit.judge import program, tpucompile, verify

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


# One lowering for the value and the facts: a program that reads its platform gives, on a compile-only TPU
# configuration, the value and the facts of its TPU branch, whichever branch is the honest one.
def honest(x):
    return jax.shard_map(lambda y: jax.lax.psum(y, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())(x)


def wasteful(x):  # the same sum, all-reduced twice
    return jax.shard_map(
        lambda y: jax.lax.psum(jax.lax.psum(y, "x") / 8, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()
    )(x)


def zeros_on_the_tpu(x):
    return jax.lax.platform_dependent(x, cpu=honest, default=lambda y: jnp.zeros((64, 256), y.dtype))


def wasteful_on_cpu_honest_on_the_tpu(x):
    return jax.lax.platform_dependent(x, cpu=wasteful, default=honest)


def verified(function):
    c = checks.compiled_call(function.__name__, X)
    found = verify.run_program(
        {"id": c.id, **c.encoded()}, facts.export(function, (jnp.asarray(X),), {})["program"]
    )
    if "value" in found:
        found["value"] = float(np.asarray(checks_value(found["value"])).sum())
    return found


def checks_value(encoded):
    from labkit.judge import plaindata

    return plaindata.decode(encoded).value


both_platforms = jax.export.export(jax.jit(honest), platforms=("cpu", "tpu"))(
    jax.ShapeDtypeStruct(X.shape, X.dtype)
)
c = checks.compiled_call("honest", X)
platforms = {
    "honest": verified(honest),
    "zeros_on_the_tpu": verified(zeros_on_the_tpu),
    "wasteful_on_cpu": verified(wasteful_on_cpu_honest_on_the_tpu),
    "both": verify.run_program(
        {"id": c.id, **c.encoded()}, base64.b64encode(both_platforms.serialize()).decode("ascii")
    ),
}


# One design at every size: a function that branches on its input's size is refused at the production size.
def branches_on_size(x, w):
    if x.shape[0] > 4096:  # at a production size, an outer product of one column and one row: no product
        return jnp.tanh(x[:, :1] * w[:1, :])
    return product_on_the_grid(x, w)


def sized_calls(function):
    small = checks.compiled_call(
        function.__name__, np.ones((16, 64), np.float32), np.ones((64, 16), np.float32)
    )
    large = checks.compiled_call(
        function.__name__, checks.shaped((1 << 16, 8192)), checks.shaped((8192, 1 << 16))
    )
    calls = [{"id": c.id, **c.encoded()} for c in (small, large)]
    programs = {}
    for call in calls:
        shapes = tuple(jax.ShapeDtypeStruct(tuple(a["shape"]), np.dtype(a["dtype"])) for a in call["args"])
        programs[call["id"]] = facts.export(function, shapes, {})["program"]
    return {"refused": list(program.other_designs(calls, programs).values())}


sizes = {"honest": sized_calls(product_on_the_grid), "branches": sized_calls(branches_on_size)}

print(
    json.dumps(
        {
            "platforms": platforms,
            "sizes": sizes,
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
