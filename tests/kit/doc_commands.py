"""The commands the README and the guides tell users to type, as the kit's tests read and run them.

A page's fenced blocks are of three kinds. A shell block (```bash) holds commands a user types, one
a line (a trailing backslash joins the next line; `# ...` is a comment): a test runs each of them
exactly as written, taking it from here with `typed`, `block` or `with_values`, so that a page that
says something else changes what is run and a page that no longer says it fails the test. A shell
block the tests cannot run says why in the line before it, where the page's reader does not see it;
commands named in it in backticks are the ones excused, else the whole block is:

    <!-- not run by the tests: needs a TPU VM -->
    <!-- not run by the tests: `make test` is the suite itself -->

Every other block names what it holds (```text for a sample of output or a file's lines, ```python,
```toml, ...). `unrun()` lists the shell commands no test takes and no mark excuses; a test fails on
any, and on a block with no language.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent
SHELL = ("bash", "sh", "shell")
NOT_RUN = re.compile(r"^<!--\s*not run by the tests:\s*(?P<why>\S.*?)\s*-->\s*$")
TAKERS = ("typed", "block", "with_values")  # this module's functions by which a test takes a command


def pages() -> list[Path]:
    """The README, the guides in docs/ and the benchmarks (the site's pages): what users read, and type from."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "BENCHMARKS.md"]


@dataclass(frozen=True)
class Block:
    page: str  # relative to the kit's top folder
    line: int  # of the opening fence
    language: str
    commands: tuple[str, ...]  # a shell block's command lines, comments and blank lines left out
    not_run: str | None  # why the tests do not run it, where the page says so

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _without_comment(text: str) -> str:
    """The line up to a `#` that starts a comment (after a blank, outside quotes)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text


def _commands(body: list[str]) -> tuple[str, ...]:
    joined, current = [], ""
    for raw in body:
        text = raw.strip()
        if not current and (not text or text.startswith("#")):
            continue
        text = _without_comment(text)
        if text.endswith("\\"):
            current += text[:-1].rstrip() + " "
            continue
        joined.append((current + text).strip())
        current = ""
    if current.strip():
        joined.append(current.strip())
    return tuple(c for c in joined if c)


def blocks(paths: list[Path] | None = None) -> list[Block]:
    """Every fenced block of the pages, in order."""
    found = []
    for path in paths or pages():
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = re.match(r"^\s*(```+)\s*(\S*)", lines[i])
            if not fence:
                i += 1
                continue
            start, ticks, language = i, fence.group(1), fence.group(2)
            i += 1
            body = []
            while i < len(lines) and not lines[i].strip().startswith(ticks):
                body.append(lines[i])
                i += 1
            i += 1
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            mark = NOT_RUN.match(before.strip())
            found.append(
                Block(
                    page=str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
                    line=start + 1,
                    language=language,
                    commands=_commands(body) if language in SHELL else (),
                    not_run=mark.group("why") if mark else None,
                )
            )
    return found


def shell_commands() -> list[str]:
    """Every command line of every shell block, run or not."""
    return [c for b in blocks() if b.language in SHELL for c in b.commands]


def typed(command: str) -> str:
    """The pages' command line that is exactly `command`; fails when no page tells users to type it."""
    assert command in shell_commands(), f"no page of the docs tells users to type `{command}` any more"
    return command


def block(starting: str) -> list[str]:
    """The command lines, in order, of the shell block with a line that starts with `starting`."""
    found = [b for b in blocks() if b.language in SHELL and any(c.startswith(starting) for c in b.commands)]
    assert found, f"no page of the docs has a block with `{starting}` any more"
    return list(found[0].commands)


def with_values(command: str, also: dict[str, str] | None = None, **values: str) -> list[str]:
    """The words of the pages' line `command`, with the value of each VAR=... it sets that `values` names
    replaced (a folder that exists only on the user's cluster, say; each must be in the line), and the
    settings `also` names added at its end (what a test keeps apart from a user's, as an image's tag)."""
    words = shlex.split(typed(command))
    for name, value in values.items():
        at = [i for i, w in enumerate(words) if w.startswith(f"{name}=")]
        assert at, f"`{command}` no longer sets {name}"
        words[at[0]] = f"{name}={value}"
    return words + [f"{name}={value}" for name, value in (also or {}).items()]


def user_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (the tests' environment) less what a user typing the pages' commands would not have set: the
    kit's own variables (LABKIT_*), the tests' interpreter's (VIRTUAL_ENV, PYTHONPATH, JAX_NUM_CPU_DEVICES), and
    those of a `make` the tests run under (`make test`: MAKELEVEL and its flags, which make a nested make print
    `make[1]: Entering directory` and change its exit status)."""
    return {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith("LABKIT_")
        and k not in ("VIRTUAL_ENV", "PYTHONPATH", "JAX_NUM_CPU_DEVICES")
        and k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR")
    }


def taken_by_tests(folder: Path = TESTS) -> tuple[set[str], set[str]]:
    """What the tests take from the pages: the lines (`typed`, `with_values`) and the starts of blocks (`block`),
    read from their source, as string constants given to this module's functions."""
    lines, starts = set(), set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0]
            if name in TAKERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                (starts if name == "block" else lines).add(first.value)
    return lines, starts


def unrun(folder: Path = TESTS, paths: list[Path] | None = None) -> list[str]:
    """The shell commands of the pages that no test takes and no `not run by the tests` mark excuses."""
    lines, starts = taken_by_tests(folder)
    left = []
    for b in blocks(paths):
        if b.language not in SHELL:
            continue
        if any(any(c.startswith(s) for c in b.commands) for s in starts):
            continue
        excused = set(re.findall(r"`([^`]+)`", b.not_run or ""))
        if b.not_run and not excused:
            continue
        left += [f"{b}: {c}" for c in b.commands if c not in lines and c not in excused]
    return left
