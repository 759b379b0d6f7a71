"""The references of labs 2 to 12 and 14 build each jitted program once: a second
call compiles nothing.

A jax.jit (or a shard_map) of a function defined inside the exercise wraps a new function at every
call, and JAX traces and compiles it again each time. These labs define each jitted function once: at
the top level where it needs no mesh, else in a function of the mesh cached with functools.cache (lab 7
says why). Read from a run of the reference's code cells on one CPU device, with JAX logging every
compilation: the second call of each exercise, on new values of the same shapes, must log none. Lab
11's exercises run in one process here, as on its cpu-1 configuration; lab 12's stretch, mlp_in_types,
is left out: its grid is 2 x n/2, which needs an even device count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from labkit.course import catalog

RUN_TWICE = r"""
import io, json, logging, sys
import numpy as np
nb, calls = json.loads(sys.stdin.read())
code = ["\n".join(l for l in "".join(c["source"]).splitlines() if "Checker" not in l)
        for c in nb["cells"] if c["cell_type"] == "code" and not "".join(c["source"]).startswith("check(")]
scope = {}
exec("\n\n".join(code), scope)
import jax
log = io.StringIO()
logging.getLogger("jax").addHandler(logging.StreamHandler(log))
jax.config.update("jax_log_compiles", True)
def arrays(a):  # lists become arrays, dicts of them stay dicts; a plain number (steps, a learning rate) stays one
    if isinstance(a, dict):
        return {k: arrays(v) for k, v in a.items()}
    return np.asarray(a, np.float32) if isinstance(a, list) else a
def shifted(a):  # new values of the same shapes
    if isinstance(a, dict):
        return {k: shifted(v) for k, v in a.items()}
    return a + 1 if isinstance(a, np.ndarray) else a
compiled = {}
for name, args in calls.items():
    args = [arrays(a) for a in args]
    scope[name](*args)
    log.truncate(0), log.seek(0)
    scope[name](*[shifted(a) for a in args])
    compiled[name] = [line for line in log.getvalue().splitlines() if line.startswith("Compiling")]
print(json.dumps(compiled))
"""

X, W, B = [1.0] * 8, [[0.5, -0.5]] * 8, [0.0, 1.0]
ROWS, W1, B1, W2, B2 = [[1.0] * 4] * 8, [[0.25] * 8] * 4, [0.0] * 8, [[0.5] * 4] * 8, [1.0] * 4
MLP = [ROWS, W1, B1, W2, B2]
GRID = [[1.0] * 8] * 8
PARAMS = {
    "hidden": {"kernel": [[0.5] * 8] * 3, "bias": [0.0] * 8},
    "out": {"kernel": [[0.25]] * 8, "bias": [0.0]},
}
BATCH = [PARAMS, [[1.0] * 3] * 8, [[0.0]] * 8]
STATE = {
    name: [[0.125] * 16] * 16 for name in ("wq", "wk", "wv", "wo", "w1", "w2")
}  # dim 16: one of 16 heads each
TOKENS = [[[1.0] * 16] * 2] * 2  # (batch, seq, dim)
XY = [[[1.0] * 3] * 8, [[0.5] * 2] * 8]  # x (8, 3) and y (8, 2) of a layer of 2 features
CALLS = {
    2: {
        "follow_data": [GRID],
        "column_sums": [GRID],
        "column_sums_split": [GRID],
        "collectives_of_sum": [GRID],
        "matvec_split": [GRID, X],
    },
    3: {
        "shard_map_double": [X],
        "row_softmax": [GRID],
        "block_owner": [X],
    },
    4: {
        "shard_map_vs_vmap": [ROWS],
        "distances_to_anchors": [ROWS, [[0.5] * 4] * 3],
        "similarity_to_first": [ROWS],
    },
    5: {
        "shard_map_psum": [X],
        "shard_map_center": [X],
        "shard_map_softmax": [X],
        "shard_map_ring_shift": [X],
        "shard_map_column_sums": [GRID],
        "shard_map_cumsum": [X],
        "rows_to_columns": [GRID],
        "shard_map_variance": [X],
    },
    6: {
        "shard_map_simulate": [0, XY[0], 2, 2],
        "shard_map_linear": [0, XY[0], 2],
        "shard_map_mse": [0, *XY, 2],
        "linear_grid": [XY[0], PARAMS["hidden"]],
        "shard_map_local_losses": [0, *XY, 2],
    },
    7: {
        "layer_jit": [X, W, B],
        "layer_constrained": [X, W, B],
        "layer_shard_map": [X, W, B],
        "layer_grid": [GRID, W, B],
        "layer_grid_w_in_pieces": [GRID, W, B],
    },
    8: {
        "global_gradients": BATCH,
        "train_data_parallel": [*BATCH, 2, 0.05],
        "accumulated_gradients": [*BATCH, 2],
        "train_data_parallel_adam": [*BATCH, 2, 0.05],
    },
    9: {
        "tensor_parallel_mlp": MLP,
        "fsdp_mlp": MLP,
        "fsdp_gradients": [ROWS, ROWS, W1, B1, W2, B2],
        "tensor_parallel_scattered": MLP,
        "fsdp_layer_by_layer": MLP,
    },
    10: {
        "pass_to_next_stage": [[1.0, 2.0]],
        "pipeline_forward": [[[[0.5]]] * 2, [[0.1]] * 2, [[[1.0]]] * 3],
        "ring_sum": [[[1.0, 2.0]]],
        "ring_sum_both_ways": [[[1.0], [2.0]]],
    },
    11: {
        "device_summary": [],
        "process_rows": [8],
        "load_global_batch": [GRID],
        "gather_to_every_host": [GRID],
        "log_progress": [1, 0.5],
        "data_parallel_step": [[0.0] * 3, XY[0], [1.0] * 8],
        "global_mse": [[0.0] * 3, XY[0], [1.0] * 8],
    },
    12: {
        "place_rows": [GRID],
        "types_after": [GRID],
        "contract_to_rows": [GRID, W],
        "block_maxima": [X],
        "constrain_auto": [GRID],
    },
    14: {
        "train_step": [STATE, STATE, TOKENS, TOKENS],
        "train_steps": [STATE, STATE, [TOKENS] * 3, [TOKENS] * 3],
    },
}


@pytest.mark.parametrize("lab", sorted(CALLS))
def test_a_second_call_of_each_exercise_compiles_nothing(lab):
    nb = json.loads(catalog.lab(lab).reference.read_text())
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    done = subprocess.run(
        [sys.executable, "-c", RUN_TWICE],
        input=json.dumps([nb, CALLS[lab]]),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(compiled) == set(CALLS[lab])
    assert not any(compiled.values()), {name: lines for name, lines in compiled.items() if lines}
