"""The site's pictures, drawn as SVG by the kit's own code from what they show (`make docs`).

* `sharding_svg`: where each block of a 2-D array lives under three PartitionSpecs on a 2 x 4 mesh,
  read from JAX itself (`Sharding.devices_indices_map`) on eight simulated CPU devices;
* `pipeline_svg`: a GPipe schedule, which stage works on which microbatch at each step, and the
  bubble the schedule cannot avoid;
* `layers_svg`: the layers a graded notebook runs in, from the kit's trusted process inward
  (docs/sandbox.md says each in full);
* `architecture_svg`: the pipeline every run goes through, stage by stage, with the modules of each
  and the side of the trust boundary it runs on (docs/architecture.md says each in full).

Run `python -m labkit.course.pictures OUT_DIR` to write them; the sharding picture needs JAX and starts a
process of its own with eight CPU devices.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from html import escape
from pathlib import Path

COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"]
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">\n'
        f"<title>{escape(title)}</title>\n" + "\n".join(body) + "\n</svg>\n"
    )


def _text(x: float, y: float, text: str, size: int = 12, anchor: str = "middle", fill: str = "#222") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" fill="{fill}">{escape(text)}</text>'


# ---------------------------------------------------------------------------------------------
# Sharding layouts, from JAX.

SPECS = (("rows", "cols"), ("rows", None), (None, "cols"))
_LAYOUT_SCRIPT = """
import json, os, sys
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("rows", "cols"))
out = []
for spec in json.loads(sys.argv[1]):
    held = NamedSharding(mesh, P(*spec)).devices_indices_map((8, 8))
    blocks = {}
    for device, index in held.items():
        key = tuple((s.start or 0, s.stop if s.stop is not None else 8) for s in index)
        blocks.setdefault(key, []).append(device.id)
    out.append([[list(k), sorted(v)] for k, v in sorted(blocks.items())])
print(json.dumps(out))
"""


def sharding_layouts(python: str = sys.executable) -> list:
    """For each of SPECS: [[(row range, column range), device ids], ...] for an 8 x 8 array, from JAX."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8")
    done = subprocess.run(
        [python, "-c", _LAYOUT_SCRIPT, json.dumps(SPECS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout)


def sharding_svg(layouts: list) -> str:
    cell, gap, top = 22, 40, 34
    panel = 8 * cell
    body = []
    for k, (spec, blocks) in enumerate(zip(SPECS, layouts)):
        x0 = 20 + k * (panel + gap)
        name = "P(" + ", ".join("None" if s is None else repr(s) for s in spec) + ")"
        body.append(_text(x0 + panel / 2, 20, name, 13))
        for (rows, cols), devices in blocks:
            colour = COLOURS[devices[0] % len(COLOURS)] if len(devices) == 1 else "#bbbbbb"
            x, y = x0 + cols[0] * cell, top + rows[0] * cell
            w, h = (cols[1] - cols[0]) * cell, (rows[1] - rows[0]) * cell
            body.append(
                f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{colour}" fill-opacity="0.55" '
                f'stroke="#333" stroke-width="1"/>'
            )
            label = ",".join(str(d) for d in devices)
            body.append(_text(x + w / 2, y + h / 2 + 4, label, 11 if len(label) < 8 else 9))
    body.append(
        _text(20, top + panel + 22, "An 8 x 8 array on a 2 x 4 mesh (axes 'rows', 'cols').", 11, "start")
    )
    body.append(
        _text(
            20,
            top + panel + 38,
            "Each block names the devices that hold it; grey blocks are held by several.",
            11,
            "start",
        )
    )
    return _svg(20 + 3 * panel + 2 * gap + 20, top + panel + 48, body, "Sharding layouts of an 8 x 8 array")


# ---------------------------------------------------------------------------------------------
# A pipeline schedule.


def gpipe_schedule(stages: int, microbatches: int) -> dict[tuple[int, int], str]:
    """(stage, step) -> what it does: forward F<m> at step s + m, backward B<m> after every forward."""
    plan = {}
    for m in range(microbatches):
        for s in range(stages):
            plan[(s, s + m)] = f"F{m}"
            plan[(s, stages + microbatches - 1 + (stages - 1 - s) + m)] = f"B{m}"
    return plan


def pipeline_svg(stages: int = 4, microbatches: int = 6) -> str:
    plan = gpipe_schedule(stages, microbatches)
    steps = max(step for _, step in plan) + 1
    cell, left, top = 30, 70, 30
    body = [_text(left + steps * cell / 2, 18, f"GPipe: {stages} stages, {microbatches} microbatches", 13)]
    for s in range(stages):
        body.append(_text(left - 8, top + s * cell + cell / 2 + 4, f"stage {s}", 11, "end"))
        for t in range(steps):
            work = plan.get((s, t))
            colour = "#ffffff" if work is None else (COLOURS[0] if work.startswith("F") else COLOURS[1])
            body.append(
                f'<rect x="{left + t * cell}" y="{top + s * cell}" width="{cell}" height="{cell}" '
                f'fill="{colour}" fill-opacity="{0.6 if work else 1}" stroke="#999"/>'
            )
            if work:
                body.append(_text(left + t * cell + cell / 2, top + s * cell + cell / 2 + 4, work, 10))
    idle = stages * steps - len(plan)
    body.append(
        _text(
            left,
            top + stages * cell + 22,
            f"White cells are the bubble: {idle} of {stages * steps} stage-steps idle.",
            11,
            "start",
        )
    )
    body.append(
        _text(
            left,
            top + stages * cell + 38,
            "In the forward pass alone, (stages - 1) / (microbatches + stages - 1) of each stage's time.",
            11,
            "start",
        )
    )
    return _svg(left + steps * cell + 20, top + stages * cell + 48, body, "A GPipe pipeline schedule")


# ---------------------------------------------------------------------------------------------
# The layers a graded notebook runs in.

LAYERS = (
    (
        "the kit's process (trusted: papermill, the judge)",
        "opens the run's scratch folder only through labkit/run/scratch.py",
    ),
    (
        "a bubblewrap sandbox (the warm server's, or a cold run's own)",
        "no network, read-only system and kit folder, its own process ids, no capabilities",
    ),
    (
        "the run's own namespaces and limits (warm: nested by labkit/run/nest.py)",
        "scratch/ the only writable place; cgroups for processes, memory, CPU; time and output caps",
    ),
    ("the student's kernel", "runs the notebook; what it reports is signed, then judged outside"),
)


def layers_svg() -> str:
    width, step, margin = 640, 40, 12
    height = 10 + len(LAYERS) * step + (len(LAYERS) - 1) * margin + 10
    body = []
    for k, (name, note) in enumerate(LAYERS):
        inset, top = k * 16, 10 + k * step
        bottom = height - 10 - k * margin
        body.append(
            f'<rect x="{10 + inset}" y="{top}" width="{width - 20 - 2 * inset}" height="{bottom - top}" '
            f'rx="8" fill="{COLOURS[k % len(COLOURS)]}" fill-opacity="0.18" stroke="#555"/>'
        )
        body.append(_text(22 + inset, top + 17, name, 12, "start"))
        body.append(_text(22 + inset, top + 31, note, 10, "start", "#555"))
    return _svg(width, height, body, "The layers a graded notebook runs in")


# ---------------------------------------------------------------------------------------------
# The pipeline, and the trust boundary it crosses.

# (stage, the modules doing it, trusted?): in the order a submission goes through them. The student's
# kernel is the one stage on the sandbox's side.
STAGES = (
    (
        "collect",
        "grading/intake/collect.py (discover), grading/intake/lms.py (collect), grading/state/roster.py, grading/state/history.py",
        True,
    ),
    (
        "run",
        "run/execute.py, run/kernel.py (papermill); the kernel started by run/sandbox.py, run/warm.py",
        True,
    ),
    ("the student's kernel", "cells; judge/harness.py, judge/plaindata.py, facts.py", False),
    (
        "read back",
        "run/scratch.py: the signed results, never through a link; judge/verify.py runs the programs",
        True,
    ),
    ("judge", "judge/judge.py: a pytest session running the lab's tests (checks.py)", True),
    (
        "rows and cost cards",
        "grading/running/rows.py (make_row), grading/state/policy.py, cost.py (chips.toml)",
        True,
    ),
    (
        "outputs",
        (
            "grading/publish/scoreboard.py, grading/publish/pages.py, grading/classwide/leaderboard.py, student/report.py, "
            "grading/publish/gradescope.py"
        ),
        True,
    ),
)


def architecture_svg() -> str:
    width, box_h, gap, top = 960, 40, 14, 34
    trusted_w, sandbox_x = 600, 630
    rows = len(STAGES)
    height = top + rows * (box_h + gap) + 40
    marker = (
        '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>'
    )
    body = [
        marker,
        _text(10 + trusted_w / 2, 20, "the kit's process: trusted", 13),
        _text(sandbox_x + (width - 10 - sandbox_x) / 2, 20, "bubblewrap sandbox: untrusted", 13),
    ]
    x_line = (10 + trusted_w + sandbox_x) / 2
    body.append(
        f'<line x1="{x_line}" y1="28" x2="{x_line}" y2="{height - 44}" stroke="#a4161a" '
        'stroke-width="2" stroke-dasharray="6 4"/>'
    )
    centres = []
    for k, (stage, modules, trusted) in enumerate(STAGES):
        y = top + k * (box_h + gap)
        x, w = (10, trusted_w) if trusted else (sandbox_x, width - 10 - sandbox_x)
        colour = COLOURS[0] if trusted else COLOURS[2]
        body.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{box_h}" rx="6" fill="{colour}" '
            'fill-opacity="0.15" stroke="#555"/>'
        )
        body.append(_text(x + 10, y + 16, f"{k + 1}. {stage}", 12, "start"))
        body.append(_text(x + 10, y + 31, modules, 10, "start", "#444"))
        centres.append((x, w, y))
    body += [_arrow(here, there, box_h) for here, there in itertools.pairwise(centres)]
    body.append(
        _text(
            10,
            height - 26,
            "Configurations (course/configs.py) and where the labs are (course/catalog.py) "
            "are data that every stage asks for;",
            10,
            "start",
        )
    )
    body.append(
        _text(
            10,
            height - 12,
            "the engines (grade --shard, grading/slurm.py, infra/k8s) run this same "
            "pipeline on parts of a class, and merge.",
            10,
            "start",
        )
    )
    return _svg(width, height, body, "The grading pipeline and its trust boundary")


def _arrow(here: tuple, there: tuple, box_h: int) -> str:
    """The arrow from one stage's box (x, width, y) to the next's: straight down, or across the boundary."""
    (x0, w0, y0), (x1, w1, y1) = here, there
    if x0 == x1:
        return (
            f'<line x1="{x0 + 40}" y1="{y0 + box_h}" x2="{x1 + 40}" y2="{y1 - 1}" stroke="#555" '
            'marker-end="url(#arrow)"/>'
        )
    right = x1 > x0
    a = (x0 + w0 if right else x0, y0 + box_h / 2)
    b = (x1 - 2 if right else x1 + w1 + 2, y1 + box_h / 2)
    return f'<line x1="{a[0]}" y1="{a[1]}" x2="{b[0]}" y2="{b[1]}" stroke="#555" marker-end="url(#arrow)"/>'


def write_all(out: Path, python: str = sys.executable) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    pictures = {
        "sharding.svg": sharding_svg(sharding_layouts(python)),
        "pipeline.svg": pipeline_svg(),
        "layers.svg": layers_svg(),
        "architecture.svg": architecture_svg(),
    }
    for name, text in pictures.items():
        (out / name).write_text(text)
    return [out / name for name in pictures]


if __name__ == "__main__":
    for path in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "build/pictures")):
        print(path)
