"""The LABKIT_* environment variables are named in one place, labkit/envnames.py, which imports nothing."""

from __future__ import annotations

import ast
import re

from conftest import ROOT

from labkit import envnames

KIT = ROOT / "labkit"
NAME = re.compile(r"LABKIT_[A-Z0-9_]+")


def literals(path) -> list[tuple[int, str]]:
    """(line, name) for each string constant in `path` that is exactly a LABKIT_* name."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)
    ]


def test_no_module_spells_a_labkit_variable_but_envnames():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name!r}"
        for path in sorted(KIT.rglob("*.py"))
        if path != KIT / "envnames.py"
        for line, name in literals(path)
    ]
    assert not found, "spell these through labkit/envnames.py (envnames.X):\n" + "\n".join(found)


def test_envnames_imports_nothing_and_names_each_variable_once():
    tree = ast.parse((KIT / "envnames.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    values = [v for k, v in vars(envnames).items() if k.isupper()]
    assert values and all(NAME.fullmatch(v) for v in values)
    assert len(values) == len(set(values)), "two names for one variable"


def test_the_finder_finds_a_literal(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('import os\nx = os.environ.get("LABKIT_WARM")\ny = "the LABKIT_WARM setting"\n')
    assert literals(module) == [(2, "LABKIT_WARM")]
