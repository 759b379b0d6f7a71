"""A lab's public tests, for its hidden tests: they reuse the public tests' inputs, reference functions and
messages.

`tests/hidden/lab_N/` lies beside `tests/public/lab_N/` in the kit's tree, in a Gradescope zip and wherever
the judge collects a lab's tests; neither folder is a package, so the public module is loaded by its path.
A hidden test file writes `public = public_tests(__file__)` (`labkit.checks` exports it).
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path


def public_tests(hidden_file: str) -> types.ModuleType:
    """The public test module of the lab whose hidden test file is `hidden_file`."""
    here = Path(hidden_file).resolve()
    (path,) = sorted((here.parents[2] / "public" / here.parent.name).glob("test_*.py"))
    spec = importlib.util.spec_from_file_location(f"_public_tests_of_{here.parent.name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the public tests {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
