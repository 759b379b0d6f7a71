"""JAX's compilation cache when grading: the reference runs fill it, a student's run only reads it.

One student hands in lab 3's reference with two cells around it: the first counts the cache hits
JAX reports, the last tries to list the cache folder and to write into it, and writes what it saw
into its scratch folder. Graded with warm and with cold starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_variants import LAB_3_TESTS

from labkit.course import catalog
from labkit.run import modes

pytestmark = pytest.mark.skipif(
    modes.isolation()[0] != modes.BUBBLEWRAP, reason="bubblewrap cannot make a sandbox on this machine"
)

FIRST = """\
import jax.monitoring as _m
_seen = {"hits": 0}
def _count(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        _seen["hits"] += 1
_m.register_event_listener(_count)
"""
LAST = """\
import json, os
_folder = os.environ["JAX_COMPILATION_CACHE_DIR"]
try:
    os.listdir(_folder)
    _seen["listed"] = True
except OSError as e:
    _seen["listed"] = type(e).__name__
try:
    open(os.path.join(_folder, "planted"), "w").write("an entry for the next student")
    _seen["wrote"] = True
except OSError as e:
    _seen["wrote"] = type(e).__name__
print("cache_seen=" + json.dumps(_seen))  # into papermill's copy, in the run's kit folder
"""


def _graded(tmp_path: Path, start: str) -> tuple[dict, Path]:
    nb = json.loads(catalog.lab(3).reference.read_text())
    cell = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": []}
    nb["cells"] = [dict(cell, source=FIRST, id="first"), *nb["cells"], dict(cell, source=LAST, id="last")]
    subs = tmp_path / "subs"
    (subs / "ada").mkdir(parents=True)
    (subs / "ada" / "lab-3.ipynb").write_text(json.dumps(nb))
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(subs),
            "--out",
            str(out),
            "--labs",
            "3",
            "--configs",
            "cpu-8",
            "--jobs",
            "1",
            "--start",
            start,
        ],
        cwd=catalog.ROOT,
        text=True,
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads((out / "scoreboard.json").read_text())["rows"][0]
    assert (row["status"], row["passed"], row["start"]) == ("ok", LAB_3_TESTS, start), row
    executed = json.loads(next((out / "work").rglob("executed.ipynb")).read_text())
    printed = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    seen = json.loads(printed.split("cache_seen=", 1)[1].splitlines()[0])
    return seen, out / ".jax-cache"


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_students_run_hits_the_cache_the_reference_filled_and_can_neither_list_nor_write_it(
    tmp_path, start
):
    seen, folder = _graded(tmp_path, start)
    assert seen["hits"] > 0, seen  # programs the reference compiled were not compiled again
    assert seen["listed"] == "PermissionError", seen  # entries are opened by name, never listed
    assert seen["wrote"] in ("OSError", "PermissionError"), seen  # read-only in the run's sandbox
    assert not (folder / "planted").exists()
    assert len(list(folder.iterdir())) > 0  # this process may list it; the reference runs wrote entries
