"""Verdicts from a program the kit runs itself: each graded call's value and compiled facts, taken again.

The student's kernel ran the student's code, so nothing it reports is evidence: a cell can read the
harness's key and sign any values, a function can show the examiner one program and return the graded
value from another, and a program can hold as constants the answers to inputs it was shown.

So for a call the kit runs itself, the student's process is given only the shapes, dtypes and
placements of the call's arrays (`callplan.for_the_student`): the sealed harness traces the function on them
and exports its program with `jax.export` (`facts.export`); it never runs it and never sees a value.
After the run, the kit starts a fresh sandboxed Python, in which no student code has run, under the
run's configuration and limits (`python -m labkit.judge.verify`). It deserializes each program, refuses one
that calls custom code outside a short allow-list or takes other inputs than the call gives, runs it
on the tests' inputs (decoded from the kit's own call list) and reads the value and, where a test
asks, the compiled facts from that same program. The value graded and the program examined are one
and the same, no key is worth stealing, and hidden inputs stay hidden.

The kit alone decides how a call is judged, from its own call list, the configuration and the verifier's own
process; nothing the student's process wrote decides it. Which calls: every call of a function whose compiled
program any test reads (`checks.compiled_call`): a test that looks at the program must see the one whose value
it grades, and jax.jit must be able to trace such a function anyway (`callplan.mark`). Each must be verified, or it is
an error that says why (export refused, a program that makes arrays from host data, one the kit cannot run,
a custom call outside the allow-list, outputs past the caps), and no value from the kernel is kept for it.
One exception keeps the report: a call the lab's tests give host data (`checks.as_numpy`, lab 11's) whose
function makes arrays from it inside, whose program's inputs are not the call's. Calls of functions no test
examines (host-side Python is allowed there: lab 1's) keep the kernel's own report too, and so does every
call of a multi-process run; each row says which (`judged_by`: "verified", "partly verified" or "reported").
The run's environment (device count, backend, precision of products) is the verifier's, with the backend and
precision the configuration's (`kit_environment`). The value is the program's on the configuration's devices,
every device's block read as the program left it (`program.differing`); where copies claimed equal differ, or
the notebook's own value differs from the kit's, the row names it (`finding`). What still rests on the report
is named in docs/sandbox.md.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import time
from pathlib import Path

from labkit import envnames
from labkit.judge import program as program
from labkit.judge import records
from labkit.judge.callplan import CallSpec, compile_only, required, takes_host_data
from labkit.judge.placing import Unverified, mesh_shapes, placed_inputs, relabelled
from labkit.judge.program import (
    ALLOWED_CUSTOM_CALLS,
    ALLOWED_PATTERN,
    MAX_RUN_ELEMENTS,
    TooLarge,
    bounded,
    custom_calls,  # noqa: F401 - what the verifier refuses, as tests and tools ask it
    differing,
    inconsistent,
    read_module,
    same_values,
)
from labkit.run import scratch
from labkit.statuses import JudgedBy, Start

VERIFIED_FILE = "verified.json"
FOLDER = "verify"  # in the run's kit folder: the verifier's only writable folder
# the verifier's findings, as the kit reads them: what the caps let through
MAX_BYTES = records.VERIFIED_MAX_BYTES


# ----------------------------------------------------------------------------------------
# The verifier: a process of its own, in a sandbox, where no student code has run.
# ----------------------------------------------------------------------------------------


def _run(compiled, program, args: tuple, kwargs: dict):
    """The program's value from `compiled` (the facts' own compile of it), or from `program` where there is
    none or the inputs are placed other than it was compiled for (jax.jit then compiles for their placement)."""
    if compiled is not None:
        try:
            return compiled(*args, **kwargs)
        except (TypeError, ValueError):  # the inputs' placement is not the one compiled for
            pass
    return program(*args, **kwargs)


def run_program(call: CallSpec, blob: str, budget: list | None = None) -> dict:
    """One call: its program run on the call's own inputs; {"value", "products", "facts"?, "finding"?} or
    {"unverified": why}. `budget`: the elements the run's calls may still return (`MAX_RUN_ELEMENTS`).

    The value is the program's as it runs on this configuration's devices. A program with a part each device runs
    on its own block (shard_map) whose output is claimed the same on every device but is not has no single value:
    XLA may read any device's copy depending on how its inputs are placed. The kit reads every device's block, runs
    it again with each input a copy on every device (as plain JAX runs a function on the test's unplaced arrays),
    and where the copies or the two runs differ it grades device 0's copy and the row names the finding.
    """
    from labkit.judge import harness, plaindata

    budget = budget if budget is not None else [MAX_RUN_ELEMENTS]
    read = _Rerun.read(call, blob)
    if not isinstance(read, _Rerun):
        return read
    if compile_only(call):  # a production size: the TPU program's facts alone, nothing is run
        return _compiled_only(call, read.exported, blob, read.module, read.args, read.kwargs, read.positions)
    exported, module = read.exported, read.module
    try:
        value, found, used = read.on_a_mesh_that_fits(examine=bool(call.get("facts")))
        unread = call.get("values") is False  # its tests read the compiled program alone (`checks.facts_of`)
        if unread:  # no value is read back nor judged: none counts against the caps, none is run again
            value = None
        finding = differing(value)
        if exported.nr_devices > 1 and module["manual"] and used is not None and not unread:
            # every input a copy on each device, as plain JAX runs the function (in the mesh that fitted)
            copied = read.attempt(used, copies=True)[0]
            where = differing(copied) or (
                None if same_values(value, copied) else "the value changes with where its inputs are placed"
            )
            if where is not None:
                finding, value = finding or where, copied
        bounded(value, budget)
        record = {"value": plaindata.encode(value), "products": module["products"]}
        if finding is not None:
            record["finding"] = inconsistent(exported.nr_devices, finding)
        if found is not None:
            record["facts"] = _with_written(found, module)
        return record
    except Unverified as e:
        return {"unverified": str(e)}
    except TooLarge as e:
        return {"unverified": f"{e}: return only what the exercise asks for"}
    except Exception as e:  # noqa: BLE001 - the kit could not give this program its devices (see `_placed`)
        return {"unrunnable": f"{type(e).__name__}: {harness._first_line(e)[:300]}"}


class _Rerun:
    """A call's exported program, read and checked (`read`), and run on the call's own inputs (`attempt`).

    `positions`: which of the call's leaves are the program's inputs, in the order the export took them."""

    def __init__(self, call: CallSpec, blob: str, exported, module: dict, args: list, kwargs: dict):
        import jax

        from labkit import facts

        self.call, self.blob, self.exported, self.module = call, blob, exported, module
        self.args, self.kwargs = args, kwargs
        self.leaves = jax.tree_util.tree_leaves((tuple(args), dict(kwargs)))
        self.positions = facts.array_positions(self.leaves)
        self.tree = jax.tree_util.tree_structure((tuple(args), dict(kwargs)))

    @classmethod
    def read(cls, call: CallSpec, blob: str) -> _Rerun | dict:
        """The program, or {"unverified": why} for bytes that are no program, a custom call the kit does not run,
        or inputs other than the call's."""
        import jax

        from labkit.judge import harness

        try:
            exported = jax.export.deserialize(bytearray(base64.b64decode(blob)))
            module = read_module(exported.mlir_module())
        except Exception as e:  # noqa: BLE001 - whatever the bytes are, they are not a program the kit runs
            return {"unverified": f"its exported program could not be read ({type(e).__name__})"}
        foreign = sorted(
            c for c in module["targets"] if c not in ALLOWED_CUSTOM_CALLS and not ALLOWED_PATTERN.fullmatch(c)
        )
        if foreign:
            return {
                "unverified": f"its program calls code the kit does not run ({', '.join(map(repr, foreign))[:200]}): "
                "only sharding's own and jaxlib's linear algebra are allowed"
            }
        if module["lower_products"] and _judged_at_highest():
            return {"unverified": LOWER_PRECISION.format(n=module["lower_products"])}
        platforms = program.one_lowering(exported, call)
        if isinstance(platforms, str):
            return {"unverified": platforms}
        exported = platforms
        args = [harness._materialise(a) for a in call.get("args", [])]
        kwargs = {k: harness._materialise(v) for k, v in call.get("kwargs", {}).items()}
        rerun = cls(call, blob, exported, module, args, kwargs)
        given = [(tuple(rerun.leaves[i].shape), str(rerun.leaves[i].dtype)) for i in rerun.positions]
        if given != [(tuple(a.shape), str(a.dtype)) for a in exported.in_avals]:
            return {"unverified": "its exported program takes other inputs than the call gives"}
        return rerun

    def program(self, *a, **kw):
        import jax

        now = jax.tree_util.tree_leaves((tuple(a), dict(kw)))
        return self.exported.call(*[now[i] for i in self.positions])

    def on_a_mesh_that_fits(self, examine: bool) -> tuple:
        """(value, facts or None, the mesh shape used): the test's plain inputs left to the compiler, in the
        first context mesh the program's shardings fit, or, in none, a copy on each device."""
        *shapes, last = mesh_shapes(self.exported.nr_devices)
        for shape in shapes:
            try:
                return (*self.attempt(shape, examine), shape)
            except Unverified:
                raise
            except Exception:  # noqa: BLE001 - this mesh does not fit its shardings: the next one
                continue
        return (*self.attempt(last, examine), last)

    def attempt(self, shape: tuple | None, examine: bool = False, copies: bool = False):
        """(value, facts or None) of one run in a context mesh of `shape` (each input a copy on every device
        where `copies`): the facts are the kit's own reading of the program compiled for this configuration."""
        import jax

        from labkit import facts
        from labkit.judge import tpucompile

        placed, context, outputs = placed_inputs(
            self.exported, [self.leaves[i] for i in self.positions], shape, copies
        )
        now = list(self.leaves)
        for i, leaf in zip(self.positions, placed):
            now[i] = leaf
        a, kw = jax.tree_util.tree_unflatten(self.tree, now)
        with context:  # a context is entered once: the facts are read inside it, from the same placement
            topology = tpucompile.topology() if examine else None
            if examine and not topology:  # the program compiled once: its facts read, then it is run
                found, compiled = facts.examine(self.program, a, kw)
                return jax.block_until_ready(relabelled(_run(compiled, self.program, a, kw), outputs)), found
            value = jax.block_until_ready(relabelled(self.program(*a, **kw), outputs))
            if not topology:
                return value, None
            # a compile-only TPU configuration: the TPU program's facts
            return value, tpucompile.compiled_facts(
                self.exported,
                base64.b64decode(self.blob),
                topology,
                shape,
                a,
                kw,
                self.positions,
                self.call.get("tpu_refused"),
            )


# A program whose float32 products ask for less than the configuration's precision (`program.read_module`): on a
# TPU, one bfloat16 pass instead of six, so fewer FLOPs and fewer bytes moved than the design the kit judges.
LOWER_PRECISION = (
    "{n} of its float32 matrix products ask for a precision below highest (precision DEFAULT or HIGH, or a "
    "bfloat16 algorithm), and this configuration judges every float32 product at precision highest, as the kit "
    "runs it on a TPU: a program at a lower precision would be judged cheaper than the same design. Remove the "
    "`precision=` or `jax.default_matmul_precision(...)` that lowers them (to compute in bfloat16, make the "
    "operands bfloat16: such a product is judged as it is)"
)


def _judged_at_highest() -> bool:
    """Whether this verifier's configuration judges float32 products at precision highest (its environment's
    JAX_DEFAULT_MATMUL_PRECISION: every TPU configuration, and the GPU's; `configs.ACCELERATOR_MATMUL_PRECISION`)."""
    return os.environ.get("JAX_DEFAULT_MATMUL_PRECISION", "").strip().lower() == "highest"


def _compiled_only(call: CallSpec, exported, blob: str, module: dict, args, kwargs, positions) -> dict:
    """A call at a production size (`compile_only`): its program compiled for this configuration's TPU topology,
    never run. As a run tries its context meshes in turn, so does this, the meshes the program itself declares
    first: the first in which JAX can name the compiled program's shardings gives the facts; the compiler's own
    refusal (out of HBM) is the program's."""
    from labkit.judge import plaindata, tpucompile

    topology = tpucompile.topology()
    if not topology:
        return {
            "unverified": "a call at a production size is judged only on a compile-only TPU configuration"
        }
    n = exported.nr_devices
    own = [m for m in module["meshes"] if math.prod(m) == n and n > 1]  # the meshes the program names first
    for shape in dict.fromkeys([*own, *mesh_shapes(n)]):
        found = tpucompile.compiled_facts(
            exported,
            base64.b64decode(blob),
            topology,
            shape,
            args,
            kwargs,
            positions,
            call.get("tpu_refused"),
        )
        if not _other_mesh_needed(found):
            break
    return {
        "value": plaindata.encode(None),
        "products": module["products"],
        "facts": _with_written(found, module),
    }


def _with_written(found: dict, module: dict) -> dict:
    """The compiled facts with what the exported module asks for itself (`program.read_module`): the kit's own
    reading, never the run's; a copy, as `found` may be the TPU facts cache's own entry."""
    if "unavailable" in found:
        return found
    return found | {"written": module["written"], "written_sizes": module["written_sizes"]}


def _other_mesh_needed(found: dict) -> bool:
    """Did the compile fail only because JAX could not name the program's output shardings in the context mesh
    tried (an assertion or a value error of JAX's, not the compiler's refusal)?"""
    why = str(found.get("unavailable") or "")
    return bool(why) and ("AssertionError" in why or "ValueError" in why) and "RESOURCE_EXHAUSTED" not in why


JOB_FILE = "verify-job.json"  # in the run's kit folder, while the verifier runs: read-only to it, never the student's


def main(argv: list[str]) -> int:
    """`python -m labkit.judge.verify OUT [JOB]`: the job (calls and programs, JSON) from JOB or stdin; results to OUT."""
    job = json.loads(Path(argv[1]).read_bytes() if len(argv) > 1 else sys.stdin.buffer.read())
    import warnings

    from labkit.judge import harness

    warnings.filterwarnings(
        "ignore", message="Error writing persistent compilation cache"
    )  # a read-only cache

    started = time.monotonic()
    results, budget = {}, [MAX_RUN_ELEMENTS]
    other_size = program.other_designs(job["calls"], job["programs"])
    for call in job["calls"]:
        blob = job["programs"].get(call["id"])
        if call["id"] in other_size:
            results[call["id"]] = {"unverified": other_size[call["id"]]}
        elif blob is not None:
            results[call["id"]] = run_program(call, blob, budget)
    payload = {
        "environment": harness.environment(),
        "results": results,
        "seconds": round(time.monotonic() - started, 3),
    }
    Path(argv[0]).write_text(json.dumps(payload))
    return 0


# ----------------------------------------------------------------------------------------
# The kit's side: start the verifier after a run, and put its findings in the run's record.
# ----------------------------------------------------------------------------------------


def _sent(results: dict) -> dict[str, dict]:
    """What the kernel sent beside each call's result (`facts.export`'s record), taken out of the result:
    the program is run, not kept."""
    return {
        cid: sent if isinstance(sent := result.pop("program", None), dict) else {}
        for cid, result in results.items()
    }


def verify(
    record, calls: list[CallSpec], kit_folder: Path, env: dict, limits, timeout: float, cache=None, warm=None
) -> None:
    """Run the programs of `record`'s calls in a fresh sandbox and put the values and facts found in `record`.

    Every call's result gets `judged_by`: "verified" (the kit's run), "reported" (a call `mark` left
    out, or one of the exceptions the module names) or "unverified" (a required call whose program is
    missing, refused or failed: it becomes an error that says why).
    `cache` (a `jaxcache.CompileCache`, the run's): the verifier compiles through it too, read-only
    unless the run fills it (a reference solution's), so a student's program the reference compiled
    is not compiled again. `warm` (a started `warm.Server`): the verifier is forked by it, JAX already
    imported, in a sandbox of its own as a warm kernel is; else, or where it cannot, it starts cold.
    The three steps: which calls the kit runs (`_to_run`), its run of them (`_launch`), and their
    values and facts put in the record (`_merge`).
    """
    by_id = {c["id"]: c for c in calls}
    for cid in [cid for cid in record.results if cid not in by_id]:  # no call of the kit's: nothing to judge
        del record.results[cid]
    sent = _sent(record.results)
    record.environment = kit_environment(record.environment, env)
    wanted = _to_run(record.results, by_id, sent)
    if not wanted:
        return
    began = time.monotonic()
    try:
        found = _launch(record, by_id, wanted, sent, Path(kit_folder), env, limits, timeout, cache, warm)
    finally:
        record.verify_seconds = round(time.monotonic() - began, 2)
    _merge(record.results, wanted, found, sent)


def _to_run(results: dict, by_id: dict, sent: dict) -> dict[str, str]:
    """The programs the kit must run itself, by call id; every other call judged here (reported, verified by
    the error it raised in the student's process, or unverified with the reason)."""
    wanted = {}
    for cid, result in results.items():
        mine, call = sent[cid], by_id[cid]
        for kept_by_the_kit in ("judged_by", "products", "finding", "unrunnable"):  # the kit's words alone
            result.pop(kept_by_the_kit, None)
        if not required(call):
            result.pop("facts", None)  # no test reads them (`mark`): none are kept from the kernel
            result["judged_by"] = JudgedBy.REPORTED
        elif "error" in result:  # the call raised in the student's own process: that is the verdict
            result["judged_by"] = JudgedBy.VERIFIED
        elif isinstance(mine.get("program"), str):
            wanted[cid] = mine["program"]
        elif mine.get("host_data") is True and takes_host_data(call) and "value" in result:
            # the tests give it host data: its program's inputs are not the call's
            result["judged_by"] = JudgedBy.REPORTED
        elif mine.get("host_data") is True:
            _unverified(
                result,
                "the function makes arrays from host data inside (jax.make_array_from_callback, "
                "jax.device_put of a numpy array, ...), so its program does not take the call's "
                "inputs: build its arrays from the inputs it is given",
            )
        else:
            _unverified(result, str(mine.get("unavailable") or "the run sent no program for it"))
    return wanted


def _launch(
    record, by_id: dict, wanted: dict, sent: dict, kit_folder: Path, env: dict, limits, timeout, cache, warm
) -> dict[str, dict]:
    """The verifier's findings by call id, each `run_program`'s result or `{"unverified": why}`.

    The verifier has the run's time limit as its own: how long the notebook took does not decide whether an
    honest program is verified on a busy machine (and a pod's `seconds` is only its own word)."""
    folder = scratch.empty(kit_folder / FOLDER)
    job_file = kit_folder / JOB_FILE  # the kit folder: the verifier reads it, nothing else in a run can
    out = str(folder.resolve() / VERIFIED_FILE)
    with open(kit_folder / "verify.log", "wb") as log:
        proc = _start(record, _job(by_id, wanted, sent), job_file, folder, out, env, limits, log, cache, warm)
        try:
            code = proc.wait(timeout=float(timeout))
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: the programs did not finish in time
            proc.kill()
            code = None
        finally:
            job_file.unlink(
                missing_ok=True
            )  # the tests' inputs, hidden ones too: kept nowhere a later run sees
    try:
        payload = records.verified_file(scratch.read(folder, VERIFIED_FILE, MAX_BYTES))  # bounded, typed
        found = payload["results"]
        if payload.get("environment") and "error" not in payload["environment"]:  # the verifier's own
            record.environment = kit_environment(payload["environment"], env, counted=True)
        return found
    except (OSError, ValueError, KeyError, TypeError):
        why = (
            "the kit's own run of the programs did not finish within the time limit"
            if code is None
            else f"the kit's own run of the programs ended without results (exit status {code}; see verify.log)"
        )
        return {cid: {"unverified": why} for cid in wanted}
    finally:
        scratch.remove(folder)


def _job(by_id: dict, wanted: dict, sent: dict) -> bytes:
    """What the verifier is given: each wanted call as the kit's tests made it, and the program to run for it."""
    refused = {cid: str(sent[cid]["tpu_refused"])[:300] for cid in wanted if sent[cid].get("tpu_refused")}
    return json.dumps(
        {
            "calls": [
                by_id[cid] | ({"tpu_refused": refused[cid]} if cid in refused else {}) for cid in wanted
            ],
            "programs": wanted,
        }
    ).encode()


def _start(record, job: bytes, job_file: Path, folder: Path, out: str, env, limits, log, cache, warm):
    """The verifier's process: forked by the warm server where there is one (the job in `job_file`), else
    started cold in a sandbox of its own (the job on its standard input); `record` says which."""
    from labkit.run import sandbox

    if warm is not None:
        job_file.write_bytes(job)
        try:
            proc = warm.launch(
                [out, str(job_file.resolve())],
                folder,
                env,
                limits,
                log,
                cache=cache,
                readable=(job_file.parent,),
                module="labkit.judge.verify",
            )
            record.verify_start = Start.WARM
            return proc
        except OSError as e:
            log.write(f"labkit: no warm start for the verifier ({e}); it starts cold\n".encode())
    record.verify_start = Start.COLD
    cache_ro, cache_rw = cache.binds() if cache is not None else ((), ())
    return sandbox.launch(
        [sys.executable, "-m", "labkit.judge.verify", out],
        sandbox.RunContext(
            folder,
            env,
            log,
            limits or sandbox.DEFAULT_LIMITS,
            stdin=job,
            reach=sandbox.Reach(cache_ro, cache_rw),
        ),
    )


def _merge(results: dict, wanted: dict, found: dict, sent: dict) -> None:
    """Each run call's result from the kit's run alone: its value, products and facts, and a finding where the
    notebook's own value differs; a call the kit could not run becomes an error that says why."""
    for cid in wanted:
        result, mine = results[cid], found.get(cid) or {"unverified": "the kit's run gave nothing for it"}
        if "unverified" in mine:
            _unverified(result, mine["unverified"])
            continue
        if (
            "unrunnable" in mine or "value" not in mine
        ):  # no value from the kernel is kept for a call the kit must run
            _unverified(
                result,
                f"the kit found no way to run it on this configuration's devices "
                f"({mine.get('unrunnable', 'no value')}); if your function is plain JAX, this is the "
                "kit's limit, not your program's: tell your course staff",
            )
            continue
        ours = _differs_from(
            result.get("value"), mine["value"]
        )  # a value the notebook computed on the same inputs
        result["value"] = mine["value"]
        result["products"] = mine.get("products") is not False
        findings = [f for f in (mine.get("finding"), ours) if isinstance(f, str)]
        if findings:
            result["finding"] = "; ".join(findings)
        if "facts" in mine:  # what ran outside an inner jax.jit is the trace's (the program alone cannot say)
            top_level = sent[cid].get("top_level")
            result["facts"] = mine["facts"] | (
                {"top_level": top_level} if isinstance(top_level, list) else {}
            )
        else:
            result.pop("facts", None)
        result["judged_by"] = JudgedBy.VERIFIED


def _differs_from(reported, kits) -> str | None:
    """What the row says when the notebook's own value for a call differs from the kit's run of its program."""
    if reported is None:
        return None
    from labkit.judge import plaindata

    try:
        a, b = plaindata.decode(reported).value, plaindata.decode(kits).value
        import numpy as np

        if np.shape(a) == np.shape(b) and np.allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6, equal_nan=True
        ):
            return None
    except Exception:  # noqa: BLE001 - values that do not compare as numbers differ
        pass
    return (
        "the value your notebook computed differs from the kit's own run of the same program on the same "
        "inputs: the kit grades its own (a function whose value depends on when or where it runs, or a "
        "forgery)"
    )


def _unverified(result: dict, why: str) -> None:
    result.pop("value", None)
    result.pop("facts", None)
    result["error"] = {
        "type": "Unverified",
        "message": f"the kit could not run this call's program itself: {why}",
        "where": None,
    }
    result["judged_by"] = JudgedBy.UNVERIFIED


def kit_environment(reported: dict, env: dict, counted: bool = False) -> dict:
    """A run's environment as the kit grades it: `reported` (the verifier's own where it ran, `counted`, else the
    kernel's), its backend and the precision of its products the configuration's (`env`), never a setting a notebook
    chose. Where the verifier did not count the devices, a one-process CPU configuration's own count stands; an
    accelerator's, or a multi-process run's (`counted` there), is the kernel's word, on rows that are reported."""
    out = dict(reported) if isinstance(reported, dict) else {}
    if (
        not counted
        and str(env.get("JAX_NUM_CPU_DEVICES") or "").isdigit()
        and not env.get(envnames.NUM_PROCESSES)
    ):
        n = int(env["JAX_NUM_CPU_DEVICES"])
        out.update(device_count=n, local_device_count=n, process_count=1, process_index=0)
    platform = str(env.get("JAX_PLATFORMS") or out.get("backend") or "").split(",")[0]
    out["backend"] = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform) or None
    out["matmul_precision"] = env.get("JAX_DEFAULT_MATMUL_PRECISION") or None
    return out


def judged_by(results: dict) -> JudgedBy:
    """A run's results in one word: "verified", "reported", or "partly verified"."""
    marks = {
        JudgedBy.REPORTED if r.get("judged_by", JudgedBy.REPORTED) == JudgedBy.REPORTED else JudgedBy.VERIFIED
        for r in results.values()
    }
    return JudgedBy.PARTLY if len(marks) > 1 else marks.pop() if marks else JudgedBy.REPORTED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
