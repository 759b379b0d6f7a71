"""One kernel: papermill in the kit's own process, the student's Jupyter kernel in a sandbox, Unix sockets
in between.

`papermill_run` runs a prepared notebook with a kernel started through `sandbox.launch` (or forked by the
warm server), under the run's limits; a thread measures what the run holds on disk and stops it past its
allowance. It returns a `KernelRun`: how the kernel ended, never what the notebook computed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.run import allowance, modes, processes, sandbox, scratch
from labkit.run.allowance import Limits


@dataclass
class KernelRun:
    """How one kernel's run ended, as seen from papermill's side."""

    seconds: float = 0.0
    timed_out: bool = False
    died: bool = False  # the kernel ended before the notebook did (a crash, a kill, out of memory)
    returncode: int | None = None
    isolation: str = ""
    failure: str = ""  # what papermill raised, when it was not the student's cells
    start: str = ""  # "warm" or "cold" (see RunRecord.start)
    cpu_share: str = ""  # see RunRecord.cpu_share
    disk: str = ""  # why the run was stopped for what it wrote to disk (see `_watch_disk`), when it was


_PAPERMILL_LOCK = threading.Lock()
_LIVE_KERNELS: set = set()  # the kernel managers of runs going on now (`end_kernels_in`)


DISK_POLL = 0.2  # seconds between two measures of what a run holds on disk


def _watch_disk(folder: Path, allowed: int, ran: KernelRun, stop, done: threading.Event, pids=list) -> None:
    """While the run goes on, measure its scratch folder every DISK_POLL seconds (or four times as long as the last
    measure took, when longer: the kit's other runs share this process); past `allowed` bytes, stop the run,
    `ran.disk` saying why. Files the run removed but still holds open count too (`pids()`: the run's processes).

    Between two measures a run may write past the limit what the disk takes in that time (each file at most
    `allowed` bytes: RLIMIT_FSIZE, see `sandbox.run_rlimits`); the run is measured once more when it has ended."""
    pause = DISK_POLL
    while not done.wait(pause):
        began = time.monotonic()
        if _measure_disk(folder, allowed, ran, pids()):
            stop()
            return
        pause = max(
            DISK_POLL, 4 * (time.monotonic() - began)
        )  # a folder of many names is measured less often


def _measure_disk(folder: Path, allowed: int, ran: KernelRun, pids: list[int] = ()) -> bool:
    """Whether the run's scratch folder, with the removed files its processes `pids` hold open, takes more than
    `allowed` bytes (`scratch.usage`, `processes.held_after_removal`); if so, `ran.disk` says it."""

    try:
        used = scratch.usage(folder, allowed)
        if used <= allowed and pids:
            used += processes.held_after_removal(pids, os.stat(folder).st_dev)
    except scratch.Refused as e:
        ran.disk = f"the notebook's files could not be measured ({e}), so the run was stopped"
        return True
    except OSError:
        return False  # the folder is gone: the run is over
    if used <= allowed:
        return False
    ran.disk = (
        f"the notebook wrote more than {allowance.format_size(allowed)} to disk, so the run was stopped"
    )
    return True


def _run_processes_of(km) -> list[int]:
    """The processes of the run whose kernel `km` started (none before it has started)."""
    run = km.sandboxed
    return [run.pid, *sandbox.descendants(run.pid)] if run is not None else []


def papermill_run(
    input_path: Path,
    output_path: Path,
    folders: scratch.RunFolders,
    env: dict,
    limits: Limits,
    key: str,
    timeout: float,
    log_name: str = "run.log",
    network=None,
    kernels: list | None = None,
    warm=None,
    cache=None,
) -> KernelRun:
    """Execute `input_path` into `output_path` with papermill, on a sandboxed kernel working in `workdir`.

    Every cell runs even after one raised. The kernel reads the run's key from a file only it
    may read (`seal`), which it removes before the first cell; after `timeout` seconds, or when
    the notebook is done, the kernel and everything it started are ended. papermill's output and
    the run's log are in the kit folder; the kernel works in the scratch folder (`folders`).
    """
    with _PAPERMILL_LOCK:  # the first use imports papermill and registers the engine, once
        from labkit.run import papermillengine

        engine = papermillengine.ENGINE
    workdir = folders.scratch
    key_file = _key_file(folders, key, limits)
    ran = KernelRun()
    start = time.monotonic()
    with open(folders.kit / log_name, "wb") as log:
        from labkit.run.kernelmanager import SandboxedKernelManager

        km = SandboxedKernelManager(kernel_name="python3")
        km.setup(
            workdir, env, limits, log, _seal(key_file, cache), network, warm, cache, readable=folders.kit
        )
        _LIVE_KERNELS.add(km)
        if kernels is not None:
            kernels.append(km)
        try:
            with _watched(km, ran, workdir, limits.disk, timeout):
                _execute(input_path, output_path, km, engine, ran, limits, timeout)
        finally:
            _LIVE_KERNELS.discard(km)  # before it ends: a peer's stop never signals a process that is gone
            km.end()
    _how_it_ended(ran, km, workdir, limits)
    scratch.unlink(workdir, key_file.name)
    ran.seconds = time.monotonic() - start
    ran.returncode = km.sandboxed.returncode if km.sandboxed is not None else None
    ran.isolation = km.sandboxed.isolation if km.sandboxed is not None else modes.isolation()[0]
    ran.start = km.start_kind
    ran.cpu_share = km.sandboxed.cpu_share if km.sandboxed is not None else ""
    return ran


def _how_it_ended(ran: KernelRun, km, workdir: Path, limits: Limits) -> None:
    """Mark `ran` died, and why, where the run went over its disk or a cell asked the kernel to exit."""
    if not ran.disk:  # once more, now that nothing of the run is left: what it wrote after the last measure
        _measure_disk(workdir, limits.disk, ran)
    if ran.disk:
        ran.died, ran.failure = True, ran.disk
    elif km.asked_to_exit and not ran.timed_out:
        ran.died, ran.failure = (
            True,
            "a cell asked it to exit (exit() or quit()), so the cells after it never ran",
        )


def _key_file(folders: scratch.RunFolders, key: str, limits: Limits) -> Path:
    """The file the harness reads its key from, in the scratch folder, made only for the kernel to read."""
    workdir = folders.scratch
    return scratch.create(
        workdir,
        f".labkit-key-{secrets.token_hex(8)}.json",
        json.dumps(
            {
                "key": key,
                "calls": str(folders.kit / "calls.json"),
                "results": str(workdir / "results.json"),
                "output": limits.output,
            }
        ).encode(),
    )


def _seal(key_file: Path, cache) -> list[str]:
    """What the kernel runs before the first cell: the harness sealed with its key (and JAX's cache quiet)."""
    seal = ["import labkit.judge.harness", f"labkit.judge.harness.seal({str(key_file)!r})", "del labkit"]
    if cache is not None:
        from labkit.run import jaxcache

        seal.insert(0, jaxcache.QUIET)
    return seal


@contextlib.contextmanager
def _watched(km, ran: KernelRun, workdir: Path, disk: int, timeout: float):
    """While the notebook runs: its kernel stopped after `timeout` seconds (`ran.timed_out`), or as soon as
    the scratch folder holds more than `disk` bytes (`_watch_disk`)."""
    watchdog = threading.Timer(timeout, lambda: (setattr(ran, "timed_out", True), km.stop_kernel()))
    watchdog.daemon = True
    watchdog.start()
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch_disk,
        args=(workdir, disk, ran, km.stop_kernel, done, lambda: _run_processes_of(km)),
        name="labkit-disk",
        daemon=True,
    )
    watcher.start()
    try:
        yield
    finally:
        watchdog.cancel()
        done.set()
        watcher.join()


def _execute(
    input_path: Path, output_path: Path, km, engine: str, ran: KernelRun, limits: Limits, timeout: float
):
    """papermill on the kernel `km`, every cell run even after one raised; what stopped it otherwise, in `ran`."""
    import papermill
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    try:
        papermill.execute_notebook(
            str(input_path),
            str(output_path),
            kernel_name="python3",
            progress_bar=False,
            km=km,
            engine_name=engine,
            allow_errors=True,
            execution_timeout=max(1, int(timeout)),
            start_timeout=max(1, int(timeout)),
            output_limit=limits.output,
        )
    except PapermillExecutionError:
        pass  # the student's cells raised; the harness cell still ran, and the errors are in the output
    except DeadKernelError:
        ran.died = not ran.timed_out
    except Exception as e:  # noqa: BLE001 - whatever stopped papermill, the run reports it
        if ran.timed_out:
            return
        ran.died = km.sandboxed is not None and km.sandboxed.poll() is not None
        ran.failure = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        if type(e).__name__ == "CellTimeoutError" and not ran.died:
            # the cell ended but its outputs stopped arriving: a message over the size the kit accepts
            ran.failure = (
                f"the cells' output stopped reaching the kit: a single output larger than "
                f"{allowance.format_size(allowance.largest_message(limits))} is refused, and the rest of the "
                "run with it"
            )


def end_kernels_in(folder: Path) -> None:
    """End the kernel working in `folder` (a peer of a process that failed): its papermill then returns."""
    for km in list(_LIVE_KERNELS):
        if Path(km.run_dir) == scratch.RunFolders(folder).scratch:
            km.stop_kernel()
