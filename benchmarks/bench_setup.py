"""A student's set-up, measured: a fresh clone to the first lab result, cold and warm, and the size of .venv.

    python3 benchmarks/bench_setup.py [--repeat 1] [--keep DIR]

For each repeat: clone this checkout into a new folder, then time `make lab-3` (the README's first
command: set-up, then lab 3 on cpu-1 and cpu-8) once with an empty uv cache (every wheel downloaded
from the package index) and once in a second fresh clone with the cache the first run filled. uv
itself comes from the PATH when it is there, as for a user who has it; with --bootstrap-uv the
clones fetch it into .tools/ as a machine without uv does. Prints seconds and `du` of the lean
.venv (goals: cold <= 90 s, warm <= 30 s, .venv <= 750 MB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def du(path: Path) -> int:
    return int(
        subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    )


def first_lab(folder: Path, cache: Path, env: dict[str, str]) -> tuple[float, str]:
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(folder)], check=True)
    started = time.monotonic()
    done = subprocess.run(
        ["make", "--no-print-directory", "lab-3"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=dict(env, UV_CACHE_DIR=str(cache)),
        check=False,
    )
    seconds = time.monotonic() - started
    if "not implemented yet" not in done.stdout:
        sys.exit(f"the first lab run gave no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument(
        "--bootstrap-uv", action="store_true", help="hide uv from the PATH: the clones fetch their own"
    )
    p.add_argument("--keep", type=Path, default=None, help="keep the clones and caches here")
    args = p.parse_args()
    env = dict(os.environ, NO_COLOR="1")
    if args.bootstrap_uv:
        env["PATH"] = ":".join(d for d in env["PATH"].split(":") if not (Path(d) / "uv").exists())
    else:
        uv = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
        env["PATH"] = f"{Path(uv).parent}:{env['PATH']}"
    cold, warm, size = [], [], 0
    for i in range(args.repeat):
        base = Path(tempfile.mkdtemp(prefix="bench-setup-", dir=args.keep))
        cache = base / "uv-cache"
        seconds, out = first_lab(base / "cold", cache, env)
        cold.append(seconds)
        print(
            f"run {i + 1}: fresh clone, empty uv cache: {seconds:.1f} s to the first lab result", flush=True
        )
        print("  " + "\n  ".join(out.splitlines()[:3]), flush=True)
        seconds, _ = first_lab(base / "warm", cache, env)
        warm.append(seconds)
        print(f"run {i + 1}: fresh clone, warm uv cache:  {seconds:.1f} s", flush=True)
        size = du(base / "warm" / ".venv")
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(
        f"\nmedian over {args.repeat}: cold {statistics.median(cold):.1f} s (goal <= 90 s), "
        f"warm {statistics.median(warm):.1f} s (goal <= 30 s), lean .venv {size / 1e6:.0f} MB (goal <= 750 MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
