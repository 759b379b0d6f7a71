"""A one-node Slurm for the kit's tests: Debian's slurm-wlm and munge, started here, stopped by pid.

`start(folder)` writes a slurm.conf for this host alone (ports picked free, state and spool under
`folder`), starts munged where none runs, then slurmctld and slurmd in the foreground of their own
processes, and waits until the node takes jobs. It needs root (slurmd runs jobs as their users).
Clients find the cluster through SLURM_CONF in the environment `Cluster.env` gives.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def missing() -> str | None:
    """Why no cluster can be started here, or None."""
    if os.geteuid() != 0:
        return "a one-node Slurm needs root (slurmd runs each job as its user)"
    absent = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): apt-get install slurm-wlm munge"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    folder: Path
    env: dict[str, str]
    processes: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=False, **kw)

    def stop(self) -> None:
        self.run("scancel", "--full", "--user", "root")
        for p in reversed(self.processes):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start(folder: Path) -> Cluster:
    folder = Path(folder)
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20) - 1024
    conf = folder / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=labkit-test",
                f"SlurmctldHost={host}",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "AuthType=auth/munge",
                f"StateSaveLocation={folder / 'state'}",
                f"SlurmdSpoolDir={folder / 'spool'}",
                f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
                f"SlurmdPidFile={folder / 'slurmd.pid'}",
                f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={folder / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "JobCompType=jobcomp/none",
                "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                "ReturnToService=2",
                "MinJobAge=2",
                "KillWait=5",
                f"NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN",
                "PartitionName=grading Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    env = dict(os.environ, SLURM_CONF=str(conf))
    env["PATH"] = "/usr/sbin:" + env.get("PATH", "")
    cluster = Cluster(folder, env)
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True, check=False).returncode != 0:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        subprocess.run(["munged", "--force"], env=env, check=True)  # daemonizes; it stays for the machine
    cluster.processes.append(
        subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(conf)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    time.sleep(1)
    cluster.processes.append(
        subprocess.Popen(
            ["slurmd", "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = cluster.run("sinfo", "--noheader", "--format=%T").stdout.strip()
        if state in ("idle", "mixed"):
            return cluster
        time.sleep(1)
    logs = "".join(
        (folder / "log" / n).read_text()[-2000:]
        for n in ("slurmctld.log", "slurmd.log")
        if (folder / "log" / n).exists()
    )
    cluster.stop()
    raise RuntimeError(f"the one-node Slurm did not come up (sinfo: {state!r}):\n{logs}")
