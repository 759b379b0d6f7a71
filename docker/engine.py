"""A Docker engine for the kit's container tests and benchmarks: the one there is, or one started here.

    python3 docker/engine.py status     which engine the tests would use, or why none
    python3 docker/engine.py start      as root: start the kit's own engine (prints its DOCKER_HOST)
    python3 docker/engine.py stop       stop the kit's own engine, if this command or the tests started it

An engine that answers (the one DOCKER_HOST names, or the client's default) is used as it is. Else,
as root with `dockerd` installed (Debian: docker.io), the kit starts its own: no systemd needed, its
socket, state and pid file under /run/labkit-docker, its images and build cache under
/var/cache/labkit-docker (LABKIT_DOCKER_CACHE), which stays between runs, so a second `make test` on
the same machine reuses the base image, the layers and uv's downloads. It is stopped by its pid.
Only the Python standard library is used (the tests and benchmarks load this file by path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ["bash", str(ROOT / "docker" / "client.sh")]
RUN_DIR = Path("/run/labkit-docker")
SOCKET = RUN_DIR / "docker.sock"
PIDFILE = RUN_DIR / "dockerd.pid"
HOST = f"unix://{SOCKET}"


def cache_dir() -> Path:
    return Path(os.environ.get("LABKIT_DOCKER_CACHE", "/var/cache/labkit-docker"))


def answers(env: dict[str, str]) -> tuple[bool, str]:
    """(True, "") when docker/client.sh reaches an engine with `env`, else (False, its one line)."""
    try:
        done = subprocess.run([*CLIENT, "version"], env=env, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False, "the Docker engine did not answer in 60 s"
    return done.returncode == 0, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


def _own_pid() -> int | None:
    try:
        pid = int(PIDFILE.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _has_bridge(net: Path = Path("/sys/class/net")) -> bool:
    """Whether the default bridge the kit's engine made (docker0) is still there. It has been seen to go
    away on the kit's test machines while the engine ran; every build and run then fails with "could not
    find bridge docker0"."""
    return (net / "docker0").exists()


def start(timeout: float = 120) -> tuple[dict[str, str] | None, bool, str]:
    """(environment for the docker client, whether this call started the engine, why none).

    The engine there is when one answers; else the kit's own (already running, or started now)."""
    env = dict(os.environ)
    ok, why = answers(env)
    if ok:
        return env, False, ""
    own = dict(os.environ, DOCKER_HOST=HOST)
    if _own_pid() and answers(own)[0]:
        if _has_bridge():
            return own, False, ""
        stop()  # it answers but cannot attach a container to its bridge: a new start makes the bridge again
    if os.geteuid() != 0:
        return None, False, f"{why}; and the kit can start its own engine only as root"
    dockerd = subprocess.run(["bash", "-c", "command -v dockerd"], capture_output=True, text=True, check=False).stdout.strip()
    if not dockerd:
        return None, False, f"{why}; and dockerd is not installed (Debian: apt-get install docker.io)"
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    log = open(cache / "dockerd.log", "ab")  # noqa: SIM115 - dockerd keeps writing it
    proc = subprocess.Popen([dockerd, "--host", HOST, "--data-root", str(cache / "data"),
                             "--exec-root", str(RUN_DIR / "exec"), "--pidfile", str(PIDFILE)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (cache / "dockerd.log").read_text(errors="replace").strip().splitlines()[-3:]
            return None, False, f"dockerd exited with status {proc.returncode}: {' / '.join(tail)}"
        if SOCKET.exists() and answers(own)[0]:
            return own, True, ""
        time.sleep(0.5)
    stop()
    return None, False, f"dockerd did not answer at {HOST} within {timeout:.0f} s (see {cache / 'dockerd.log'})"


def stop(timeout: float = 60) -> bool:
    """Stop the kit's own engine by its pid (SIGTERM, then SIGKILL); False when none was running."""
    pid = _own_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # reap it when it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return True


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "status"
    if what == "start":
        env, _, why = start()
        if env is None:
            print(f"no Docker engine: {why}", file=sys.stderr)
            return 1
        print(f"export DOCKER_HOST={env.get('DOCKER_HOST', '')}" if env.get("DOCKER_HOST") else "the engine there is answers")
        return 0
    if what == "stop":
        print("stopped" if stop() else "the kit's own engine was not running")
        return 0
    if what == "status":
        ok, why = answers(dict(os.environ))
        own = _own_pid()
        print("an engine answers" if ok else f"no engine answers: {why}")
        print(f"the kit's own engine: pid {own}, DOCKER_HOST={HOST}" if own else "the kit's own engine: not running")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
