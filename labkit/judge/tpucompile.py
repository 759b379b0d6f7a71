"""The TPU compiler's view of a program the verifier already holds: compile-only TPU configurations.

A configuration such as `v5e-8` (`configs.tpu_compiled`) runs the student's notebook and the kit's own
run of each examined program on CPU devices, for the values; the compiled facts every design check reads
(collectives and their groups, bytes sent, placement of outputs, memory per device, FLOPs) come from
the same exported program compiled by libtpu's TPU compiler for a TPU topology that is not attached
(`jax.experimental.topologies`): no TPU is needed, only libtpu (`make setup EXTRAS=tpu`).

The harness exports such a program for the TPU alone (`facts.export`, `platforms=("tpu",)`): the verifier
runs that one lowering on the CPU devices for the value (`program.one_lowering`) and gives it here, with the
mesh shape its CPU run took, for the facts. A program the TPU
compiler refuses (out of HBM, an op it cannot lower) gets facts `{"unavailable": ...}` naming the
compiler and its message: every check that needs them then fails, saying why.

Compiling is the cost of these configurations, so each distinct program is compiled once per topology
and placement: `FactsCache`, keyed by the serialized program's digest, shared by every student and
regrade that gives the same bytes (in memory within a verifier; in a folder across runs when the kit
gives one, LABKIT_TPU_CACHE).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from labkit import envnames
from labkit.machine.accelerators import libtpu_available  # noqa: F401 - asked of this module by its readers

TOPOLOGY_VARIABLE = envnames.TPU_TOPOLOGY  # e.g. "v5e:2x4": set by a compile-only TPU configuration
CACHE_VARIABLE = envnames.TPU_CACHE  # a folder the verifier may write the TPU facts it computed to
FORMAT = 1  # bumped when the facts recorded change shape: older entries are then never read


def topology() -> str | None:
    """The TPU topology this process compiles for, or None on every other configuration."""
    return os.environ.get(TOPOLOGY_VARIABLE) or None


def described(name: str) -> str:
    """'v5e:2x4' -> 'TPU v5e 2x4' (how rows and messages name it)."""
    kind, _, shape = name.partition(":")
    return f"TPU {kind} {shape}".strip()


def short(exc: BaseException, limit: int = 300) -> str:
    """The compiler's message, shortened: its first informative line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("===")]
    first = next(
        (line for line in lines if "Error" in line or "RESOURCE_EXHAUSTED" in line or ":" in line),
        lines[0] if lines else type(exc).__name__,
    )
    return first[:limit]


class FactsCache:
    """The TPU facts of each distinct (program, topology, placement): computed once, then read."""

    def __init__(self, folder: str | Path | None = None):
        self.folder = Path(folder) if folder else None
        self.memory: dict[str, dict] = {}
        self.hits = 0
        self.compiles = 0

    @staticmethod
    def key(blob: bytes, topology_name: str, shape) -> str:
        digest = hashlib.sha256(blob).hexdigest()
        return hashlib.sha256(
            json.dumps([FORMAT, _reader(), digest, topology_name, shape]).encode()
        ).hexdigest()

    def get(self, key: str) -> dict | None:
        if key in self.memory:
            self.hits += 1
            return self.memory[key]
        if self.folder is not None:
            try:
                found = json.loads((self.folder / f"{key}.json").read_text())
            except (OSError, ValueError):
                return None
            if isinstance(found, dict):
                self.memory[key] = found
                self.hits += 1
                return found
        return None

    def put(self, key: str, facts: dict) -> None:
        self.memory[key] = facts
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            part = self.folder / f".{key}.{os.getpid()}"
            part.write_text(json.dumps(facts))
            part.replace(self.folder / f"{key}.json")
        except OSError:
            pass  # a read-only cache: this verifier keeps what it computed in memory only


@functools.cache
def _reader() -> str:
    """What a program's facts are read with: the code that reads them (this module, `labkit/facts.py`,
    `judge/timeline.py`, `judge/hlo.py`, `judge/hloparse.py`) and libtpu's version. Facts another reading wrote are never read: a fix to the
    reading (a branch counted twice) takes effect at once, not after the cache is emptied by hand."""
    from importlib import metadata

    here = Path(__file__).resolve()
    sources = [
        here,
        here.parents[1] / "facts.py",
        here.with_name("timeline.py"),
        here.with_name("hlo.py"),
        here.with_name("hloparse.py"),
    ]
    try:
        compiler = metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        compiler = "none"
    text = b"".join(p.read_bytes() for p in sources) + compiler.encode()
    return hashlib.sha256(text).hexdigest()


_CACHE: FactsCache | None = None


def cache() -> FactsCache:
    global _CACHE
    if _CACHE is None:
        _CACHE = FactsCache(os.environ.get(CACHE_VARIABLE) or None)
    return _CACHE


def _devices(topology_name: str):
    # Compiling only, no chip to guard: libtpu's lock on /tmp/libtpu_lockfile would refuse a second process
    # compiling at the same time (another run of the kit, outside a sandbox's private /tmp).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # Nor a TPU VM to describe: libtpu would otherwise ask the cloud's metadata server what it runs on, and
    # with no server to answer (no network in a sandbox, or no cloud) it retries for minutes. JAX sets this
    # itself only when it starts its TPU backend, which a run on JAX_PLATFORMS=cpu never does.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="tpu", topology_name=topology_name).devices


def compiled_facts(
    exported,
    blob: bytes,
    topology_name: str,
    shape: tuple | None,
    args,
    kwargs,
    positions: list[int],
    refused: str | None = None,
    store: FactsCache | None = None,
) -> dict:
    """The facts (`facts.gather`'s shape) of `exported` compiled for `topology_name`, or `{"unavailable": why}`.

    `shape`: the context mesh the CPU run placed the test's plain inputs in (None: a copy on each device);
    `args`, `kwargs`, `positions`: the call as the CPU run was given it (`verify.run_program`); `refused`: why
    the harness could not export it for the TPU, where it could not.
    """
    if "tpu" not in tuple(exported.platforms) and refused:
        return {
            "unavailable": f"it compiles for CPU but could not be lowered for the TPU ({described(topology_name)}):"
            f" {refused}",
            "refused": True,
        }
    store = store if store is not None else cache()
    key = FactsCache.key(bytes(blob), topology_name, list(shape) if shape else None)
    found = store.get(key)
    if found is not None:
        return found
    store.compiles += 1
    facts = _compile(exported, topology_name, shape, args, kwargs, positions)
    if "unavailable" not in facts or facts.get("refused"):
        store.put(key, facts)  # a refusal is the program's: as stable as its facts
    return facts


def _compile(exported, topology_name, shape, args, kwargs, positions) -> dict:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from labkit import facts as facts_module
    from labkit.judge.placing import Placer

    where = described(topology_name)
    if "tpu" not in tuple(exported.platforms):
        return {
            "unavailable": f"its program was exported for {', '.join(exported.platforms)} only, not for the TPU "
            f"this configuration compiles for ({where}): the kit's harness exports for both"
        }
    try:
        devices = list(_devices(topology_name))
    except Exception as e:  # noqa: BLE001 - a missing or broken libtpu: the configuration cannot say
        return {"unavailable": f"the TPU compiler for {where} could not start ({short(e)})"}
    n = exported.nr_devices
    if n > len(devices):
        return {"unavailable": f"its program was made for {n} devices and {where} has {len(devices)}"}
    devices = devices[:n]
    concrete = Placer(devices)

    everywhere = NamedSharding(concrete.kits_mesh(), PartitionSpec())
    leaves, tree = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    now = list(leaves)
    for i, sharding in zip(positions, exported.in_shardings_jax(None)):
        placed = concrete(sharding) or (everywhere if shape is None else None)
        now[i] = jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype, sharding=placed)
    a, kw = jax.tree_util.tree_unflatten(tree, now)
    if n == 1 or shape is None:
        mesh = concrete.first_mesh() or everywhere.mesh
    else:
        mesh = concrete.first_mesh() or concrete.kits_mesh(shape)

    def program(*p, **k):
        got = jax.tree_util.tree_leaves((tuple(p), dict(k)))
        return exported.call(*[got[i] for i in positions])

    with jax.set_mesh(mesh):
        found = facts_module.gather(program, a, kw)
    if "unavailable" in found:
        why = str(found["unavailable"])
        if "did not compile" in why:
            return {
                "unavailable": f"the TPU compiler ({where}) refused the program that XLA:CPU compiles: "
                f"{why.split(': ', 1)[-1][:300]}",
                "refused": True,
            }
        return found
    found["compiled_for"] = where
    found["top_level"] = found.get("top_level", [])
    return found
