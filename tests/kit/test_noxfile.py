"""The nox sessions say the flags of the commands they wrap: checked against the CLI's own parser.

Each session that wraps a `labkit` subcommand (`_kit(session, "grade", ...)`) lists that command's
flags in its docstring, which `nox --list` shows. A flag the docstring names must exist; a flag the
command has must be named, so that a new flag (`--start`, `--runs-from`, `--plan` were missed once)
cannot be left out of the session a TA types.
"""

import argparse
import ast
import re

import pytest

from labkit import cli
from tests.kit.conftest import ROOT

FLAG = re.compile(r"--[a-z][a-z0-9-]*")
WRAPS = re.compile(r'_kit\(session, "([a-z-]+)"')


def _wrapped() -> dict[str, tuple[str, str]]:
    """{session: (the labkit subcommand, its docstring)} for every session of noxfile.py that wraps one."""
    source = (ROOT / "noxfile.py").read_text()
    sessions = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and (
            found := WRAPS.search(ast.get_source_segment(source, node))
        ):
            sessions[node.name] = (found.group(1), ast.get_docstring(node) or "")
    return sessions


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every --flag of `parser` and of its own subcommands (`scoreboard export --format`), --help aside."""
    flags = set()
    for action in parser._actions:
        flags |= {o for o in action.option_strings if o.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _options(sub)
    return flags - {"--help"}


def _subcommand(name: str) -> argparse.ArgumentParser:
    for action in cli.parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise AssertionError("labkit has no subcommands")


def test_the_sessions_that_wrap_a_command_are_found():
    assert {"lab", "grade", "slurm_grade", "scoreboard", "progress"} <= set(_wrapped())


@pytest.mark.parametrize("session", sorted(_wrapped()))
def test_a_sessions_docstring_names_exactly_its_commands_flags(session):
    command, doc = _wrapped()[session]
    named, has = set(FLAG.findall(doc)), _options(_subcommand(command))
    assert not named - has, (
        f"nox -s {session} names flags `labkit {command}` does not have: {sorted(named - has)}"
    )
    assert not has - named, f"nox -s {session} leaves out flags of `labkit {command}`: {sorted(has - named)}"


def test_a_flag_left_out_or_made_up_is_found():
    has = _options(_subcommand("progress"))
    assert has == {"--watch", "--every"}
    assert set(FLAG.findall("nox -s progress -- OUT [--watch]")) != has
