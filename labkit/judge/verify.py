"""Verdicts from a program the kit runs itself: each graded call's value and compiled facts, taken again.

The student's kernel ran the student's code, so nothing it reports is evidence: a cell can read the
harness's key and sign any values, a function can show the examiner one program and return the graded
value from another, and a program can hold as constants the answers to inputs it was shown.

So for a call the kit runs itself, the student's process is given only the shapes, dtypes and
placements of the call's arrays (`for_the_student`): the sealed harness traces the function on them
and exports its program with `jax.export` (`facts.export`); it never runs it and never sees a value.
After the run, the kit starts a fresh sandboxed Python, in which no student code has run, under the
run's configuration and limits (`python -m labkit.judge.verify`). It deserializes each program, refuses one
that calls custom code outside a short allow-list or takes other inputs than the call gives, runs it
on the tests' inputs (decoded from the kit's own call list) and reads the value and, where a test
asks, the compiled facts from that same program. The value graded and the program examined are one
and the same, no key is worth stealing, and hidden inputs stay hidden.

Which calls: every call of a function whose compiled program any test reads (`checks.compiled_call`):
a test that looks at the program must see the one whose value it grades, and jax.jit must be able to
trace such a function anyway (`mark`). Each must be verified, or it is an error that says why, with
two exceptions that keep the report: a function that makes arrays from host data inside (lab 11's)
has a program whose inputs are not the call's; and a program the kit cannot place on its devices (an
output tiled over a mesh the program does not name) is not run. Calls
of functions no test examines (host-side Python is allowed there: lab 1's) keep the kernel's own
report too, and so does every call of a multi-process run; each row says which (`judged_by`:
"verified", "partly verified" or "reported"). What still rests on the report is named in docs/sandbox.md.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from pathlib import Path

from labkit.run import scratch

VERIFIED_FILE = "verified.json"
FOLDER = "verify"  # in the run's kit folder: the verifier's only writable folder
MAX_BYTES = 256 << 20
# Custom calls an exported program may make: those of sharding itself, and jaxlib's own CPU linear algebra
# (LAPACK kernels jax.export guarantees stable); never a callback into Python or code of the program's own.
ALLOWED_CUSTOM_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
                                  "annotate_device_placement", "shape_assertion", "AllocateBuffer"})
ALLOWED_PATTERN = re.compile(r"lapack_[a-z0-9]+_ffi")
_CUSTOM_CALL = re.compile(r'custom_call\s*@"?([\w.$-]+)"?|call_target_name\s*=\s*"([^"]+)"')


def custom_calls(module_text: str) -> set[str]:
    """The custom-call targets a StableHLO module names."""
    return {a or b for a, b in _CUSTOM_CALL.findall(module_text)}


class Unverified(Exception):
    """The call's program could not be run by the kit; the message says why, in the student's terms."""


# ----------------------------------------------------------------------------------------
# The verifier: a process of its own, in a sandbox, where no student code has run.
# ----------------------------------------------------------------------------------------

def _placed(exported, arrays: list, shape: tuple | None):
    """(the inputs, the mesh to run in, the outputs' shardings) on the devices the program was exported for.

    A program exported for n devices runs only in a context of n devices. An input the student's
    function placed itself (or took already placed) has a sharding in the program and is placed so;
    one it did not (the test's plain array, on the default device) is left to the compiler, in a mesh
    of the first n devices of `shape` (a program that tiles its outputs over a 2-D mesh of its own
    needs a 2-D one), as jit placed it in the student's call; with `shape` None, it is copied to each.
    """
    import contextlib

    import jax
    import numpy as np
    from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

    n = exported.nr_devices
    if n > jax.device_count():
        raise Unverified(f"its program was made for {n} devices and this configuration has {jax.device_count()}")
    devices = jax.devices()[:n]
    meshes: dict = {}

    def concrete(sharding):
        """The program's own sharding on this process's devices, or None where it names none."""
        if not (isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, AbstractMesh)):
            return None
        abstract = sharding.mesh
        key = (abstract.axis_sizes, abstract.axis_names, abstract.axis_types)
        if key not in meshes:
            meshes[key] = Mesh(np.array(devices).reshape(abstract.axis_sizes), abstract.axis_names,
                               axis_types=abstract.axis_types)
        return NamedSharding(meshes[key], sharding.spec)

    out = []
    everywhere = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec())
    for x, sharding in zip(arrays, exported.in_shardings_jax(None)):
        placed = concrete(sharding) or (everywhere if shape is None and len(x.sharding.device_set) != n else None)
        out.append(x if placed is None else jax.device_put(x, placed))
    outputs = [concrete(s) for s in exported.out_shardings_jax(None)]
    if n == 1 or shape is None:
        context = contextlib.nullcontext()
    else:
        names = tuple(f"devices{i or ''}" for i in range(len(shape)))
        context = jax.set_mesh(next(iter(meshes.values()), None) or Mesh(np.array(devices).reshape(shape), names))
    return out, context, outputs


def _mesh_shapes(n: int) -> list:
    """The context meshes tried, in order: one axis of n devices, then every 2-D split, then none (a copy on each)."""
    return [(n,), *[(a, n // a) for a in range(2, n) if n % a == 0], None]


def _relabelled(value, shardings: list):
    """The outputs on the meshes the program names (same devices, same blocks: its axis names, not the kit's)."""
    import jax

    leaves, tree = jax.tree_util.tree_flatten(value)
    if len(leaves) != len(shardings):
        return value
    return jax.tree_util.tree_unflatten(tree, [x if s is None or not isinstance(x, jax.Array) else jax.device_put(x, s)
                                               for x, s in zip(leaves, shardings)])


def run_program(call: dict, blob: str) -> dict:
    """One call: its program run on the call's own inputs; {"value", "facts"?} or {"unverified": why}."""
    import jax

    from labkit import facts
    from labkit.judge import harness, plaindata, tpucompile

    try:
        exported = jax.export.deserialize(bytearray(base64.b64decode(blob)))
    except Exception as e:  # noqa: BLE001 - whatever the bytes are, they are not a program the kit runs
        return {"unverified": f"its exported program could not be read ({type(e).__name__})"}
    try:
        calls = custom_calls(exported.mlir_module())
    except Exception as e:  # noqa: BLE001
        return {"unverified": f"its exported program could not be read ({type(e).__name__})"}
    foreign = sorted(c for c in calls if c not in ALLOWED_CUSTOM_CALLS and not ALLOWED_PATTERN.fullmatch(c))
    if foreign:
        return {"unverified": f"its program calls code the kit does not run ({', '.join(foreign)[:200]}): "
                              "only sharding's own and jaxlib's linear algebra are allowed"}
    args = [harness._materialise(a) for a in call.get("args", [])]
    kwargs = {k: harness._materialise(v) for k, v in call.get("kwargs", {}).items()}
    leaves = jax.tree_util.tree_leaves((tuple(args), dict(kwargs)))
    positions = facts.array_positions(leaves)  # the program's inputs, in the order the export took them
    given = [(tuple(leaves[i].shape), str(leaves[i].dtype)) for i in positions]
    takes = [(tuple(a.shape), str(a.dtype)) for a in exported.in_avals]
    if given != takes:
        return {"unverified": "its exported program takes other inputs than the call gives"}

    def program(*a, **kw):
        now = jax.tree_util.tree_leaves((tuple(a), dict(kw)))
        return exported.call(*[now[i] for i in positions])

    tree = jax.tree_util.tree_structure((tuple(args), dict(kwargs)))

    def attempt(shape: tuple | None) -> dict:
        placed, context, outputs = _placed(exported, [leaves[i] for i in positions], shape)
        now = list(leaves)
        for i, leaf in zip(positions, placed):
            now[i] = leaf
        a, kw = jax.tree_util.tree_unflatten(tree, now)
        with context:
            value = jax.block_until_ready(_relabelled(program(*a, **kw), outputs))
            record = {"value": plaindata.encode(value)}
            if call.get("facts") and (topology := tpucompile.topology()):  # a compile-only TPU configuration
                record["facts"] = tpucompile.compiled_facts(exported, base64.b64decode(blob), topology, shape,
                                                            a, kw, positions, call.get("tpu_refused"))
            elif call.get("facts"):
                record["facts"] = facts.gather(program, a, kw)
        return record

    try:
        *shapes, last = _mesh_shapes(exported.nr_devices)
        for shape in shapes:  # the test's plain inputs left to the compiler, in a mesh the program fits ...
            try:
                return attempt(shape)
            except Unverified:
                raise
            except Exception:  # noqa: BLE001, S112 - ... this mesh does not fit its shardings: the next one
                continue
        return attempt(last)  # ... or, in none, a copy on each device
    except Unverified as e:
        return {"unverified": str(e)}
    except Exception as e:  # noqa: BLE001 - the kit could not give this program its devices (see `_placed`)
        return {"unrunnable": f"{type(e).__name__}: {harness._first_line(e)[:300]}"}


JOB_FILE = "verify-job.json"  # in the run's kit folder, while the verifier runs: read-only to it, never the student's


def main(argv: list[str]) -> int:
    """`python -m labkit.judge.verify OUT [JOB]`: the job (calls and programs, JSON) from JOB or stdin; results to OUT."""
    job = json.loads(Path(argv[1]).read_bytes() if len(argv) > 1 else sys.stdin.buffer.read())
    import warnings

    from labkit.judge import harness

    warnings.filterwarnings("ignore", message="Error writing persistent compilation cache")  # a read-only cache

    started = time.monotonic()
    results = {}
    for call in job["calls"]:
        blob = job["programs"].get(call["id"])
        if blob is not None:
            results[call["id"]] = run_program(call, blob)
    payload = {"environment": harness.environment(), "results": results,
               "seconds": round(time.monotonic() - started, 3)}
    Path(argv[0]).write_text(json.dumps(payload))
    return 0


# ----------------------------------------------------------------------------------------
# The kit's side: start the verifier after a run, and put its findings in the run's record.
# ----------------------------------------------------------------------------------------

def mark(calls: list[dict]) -> list[dict]:
    """The judge's calls, those the kit must run itself marked `verify`: every call of a function whose
    compiled program any test reads (a function the tests examine is one jax.jit can trace)."""
    examined = {c["function"] for c in calls if c.get("facts")}
    return [c | {"verify": True} if c["function"] in examined else c for c in calls]


def for_the_student(calls: list[dict]) -> list[dict]:
    """The calls as the student's process gets them: a call the kit runs itself gets its JAX arrays as
    shapes, dtypes and placements only, so the tests' inputs (hidden ones too) never enter that process
    and no program can hold their answers. Inputs given as numpy arrays (host data the function reads
    on the host, as lab 11's do) and Python values still arrive whole."""
    return [_abstracted(c) if required(c) else c for c in calls]


def _abstracted(call: dict) -> dict:
    def strip(enc):
        if not isinstance(enc, dict):
            return enc
        kind = enc.get("kind")
        if kind in ("list", "tuple"):
            return {**enc, "items": [strip(v) for v in enc["items"]]}
        if kind == "dict":
            return {**enc, "items": [[k, strip(v)] for k, v in enc["items"]]}
        if kind == "array" and enc.get("as") != "numpy":
            return {"kind": "abstract", "dtype": enc["dtype"], "shape": enc["shape"],
                    **({"place": enc["place"]} if enc.get("place") else {})}
        return enc

    return {**call, "args": [strip(a) for a in call.get("args", [])],
            "kwargs": {k: strip(v) for k, v in call.get("kwargs", {}).items()}}


def required(call: dict) -> bool:
    """Must this call's value come from the kit's own run of its program? (See `mark`.)"""
    return bool(call.get("verify"))


def _sent(results: dict) -> dict[str, dict]:
    """What the kernel sent beside each call's result (`facts.export`'s record), taken out of the result:
    the program is run, not kept."""
    return {cid: sent if isinstance(sent := result.pop("program", None), dict) else {}
            for cid, result in results.items()}


def verify(record, calls: list[dict], kit_folder: Path, env: dict, limits, timeout: float, cache=None,
           warm=None) -> None:
    """Run the programs of `record`'s calls in a fresh sandbox and put the values and facts found in `record`.

    Every call's result gets `judged_by`: "verified" (the kit's run), "reported" (a call `mark` left
    out, or one of the exceptions the module names) or "unverified" (a required call whose program is
    missing, refused or failed: it becomes an error that says why).
    `cache` (a `jaxcache.CompileCache`, the run's): the verifier compiles through it too, read-only
    unless the run fills it (a reference solution's), so a student's program the reference compiled
    is not compiled again. `warm` (a started `warm.Server`): the verifier is forked by it, JAX already
    imported, in a sandbox of its own as a warm kernel is; else, or where it cannot, it starts cold.
    """
    from labkit.run import sandbox

    by_id = {c["id"]: c for c in calls}
    sent = _sent(record.results)
    wanted = {}
    for cid, result in record.results.items():
        mine = sent[cid]
        host_data = mine.get("host_data") is True  # arrays made from host data inside: the program is not the call
        if host_data and "value" not in result:
            _unverified(result, "the function makes arrays from host data inside, from inputs the kit gives as JAX "
                                "arrays: it cannot be exported, and its value was not taken in the notebook")
        elif not required(by_id.get(cid, {})) or host_data:
            result["judged_by"] = "reported"
        elif "error" in result:
            result["judged_by"] = "verified"  # the call raised in the student's own process: that is the verdict
        elif isinstance(mine.get("program"), str):
            wanted[cid] = mine["program"]
        else:
            _unverified(result, str(mine.get("unavailable") or "the run sent no program for it"))
    if not wanted:
        return
    began = time.monotonic()
    folder = scratch.empty(Path(kit_folder) / FOLDER)
    refused = {cid: str(sent[cid]["tpu_refused"])[:300] for cid in wanted if sent[cid].get("tpu_refused")}
    job = json.dumps({"calls": [by_id[cid] | ({"tpu_refused": refused[cid]} if cid in refused else {})
                                for cid in wanted], "programs": wanted}).encode()
    job_file = Path(kit_folder) / JOB_FILE  # the kit folder: the verifier reads it, nothing else in a run can
    out = str(folder.resolve() / VERIFIED_FILE)
    with open(Path(kit_folder) / "verify.log", "wb") as log:
        proc = None
        if warm is not None:
            job_file.write_bytes(job)
            try:
                proc = warm.launch([out, str(job_file.resolve())], folder, env, limits, log, cache=cache,
                                   readable=(Path(kit_folder),), module="labkit.judge.verify")
                record.verify_start = "warm"
            except OSError as e:
                log.write(f"labkit: no warm start for the verifier ({e}); it starts cold\n".encode())
        if proc is None:
            record.verify_start = "cold"
            cache_ro, cache_rw = cache.binds() if cache is not None else ((), ())
            proc = sandbox.launch([sys.executable, "-m", "labkit.judge.verify", out], folder, env, limits, log=log,
                                  stdin=job, extra_ro=cache_ro, extra_rw=cache_rw)
        try:
            code = proc.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: the programs did not finish in time
            proc.kill()
            code = None
        finally:
            job_file.unlink(missing_ok=True)  # the tests' inputs, hidden ones too: kept nowhere a later run sees
    try:
        found = json.loads(scratch.read(folder, VERIFIED_FILE, MAX_BYTES))["results"]
    except (OSError, ValueError, KeyError, TypeError):
        why = ("the kit's own run of the programs did not finish within the time limit" if code is None else
               f"the kit's own run of the programs ended without results (exit status {code}; see verify.log)")
        found = {cid: {"unverified": why} for cid in wanted}
    finally:
        scratch.remove(folder)
        record.verify_seconds = round(time.monotonic() - began, 2)
    for cid in wanted:
        result, mine = record.results[cid], found.get(cid) or {"unverified": "the kit's run gave nothing for it"}
        if "unverified" in mine:
            _unverified(result, mine["unverified"])
            continue
        if "unrunnable" in mine and "value" in result:  # the kit's limit: the report stands, and says so
            result["judged_by"] = "reported"
            result["unrunnable"] = mine["unrunnable"]
            continue
        if "unrunnable" in mine:  # and no value was taken in the notebook (its inputs were shapes only)
            _unverified(result, f"the kit found no way to run it on this configuration's devices "
                                f"({mine['unrunnable']}); this is the kit's limit, not your program's: tell "
                                "your course staff")
            continue
        result["value"] = mine["value"]
        if "facts" in mine:  # what ran outside an inner jax.jit is the trace's (the program alone cannot say)
            top_level = sent[cid].get("top_level")
            result["facts"] = mine["facts"] | ({"top_level": top_level} if isinstance(top_level, list) else {})
        result["judged_by"] = "verified"


def _unverified(result: dict, why: str) -> None:
    result.pop("value", None)
    result.pop("facts", None)
    result["error"] = {"type": "Unverified", "message": f"the kit could not run this call's program itself: {why}",
                       "where": None}
    result["judged_by"] = "unverified"


def judged_by(results: dict) -> str:
    """A run's results in one word: "verified", "reported", or "partly verified"."""
    marks = {"reported" if r.get("judged_by", "reported") == "reported" else "verified" for r in results.values()}
    return "partly verified" if len(marks) > 1 else marks.pop() if marks else "reported"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
