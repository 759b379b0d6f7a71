"""The course image: its size and what takes it, cold build, rebuild after one notebook, run to a result.

    .venv/bin/python benchmarks/bench_image.py [--image labkit:bench] [--repeat 3] [--skip-cold]

Uses the Docker engine that answers, or starts the kit's own as root (docker/engine.py; stopped
again at the end when this script started it). Builds with `make docker-build` (on the Debian base
of `make docker-base`, made first when missing), with the host's CA bundle when there is one.

* size: the image as the engine stores it (uncompressed), each layer of `docker history`, and the
  largest packages of the environment (`du` inside the image);
* cold build: `docker build --no-cache` (every layer rebuilt; uv's download cache, a BuildKit cache
  mount, stays warm, as on any machine that built the image once), then a warm one (all cached);
* rebuild after a change to one notebook: a copy of the build context with one markdown cell added
  to labs/lab-3.ipynb, built with the layer cache of the first;
* `docker run` to the first lab result: `docker run IMAGE make lab-3 CONFIGS=cpu-1` on a copy of
  labs/, from the command to its exit (a fresh container, a kernel, the judge), median of --repeat;
  and the default command (cpu-1 and cpu-8), once.

Prints markdown for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CA = Path("/etc/ssl/certs/ca-certificates.crt")
_spec = importlib.util.spec_from_file_location("labkit_docker_engine", ROOT / "docker" / "engine.py")
engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine)


def sh(
    cmd: list[str], env: dict, cwd: Path = ROOT, check: bool = True
) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if check and done.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done


def docker(env: dict, *args: str) -> str:
    return sh(["bash", str(ROOT / "docker" / "client.sh"), *args], env)[1].stdout


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def context_copy(dest: Path) -> Path:
    """The files of the checkout (tracked and untracked, not ignored), as a build context of its own."""
    names = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="labkit:bench")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-cold", action="store_true", help="leave out the --no-cache build")
    args = parser.parse_args()

    env, started, why = engine.start()
    if env is None:
        sys.exit(f"no Docker engine: {why}")
    try:
        ca = [f"CA_CERTS={CA}"] if CA.exists() else []
        if (
            subprocess.run(
                ["bash", str(ROOT / "docker" / "client.sh"), "image", "inspect", "labkit-base:bookworm"],
                env=env,
                capture_output=True,
                check=False,
            ).returncode
            != 0
        ):
            base_s, _ = sh(["make", "docker-base"], env)
            print(f"base image (debootstrap + import): {base_s:.0f} s")
        client = ["bash", str(ROOT / "docker" / "client.sh")]
        build = [*client, "build", "--build-arg", "BASE_IMAGE=labkit-base:bookworm"]
        if ca:
            build += ["--secret", f"id=ca,src={CA}"]
        figures = {}
        if not args.skip_cold:
            figures["cold"], _ = sh([*build, "--no-cache", "-t", args.image, "."], env)
        figures["warm"], _ = sh([*build, "-t", args.image, "."], env)
        with tempfile.TemporaryDirectory(prefix="labkit-bench-") as tmp:
            ctx = context_copy(Path(tmp) / "kit")
            sh([*build, "-t", args.image + "-changed", "."], env, cwd=ctx)  # same content: all cached
            nb = json.loads((ctx / "labs" / "lab-3.ipynb").read_text())
            nb["cells"].append(
                {
                    "cell_type": "markdown",
                    "metadata": {},
                    "id": "bench-change",
                    "source": f"A change made at {time.time()}.",
                }
            )
            (ctx / "labs" / "lab-3.ipynb").write_text(json.dumps(nb, indent=1))
            figures["notebook"], _ = sh([*build, "-t", args.image + "-changed", "."], env, cwd=ctx)
        docker(env, "image", "rm", args.image + "-changed")

        size = int(docker(env, "image", "inspect", "-f", "{{.Size}}", args.image))
        layers = [
            line.split("\t", 1)
            for line in docker(
                env,
                "history",
                "--no-trunc",
                "--human=false",
                "--format",
                "{{.Size}}\t{{.CreatedBy}}",
                args.image,
            ).splitlines()
        ]
        packages = docker(
            env,
            "run",
            "--rm",
            "--entrypoint",
            "sh",
            args.image,
            "-c",
            "cd /home/student/kit/.venv/lib/python3*/site-packages && du -s --block-size=1 * "
            "| sort -rn | head -n 8",
        )

        runs = []
        with tempfile.TemporaryDirectory(prefix="labkit-bench-run-") as tmp:
            labs = Path(tmp) / "labs"
            shutil.copytree(ROOT / "labs", labs)
            mount = ["-v", f"{labs}:/home/student/kit/labs"]
            for _ in range(args.repeat):
                seconds, _ = sh(
                    [*client, "run", "--rm", *mount, args.image, "make", "lab-3", "CONFIGS=cpu-1"],
                    env,
                    check=False,
                )
                runs.append(seconds)
            default_s, _ = sh([*client, "run", "--rm", *mount, args.image], env, check=False)
        load = os.getloadavg()[0]
    finally:
        if started:
            engine.stop()

    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    print(f"\n### {when} UTC, load average {load:.1f} at the end\n")
    print("| figure | value |\n| --- | --- |")
    print(f"| image size, uncompressed | {mb(size)} |")
    if "cold" in figures:
        print(f"| cold build (`--no-cache`, uv's downloads cached) | {figures['cold']:.0f} s |")
    print(f"| build with every layer cached | {figures['warm']:.1f} s |")
    print(f"| rebuild after a change to one notebook | {figures['notebook']:.1f} s |")
    print(
        f"| `docker run ... make lab-3 CONFIGS=cpu-1` to its result (median of {len(runs)}) | "
        f"{statistics.median(runs):.1f} s |"
    )
    print(f"| `docker run IMAGE` (make lab-3: cpu-1 and cpu-8) | {default_s:.1f} s |")
    print("\nLayers (`docker history`):\n\n| size | step |\n| ---: | --- |")
    for n, step in layers:
        if int(n) > 1_000_000:
            print(f"| {mb(int(n))} | `{step.strip()[:110]}` |")
    print("\nLargest packages in the environment:\n\n| size | package |\n| ---: | --- |")
    for line in packages.splitlines():
        n, name = line.split(maxsplit=1)
        print(f"| {mb(int(n))} | {name} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
