"""Grade a class through a one-node Slurm as an ordinary user (run by test_as_another_user, as root).

    python tests/kit/slurm_as_user.py STATE SUBMISSIONS OUT HOME UID

Starts the cluster (slurm_cluster) with its state in STATE, runs `python -m labkit slurm-grade` as
UID (setpriv, a clean environment whose HOME is HOME), prints what it printed and its exit status
as JSON, cancels whatever that user left queued and stops the cluster. The caller runs this in a
mount namespace where the kit's interpreter is reachable by others: slurmd, started here, runs
the user's jobs in that namespace too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import slurm_cluster

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    state, submissions, out, home, uid = sys.argv[1:6]
    cluster = slurm_cluster.start(Path(state))
    try:
        keep = {k: cluster.env[k] for k in ("PATH", "SLURM_CONF")}
        as_user = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in keep.items()),
            f"HOME={home}",
            "NO_COLOR=1",
        ]
        grade = [
            sys.executable,
            "-m",
            "labkit",
            "slurm-grade",
            "--submissions",
            submissions,
            "--out",
            out,
            "--shards",
            "2",
            "--labs",
            "1",
            "--configs",
            "cpu-1",
            "--jobs",
            "1",
            "--every",
            "2",
        ]
        done = subprocess.run(
            [*as_user, *grade], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
        )
        queued = cluster.run("squeue", "--noheader", "--format=%u").stdout.split()
        print(
            json.dumps(
                {
                    "returncode": done.returncode,
                    "stdout": done.stdout,
                    "stderr": done.stderr,
                    "queued_by": sorted(set(queued)),
                }
            )
        )
    finally:
        cluster.run("scancel", "--full", "--user", uid)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
