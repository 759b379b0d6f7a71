"""The kit's package is laid out by stage, and the layout keeps its promises.

A folder per stage (run/, judge/, course/, grading/, machine/, student/); at the top only what a
course's own files import. Imports run one way: no module imports, even late inside a function,
a module that imports it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "labkit"
STAGES = {"run", "judge", "course", "grading", "machine", "student"}
# What notebooks, lab tests and the CLI name at the top of the package; and envnames, exitcodes and statuses,
# the fixed words every stage uses (they import nothing of the kit).
TOP = {
    "__init__",
    "__main__",
    "cli",
    "notebook",
    "checks",
    "cost",
    "facts",
    "envnames",
    "exitcodes",
    "statuses",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kit_imports(path: Path, known: set[str]) -> set[str]:
    """Every module of the kit that `path` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labkit"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("labkit")}
    return found & known


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: kit_imports(path, set(modules)) - {name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_module_of_the_kit_imports_one_that_imports_it():
    graph = import_graph()
    # Packages' own __init__ files import nothing, so a module reached through its package is no circle.
    assert all(not graph[name] for name in graph if name.count(".") == 1 and name.split(".")[1] in STAGES)
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert circles(
        {"labkit.a.x": {"labkit.a.y"}, "labkit.a.y": {"labkit.a.z"}, "labkit.a.z": {"labkit.a.x"}}
    ) == [["labkit.a.x", "labkit.a.y", "labkit.a.z", "labkit.a.x"]]


def test_the_top_of_the_package_holds_only_what_a_course_imports_and_the_stages():
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == STAGES


# grading/ by stage, lowest first: each imports only those before it; grading/'s own modules (the
# orchestrators: `grade`, and `slurm` and `cluster`, which grade beyond one machine) may import them all.
GRADING_STAGES = ("state", "intake", "running", "classwide", "review", "publish")
ORCHESTRATORS = {"__init__", "grade", "slurm", "cluster"}


def grading_rank(module: str) -> int | None:
    """A module's stage in grading/ (its index in GRADING_STAGES, the orchestrators above all); None outside."""
    parts = module.split(".")
    if parts[:2] != ["labkit", "grading"]:
        return None
    if len(parts) > 2 and parts[2] in GRADING_STAGES:
        return GRADING_STAGES.index(parts[2])
    return len(GRADING_STAGES)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import in grading/ of a module of a higher stage than the importer's."""
    found = []
    for name, imports in sorted(graph.items()):
        rank = grading_rank(name)
        if rank is None:
            continue
        found += [f"{name} -> {i}" for i in sorted(imports) if (grading_rank(i) or 0) > rank]
    return found


def test_grading_is_in_its_stages_and_each_says_what_it_reads_and_writes():
    grading = PACKAGE / "grading"
    folders = {p.name for p in grading.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(GRADING_STAGES)
    assert {p.stem for p in grading.glob("*.py")} == ORCHESTRATORS
    for stage in GRADING_STAGES:
        doc = ast.get_docstring(ast.parse((grading / stage / "__init__.py").read_text())) or ""
        assert "Reads" in doc and "writes" in doc, (
            f"grading/{stage}/__init__.py: say what the stage reads and writes"
        )


def test_grading_stages_import_only_the_stages_below_them():
    """state < intake < running < classwide < publish < grade: a stage never imports one above it, even late
    inside a function (a module two stages need lives in the lower one)."""
    assert upward_imports(import_graph()) == []


def test_the_stage_order_finds_an_upward_import():
    graph = {
        "labkit.grading.state.roster": {"labkit.grading.publish.scoreboard", "labkit.run.execute"},
        "labkit.grading.publish.scoreboard": {"labkit.grading.state.roster"},
        "labkit.grading.grade": {"labkit.grading.publish.scoreboard"},
        "labkit.grading.running.engine": {"labkit.grading.grade"},
    }
    assert upward_imports(graph) == [
        "labkit.grading.running.engine -> labkit.grading.grade",
        "labkit.grading.state.roster -> labkit.grading.publish.scoreboard",
    ]


def test_every_name_the_labs_and_their_tests_import_from_the_kit_is_there():
    """Lab tests (public and hidden) and the notebooks import the kit by these names: they must resolve."""
    sources = [
        p.read_text() for folder in ("public", "hidden") for p in (ROOT / "tests" / folder).rglob("*.py")
    ]
    for nb in [*(ROOT / "reference").glob("*.ipynb"), *(ROOT / "labs").glob("*.ipynb")]:
        sources += [
            "".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"
        ]
    wanted: set[tuple[str, str]] = set()
    for text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:  # a cell with IPython's own syntax
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
                wanted |= {(node.module, a.name) for a in node.names}
            elif isinstance(node, ast.Import):
                wanted |= {(a.name, "") for a in node.names if a.name.startswith("labkit")}
    assert len(wanted) > 20
    script = (
        "import importlib, json, sys\n"
        "missing = []\n"
        "for module, name in json.loads(sys.argv[1]):\n"
        "    m = importlib.import_module(module)\n"
        "    if name and not hasattr(m, name):\n"
        "        try:\n"
        "            importlib.import_module(f'{module}.{name}')\n"
        "        except ImportError:\n"
        "            missing.append(f'{module}.{name}')\n"
        "print(missing)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(sorted(wanted))],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "module", ["labkit.machine.envsetup", "labkit.machine.wheelhouse", "labkit.machine.doctor"]
)
def test_what_runs_before_the_environment_exists_needs_only_the_standard_library(module):
    """`make setup` and `make doctor` start these with the system's python3, before .venv is made (-S: no
    site-packages, so nothing installed can be imported)."""
    done = subprocess.run(
        [sys.executable, "-S", "-m", module, "--help"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout


# 500 lines in the hand-aligned style the kit had; `ruff format` puts a long call's arguments one to a
# line, which made the same code about a sixth longer (eleven modules went from under 500 to 508-593).
# The limit follows the layout, not the content: a module past it is still split by concern.
MOST_LINES = 600


def test_no_module_of_the_kit_is_longer_than_a_reader_takes_in_at_once():
    """A module that grows past this is split by concern, not left to grow (docs/development.md)."""
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MOST_LINES
    }
    assert long == {}


# A function is read on one screen: past this it becomes named steps (docs/development.md).
MOST_FUNCTION_LINES = 60


def test_no_function_of_the_kit_is_longer_than_a_screen():
    long = {
        f"{p.relative_to(PACKAGE)}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MOST_FUNCTION_LINES
    }
    assert long == {}


def test_the_modules_said_not_to_change_a_grade_are_modules_of_the_kit():
    """Editing one of them regrades nothing (grading.running.store's key leaves them out): a name that no longer
    exists, or a module of the scoreboard's drawing left off, would make regrades wrong or needless."""
    from labkit.grading.running import store

    names = {p.name for p in PACKAGE.rglob("*.py")}
    assert names >= store._NOT_GRADING, store._NOT_GRADING - names
    assert {"scoreboard.py", "results.py", "markdown.py", "pages.py"} <= store._NOT_GRADING
