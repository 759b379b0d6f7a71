"""The student loop: run one lab notebook on each device configuration and show what passed where."""

from __future__ import annotations

import json
import os
from pathlib import Path

from labkit import envnames
from labkit.course import catalog, configs

# execute, judge and report (papermill, pytest, rich) are imported by run_lab once the warm server
# has begun to start: the two start at once, on two cores.

# Where executed copies and reports go; LABKIT_BUILD moves it (the kit's own tests use a temporary folder).
BUILD = Path(os.environ.get(envnames.BUILD) or catalog.ROOT / "build")


def _warm_server(lab, out: Path, chosen: list, limits, cache):
    """A warm server begun for the one-process CPU configurations of this run of the loop, or None."""
    from labkit.run import allowance, warm

    # One configuration is worth a server too: it forks the verifier as well as the kernel, so the run imports JAX
    # once where two processes would each import it (about 2 of 7 CPU-s of lab 3's reference on cpu-8 here).
    base = warm.environment_for(chosen)
    if base is None or os.environ.get(envnames.WARM, "on") == "off":
        return None
    server = warm.Server([out], base, out / ".warm", shared=[cache.folder] if cache else [], labs=[lab])
    return server if server.begin(limits or allowance.DEFAULT_LIMITS) else None


def run_lab(
    number: int | str,
    *,
    notebook: Path | None = None,
    config_names: str | None = None,
    timeout: float | None = None,
    hidden: bool = False,
    console=None,
    build: Path | None = None,
    limits=None,
    record_costs: bool = False,
    keep_scratch: bool = False,
) -> bool:
    """Run lab `number` (the student's notebook unless `notebook` is given); True when every test passed.

    `record_costs`: write the runs' cost cards as the lab's reference cards (course staff, on the reference)."""
    lab = catalog.lab(number)
    notebook = Path(notebook) if notebook else lab.student
    chosen = configs.parse(config_names)
    out = Path(build or BUILD) / lab.name
    from labkit.run import jaxcache

    # the student's own runs fill and read their own cache (programs compiled once, not at every make lab-N)
    cache = jaxcache.prepare(jaxcache.students_own(Path(build or BUILD))) if jaxcache.wanted() else None
    server = _warm_server(lab, out, chosen, limits, cache)
    try:
        return _run(
            lab,
            notebook,
            chosen,
            out,
            timeout,
            hidden,
            console,
            limits,
            server,
            cache,
            record_costs,
            keep_scratch,
        )
    finally:
        if server is not None:
            server.stop()


def _run(
    lab,
    notebook: Path,
    chosen: list,
    out: Path,
    timeout,
    hidden: bool,
    console,
    limits,
    server,
    cache,
    record_costs: bool = False,
    keep_scratch: bool = False,
) -> bool:
    from rich.console import Console

    from labkit.judge import timeline
    from labkit.judge.judge import RunSpec, judge
    from labkit.run import execute
    from labkit.student import report

    console = console or Console()
    timeout = execute.DEFAULT_TIMEOUT if timeout is None else timeout
    runs = [RunSpec(c.name, notebook, c, out / c.name, keep_scratch=keep_scratch) for c in chosen]
    console.print(f"[bold]{lab.title}[/bold]: running {notebook} on {', '.join(c.name for c in chosen)}")
    from labkit.student import stamp

    for line in stamp.advice(notebook, out):
        console.print(line, markup=False, highlight=False)
    judgement = judge(
        lab.test_dirs(hidden),
        runs,
        hidden_dirs=[lab.hidden_tests],
        jobs=len(runs),
        timeout=timeout,
        limits=limits,
        warm=server,
        cache=cache,
    )
    labels = [r.label for r in runs]
    ok = report.print_lab(console, f"{lab.name}: {notebook}", labels, judgement.outcomes, judgement.records)
    for line in not_judged_here(lab.number, chosen, judgement.outcomes):
        print(line, file=console.file)
    found = _print_costs(lab, judgement, console, record_costs)
    for line in timeline.report(lab, judgement, out, record_costs):  # the schedule's picture: its path
        print(line, file=console.file)
    _write_report(out / "report.json", lab, notebook, judgement, found)
    return ok


def not_judged_here(number: int | str, chosen: list, outcomes: list) -> list[str]:
    """A line naming the tests only the TPU compiler judges (a budget at a production size, or one XLA:CPU cannot
    tell), where none of the configurations run was a compile-only TPU one: what was not judged, and the command
    that judges it (with the set-up that adds libtpu, where it is missing). Nothing where every test was judged."""
    from labkit.checks import TPU_ONLY_SKIP
    from labkit.machine import accelerators

    if any(c.compile_for for c in chosen):
        return []
    names = list(
        dict.fromkeys(
            o.test.removeprefix("test_").replace("_", " ")
            for o in outcomes
            if o.status == "skipped" and TPU_ONLY_SKIP in (o.message or "")
        )
    )
    if not names:
        return []
    installed, _ = accelerators.libtpu_available()
    setup = "" if installed else ", after `make setup EXTRAS=tpu` adds libtpu (the TPU compiler)"
    which = "; ".join(f"'{n}'" for n in names)
    return [
        f"Not judged on these configurations: {len(names)} test(s) only the TPU compiler judges ({which}). "
        f"`make lab-{number} CONFIGS=cpu-8,v5e-8` judges {'it' if len(names) == 1 else 'them'} on a TPU v5e "
        f"slice's compiled program, with no TPU at hand{setup}; grading runs {'it' if len(names) == 1 else 'them'} "
        "where the course grades on v5e-8."
    ]


def _print_costs(lab, judgement, console, record_costs: bool) -> dict:
    """The run's cost cards, beside the reference's (recorded as the reference's with `record_costs`)."""
    from labkit import cost
    from labkit.student import report

    results = {label: rec.results for label, rec in judgement.records.items()}
    found = cost.cards(judgement.calls, results)
    if record_costs:
        console.print(f"wrote {cost.write_reference(lab.public_tests, found)}")
    ranked = lab.ranked_call
    measured = [n for o in judgement.outcomes for n in o.budgets]  # each names its call and run
    for line in cost.text(found, cost.read_reference(lab.public_tests), ranked, measured):
        print(line, file=console.file)
    if not found and (why := report.why_no_card(judgement.calls, results)):
        print(why, file=console.file)
    return found


def _write_report(path: Path, lab, notebook: Path, judgement, found: dict) -> None:
    """report.json: the runs (without their values), the outcomes and the cost cards of this run; and, for
    `make scoreboard`, under `earlier`, the last run of each configuration this run left out (a `CONFIGS=
    cpu-8,v5e-8` run before a plain `make lab-N`) of the same notebook, with when it ran."""
    import time

    from labkit import cost

    now = time.strftime("%Y-%m-%d %H:%M")
    runs = {label: rec.to_json() | {"results": None} for label, rec in judgement.records.items()}
    old = _read_json(path)
    earlier = {}
    if old.get("notebook") == str(notebook):
        kept = _dict(old.get("earlier"))
        for label, rec in _dict(old.get("runs")).items():
            if isinstance(rec, dict) and rec.get("status") != "skipped":
                outcomes = [
                    o for o in old.get("outcomes", []) if isinstance(o, dict) and o.get("run") == label
                ]
                kept[label] = {
                    "ran": str(old.get("ran") or "an earlier run"),
                    "run": rec,
                    "outcomes": outcomes,
                }
        earlier = {label: e for label, e in kept.items() if label not in runs and isinstance(e, dict)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "lab": lab.number,
                "notebook": str(notebook),
                "ran": now,
                "runs": runs,
                "outcomes": [o.to_json() for o in judgement.outcomes],
                "costs": cost.to_json(found),
                "earlier": earlier,
            },
            indent=1,
        )
    )


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
