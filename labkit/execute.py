"""Run one notebook on one device configuration, in processes of its own.

`run_notebook` copies the notebook into a scratch folder (the student's file is never
written), appends the harness cell that calls the student's functions on the judge's
inputs, and runs the copy with papermill in a child process whose environment is the
configuration's. It returns a `RunRecord`: plain data about how the run went and what
the functions returned. It judges nothing.

`python -m labkit.execute IN OUT` is that child process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from labkit.configs import DeviceConfig

DEFAULT_TIMEOUT = 120.0  # seconds for one notebook on one configuration
HARNESS_TAG = "labkit-harness"


class BadNotebook(Exception):
    """The file is not a notebook we can run. The message names the file and what is wrong."""


@dataclass
class RunRecord:
    config: str
    status: str  # "ok" (the notebook ran to its end), "error", "timeout" or "skipped"
    message: str = ""
    seconds: float = 0.0
    environment: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)  # call id -> {"value": ...} or {"error": ...}
    cell_errors: list = field(default_factory=list)  # errors raised by the student's own cells
    workdir: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RunRecord":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read and validate a notebook; raise BadNotebook with a message a student understands."""
    path = Path(path)
    if path.is_dir():
        raise BadNotebook(f"{path} is a folder, not a notebook file")
    if not path.exists():
        raise BadNotebook(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise BadNotebook(f"{path} is empty (0 bytes): save the notebook from Jupyter again")
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BadNotebook(f"{path} is not valid notebook JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise BadNotebook(f"{path} is not a text file: is it really a notebook?") from None
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # nbformat's own reader errors
        raise BadNotebook(f"{path} is not a notebook nbformat can read: {str(e).splitlines()[0][:300]}") from None
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        raise BadNotebook(f"{path} is not a valid notebook: {str(e).splitlines()[0][:300]}") from None
    return nb


def prepare(nb: nbformat.NotebookNode, workdir: Path, calls: list[dict]) -> Path:
    """Write the copy to run: the student's cells, outputs cleared, and the harness cell last."""
    workdir.mkdir(parents=True, exist_ok=True)
    calls_path = workdir / "calls.json"
    results_path = workdir / "results.json"
    calls_path.write_text(json.dumps({"calls": calls}))
    if results_path.exists():
        results_path.unlink()
    copy = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                             "language": "python"}})
    for number, cell in enumerate(nb.cells, start=1):
        if cell.cell_type == "code":
            if HARNESS_TAG in cell.get("metadata", {}).get("tags", []):
                continue  # a submission cannot bring its own harness
            copy.cells.append(nbformat.v4.new_code_cell(cell.source, metadata={"labkit_cell": number}))
        else:
            copy.cells.append(nbformat.v4.new_markdown_cell(cell.source))
    harness = nbformat.v4.new_code_cell(
        "import labkit.harness as _labkit_harness\n"
        f"_labkit_harness.run(globals(), {str(calls_path)!r}, {str(results_path)!r})"
    )
    harness.metadata["tags"] = [HARNESS_TAG]
    copy.cells.append(harness)
    path = workdir / "input.ipynb"
    nbformat.write(copy, path)
    return path


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """End a process and everything it started, including kernels in sessions of their own."""
    for p in [pid, *_descendants(pid)]:
        for kill in (lambda: os.killpg(os.getpgid(p), signal.SIGKILL), lambda: os.kill(p, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError, OSError):
                pass


def _cell_errors(executed: Path) -> tuple[list[dict], int | None]:
    """Errors raised by the student's cells, and the index of the last cell that started."""
    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception:
        return [], None
    errors, last_started = [], None
    for cell in nb.cells:
        number = cell.get("metadata", {}).get("labkit_cell")
        if cell.cell_type != "code" or number is None:
            continue  # markdown, papermill's own marker cells, the harness
        pm = cell.get("metadata", {}).get("papermill", {})
        if pm.get("start_time"):
            last_started = number
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append({"cell": number, "type": out.get("ename", ""),
                               "message": str(out.get("evalue", "")).splitlines()[0][:300] if out.get("evalue") else "",
                               "code": cell.source.strip().splitlines()[0][:120] if cell.source.strip() else ""})
    return errors, last_started


def run_notebook(notebook: Path, config: DeviceConfig, calls: list[dict], workdir: Path,
                 timeout: float = DEFAULT_TIMEOUT) -> RunRecord:
    """Run `notebook` on `config` in a child process and return what came back, as plain data."""
    workdir = Path(workdir)
    available, reason = config.availability()
    if not available:
        return RunRecord(config.name, "skipped", reason, workdir=str(workdir))
    try:
        nb = read_notebook(notebook)
    except BadNotebook as e:
        return RunRecord(config.name, "error", str(e), workdir=str(workdir))
    input_path = prepare(nb, workdir, calls)
    output_path = workdir / "executed.ipynb"
    log_path = workdir / "run.log"
    cmd = [sys.executable, "-m", "labkit.execute", str(input_path), str(output_path), str(timeout)]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        env = config.environment() | {"LABKIT_RUN": config.name}
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_tree(proc.pid)
            proc.wait()
    seconds = time.monotonic() - start
    cell_errors, last_started = _cell_errors(output_path)
    record = RunRecord(config.name, "ok", seconds=round(seconds, 2), cell_errors=cell_errors, workdir=str(workdir))
    if timed_out:
        record.status = "timeout"
        where = f" (still running cell {last_started})" if last_started is not None else ""
        record.message = f"the notebook did not finish within {timeout:g} s{where}"
        return record
    results_path = workdir / "results.json"
    if not results_path.exists():
        record.status = "error"
        record.message = _why_no_results(log_path, proc.returncode)
        return record
    try:
        payload = json.loads(results_path.read_text())
        record.environment = dict(payload.get("environment", {}))
        record.results = {str(r["id"]): r for r in payload.get("results", [])}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        record.status = "error"
        record.message = f"the run's results could not be read ({type(e).__name__})"
    return record


def _why_no_results(log_path: Path, returncode: int) -> str:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    if "DeadKernelError" in text or "Kernel died" in text:
        return "the Python kernel died while running the notebook (a crash, or out of memory)"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tail = lines[-1][:300] if lines else f"exit status {returncode}"
    return f"the notebook stopped before its functions could be called: {tail}"


def main(argv: list[str] | None = None) -> int:
    """The child process: execute IN into OUT with papermill, letting every cell run even after an error."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    input_path, output_path, timeout = (argv or sys.argv[1:])[:3]
    try:
        papermill.execute_notebook(
            input_path, output_path, kernel_name="python3", progress_bar=False, cwd=str(Path(input_path).parent),
            allow_errors=True, execution_timeout=int(float(timeout)),
        )
    except PapermillExecutionError:
        pass  # the student's cells raised; the harness cell still ran, and the errors are in OUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
