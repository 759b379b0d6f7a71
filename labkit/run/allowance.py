"""What one notebook run may use (`Limits`): memory, processes, output, file size, disk, the network, and
how it is isolated; sizes as people write them (4G, 512M), and the flags of the commands that run notebooks.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from labkit.run.modes import AUTO

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """What one notebook run may use. Each has a default and a flag of `python -m labkit lab`."""

    memory: int = 4 * GiB  # bytes: each process's address space, and the whole run's where cgroups allow
    processes: int = 1024  # processes and threads the run may have at once (JAX starts threads per core)
    output: int = 10 * MiB  # bytes of output kept: in the executed notebook, and in the run's log
    file_size: int = 1 * GiB  # the largest file a run may write
    disk: int = 2 * GiB  # bytes the run may hold in its scratch folder (and in each of /tmp and /dev/shm)
    network: bool = False  # True only where a run's processes must reach each other (see docs/sandbox.md)
    isolation: str = AUTO  # SANDBOX, AUTO, LIMITS_ONLY or POD (see ISOLATIONS); grading asks for SANDBOX

    def to_json(self) -> dict:
        return asdict(self)


DEFAULT_LIMITS = Limits()


def parse_size(text: str | int) -> int:
    """Bytes from '4G', '512M', '1.5GiB', '64k' or a plain number of bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (write e.g. 4G, 512M or a number of bytes)")
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[m.group(2).lower()]
    value = int(float(m.group(1)) * scale)
    if value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return value


def add_arguments(parser) -> None:
    """The limit flags of a command that runs notebooks (`lab`, `grade`)."""
    d = DEFAULT_LIMITS
    parser.add_argument(
        "--memory",
        type=parse_size,
        default=d.memory,
        metavar="SIZE",
        help=f"memory one notebook run may use, e.g. 4G (default {format_size(d.memory)})",
    )
    parser.add_argument(
        "--max-processes",
        type=int,
        default=d.processes,
        metavar="N",
        help=f"processes and threads one run may have at once (default {d.processes})",
    )
    parser.add_argument(
        "--disk",
        type=parse_size,
        default=d.disk,
        metavar="SIZE",
        help=f"what one run may write to disk (its scratch folder; /tmp and /dev/shm each) before it is "
        f"stopped (default {format_size(d.disk)})",
    )
    parser.add_argument(
        "--max-output",
        type=parse_size,
        default=d.output,
        metavar="SIZE",
        help=f"output of one run that is kept; the rest is cut (default {format_size(d.output)})",
    )


def limits_from_args(args) -> Limits:
    return Limits(
        memory=args.memory,
        processes=args.max_processes,
        output=args.max_output,
        disk=getattr(args, "disk", DEFAULT_LIMITS.disk),
        isolation=getattr(args, "isolation", AUTO),
    )


def format_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


def largest_message(limits: Limits) -> int:
    """The largest message from a kernel this process accepts: a larger one ends the run's output (memory safety)."""
    return max(4 * limits.output, 64 << 20)
