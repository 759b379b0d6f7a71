"""Where the labs are: their notebooks, public tests and hidden tests, found by one path scheme.

    reference/lab-<N>.ipynb       the solution, the single source of each lab
    labs/lab-<N>.ipynb            the student version, generated from the reference
    tests/public/lab_<N>/         tests students run with `make lab-N`
    tests/hidden/lab_<N>/         tests only grading runs; a student release leaves them out

and what the course says about each lab beyond its files: where it is read (READ_AFTER), and
whether it has a class leaderboard (LEADERBOARDS).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from labkit import envnames

ROOT = Path(os.environ.get(envnames.ROOT) or Path(__file__).resolve().parents[2])
NOTEBOOK_NAME = re.compile(r"^lab-([1-9][0-9]*)\.ipynb$")


@dataclass(frozen=True)
class Leaderboard:
    """A lab's class leaderboard: students whose run passes, ranked by one examined call's modelled step time.

    `function`: the examined call (a `compiled_call` of the lab's tests) whose cost card ranks the
    designs; `config`: the configuration whose run it is examined in; `chip`: the chip of
    labkit/chips.toml the card's step time is modelled on (see labkit/grading/classwide/leaderboard.py).
    `at_size`: where the class is graded on this compile-only TPU configuration too, the board ranks by
    the card of the call at a production size (`checks.shaped`) the TPU compiler made for it instead.
    """

    function: str
    config: str
    chip: str
    at_size: str | None = None  # a compile-only TPU configuration: where graded, it ranks (see below)

    def to_json(self) -> dict:
        return {"function": self.function, "config": self.config, "chip": self.chip} | (
            {"at_size": self.at_size} if self.at_size else {}
        )

    @classmethod
    def from_json(cls, data: dict) -> Leaderboard:
        return cls(data["function"], data["config"], data["chip"], data.get("at_size") or None)


# Labs with a class leaderboard: lab -> what ranks the designs. Lab 9's fsdp_mlp: its tests fix
# what each device stores (every weight in pieces) and returns (the output split by rows), not how
# the pieces are brought together, so several designs pass (every weight gathered at once or
# each where it is used; or the batch's columns exchanged and the partial products summed and
# scattered, psum_scatter, instead of the weights gathered) and their cards differ; on eight
# devices its modelled step is bound by communication, which is what the design changes. Graded on
# v5e-8 too, it ranks them by the TPU program at a production size (d_model 8192, 32768 hidden units).
# Lab 14's train_step, the capstone: its tests fix the numbers (the one-device step) and two budgets
# (the state each device keeps, the bytes it sends), not the design; data x model, FSDP and a
# momentum split further than the weights all pass, and their cards differ in what they send. Graded on
# v5e-8 too, it ranks them by the TPU program of the step at a production size (d_model 4096), where a
# design that computes the whole batch on every device costs what it would on real chips.
LEADERBOARDS = {
    9: Leaderboard(function="fsdp_mlp", config="cpu-8", chip="v5e", at_size="v5e-8"),
    14: Leaderboard(function="train_step", config="cpu-8", chip="v5e", at_size="v5e-8"),
}


@dataclass(frozen=True)
class Lab:
    number: int
    root: Path = ROOT

    @property
    def name(self) -> str:
        return f"lab-{self.number}"

    @property
    def reference(self) -> Path:
        return self.root / "reference" / f"{self.name}.ipynb"

    @property
    def student(self) -> Path:
        return self.root / "labs" / f"{self.name}.ipynb"

    @property
    def public_tests(self) -> Path:
        return self.root / "tests" / "public" / f"lab_{self.number}"

    @property
    def hidden_tests(self) -> Path:
        return self.root / "tests" / "hidden" / f"lab_{self.number}"

    @property
    def leaderboard(self) -> Leaderboard | None:
        """The lab's class leaderboard, where the course gives it one (LEADERBOARDS)."""
        return LEADERBOARDS.get(self.number)

    @property
    def ranked_call(self) -> tuple[str, str] | None:
        """(function, configuration) of the call the leaderboard ranks, as a cost card's headline names it."""
        board = self.leaderboard
        return (board.function, board.config) if board is not None else None

    def test_dirs(self, hidden: bool = False) -> list[Path]:
        dirs = [self.public_tests] + ([self.hidden_tests] if hidden else [])
        return [d for d in dirs if d.is_dir()]

    def uses(self, package: str) -> bool:
        """Whether the lab's reference notebook or its tests import `package` (a top-level name: `flax`)."""
        imports = re.compile(rf"^\s*(?:import|from)\s+{re.escape(package)}\b", re.M)
        try:
            cells = json.loads(self.reference.read_text())["cells"]
        except (OSError, ValueError, KeyError):
            cells = []
        sources = ["".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code"]
        sources += [t.read_text() for d in self.test_dirs(hidden=True) for t in sorted(d.rglob("*.py"))]
        return any(imports.search(text) for text in sources)

    @property
    def title(self) -> str:
        """The first heading of the reference (or student) notebook."""
        for path in (self.reference, self.student):
            try:
                cells = json.loads(path.read_text())["cells"]
            except (OSError, ValueError, KeyError):
                continue
            for cell in cells:
                if cell.get("cell_type") == "markdown":
                    for line in "".join(cell.get("source", "")).splitlines():
                        if line.startswith("#"):
                            return line.lstrip("#").strip()
        return self.name


def labs(root: Path = ROOT) -> list[Lab]:
    """Every lab that has a reference or a student notebook, by number."""
    numbers = set()
    for folder in ("reference", "labs"):
        for path in (root / folder).glob("lab-*.ipynb"):
            m = NOTEBOOK_NAME.match(path.name)
            if m:
                numbers.add(int(m.group(1)))
    return [Lab(n, root) for n in sorted(numbers)]


# Labs whose place in the course is not their number (numbers stay: submissions, hidden tests and
# scripts name them): lab -> the lab it is read after. Lab 12 (sharding in types) builds on lab 2's
# jit and placements, and one of its exercises is a shard_map, which lab 3 teaches. Lab 13 (the cost
# of a program) reads the costs of lab 9's designs and lab 10's rings.
READ_AFTER = {12: 3, 13: 10}


def reading_order(root: Path = ROOT) -> list[Lab]:
    """The labs in the order the course reads them: by number, each of READ_AFTER right after its lab."""
    out: list[Lab] = []
    known = labs(root)
    moved = {n for n in READ_AFTER if any(lab.number == n for lab in known)}
    for lab in known:
        if lab.number in moved:
            continue
        out.append(lab)
        out += [Lab(n, root) for n in sorted(moved) if READ_AFTER[n] == lab.number]
    return out


class UnknownLab(ValueError):
    pass


def lab(number: int | str, root: Path = ROOT) -> Lab:
    text = str(number).removeprefix("lab-").removeprefix("lab")
    known = labs(root)
    if not text.isdigit() or int(text) not in {lab.number for lab in known}:
        listing = ", ".join(str(lab.number) for lab in known) or "none"
        raise UnknownLab(f"there is no lab {number!r}; the labs are: {listing}")
    return Lab(int(text), root)
