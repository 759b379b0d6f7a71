"""The student loop: run one lab notebook on each device configuration and show what passed where."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from labkit import catalog, configs, execute, report
from labkit.judge import RunSpec, judge

import os

# Where executed copies and reports go; LABKIT_BUILD moves it (the kit's own tests use a temporary folder).
BUILD = Path(os.environ.get("LABKIT_BUILD") or catalog.ROOT / "build")


def run_lab(number: int | str, *, notebook: Path | None = None, config_names: str | None = None,
            timeout: float = execute.DEFAULT_TIMEOUT, hidden: bool = False, console: Console | None = None,
            build: Path | None = None, limits=None) -> bool:
    """Run lab `number` (the student's notebook unless `notebook` is given); True when every test passed."""
    console = console or Console()
    lab = catalog.lab(number)
    notebook = Path(notebook) if notebook else lab.student
    chosen = configs.parse(config_names)
    out = Path(build or BUILD) / lab.name
    runs = [RunSpec(c.name, notebook, c, out / c.name) for c in chosen]
    console.print(f"[bold]{lab.title}[/bold]: running {notebook} on {', '.join(c.name for c in chosen)}")
    judgement = judge(lab.test_dirs(hidden), runs, hidden_dirs=[lab.hidden_tests], jobs=len(runs), timeout=timeout,
                      limits=limits)
    labels = [r.label for r in runs]
    ok = report.print_lab(console, f"{lab.name}: {notebook}", labels, judgement.outcomes, judgement.records)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({
        "lab": lab.number,
        "notebook": str(notebook),
        "runs": {label: rec.to_json() | {"results": None} for label, rec in judgement.records.items()},
        "outcomes": [o.to_json() for o in judgement.outcomes],
    }, indent=1))
    return ok
