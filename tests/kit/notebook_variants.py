"""Notebooks the kit's tests make from a lab's reference: one with a cell added, and designs (the
reference with parts of its solution replaced) judged on one device and on eight."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

from labkit.course import catalog

# Lab 3's public and hidden tests, a point each: 6 of shard_map_double, 4 of row_softmax. The kit's tests
# grade lab 3 as their small lab and count with this (test_lab_3 checks it against the lab's own tests).
LAB_3_TESTS = 10
LAB_3_PUBLIC_TESTS = 7  # of which public: what `make lab-3` runs, 4 and 3

# Lab 14's reference design (the batch over 'data', the heads and hidden units over 'model'), and FSDP in its place:
# every weight, its momentum and the batch split over the whole grid. (old, new) for `with_code` and `variant`.
CAPSTONE_SPECS = (
    '    state = {"wq": cols, "wk": cols, "wv": cols, "wo": rows, "w1": cols, "w2": rows}\n'
    '    batch = P("data")\n'
)
CAPSTONE_FSDP = (
    CAPSTONE_SPECS,
    '    state = {name: P(("data", "model")) for name in WEIGHTS}\n    batch = P(("data", "model"))\n',
)


def with_cell(source: str, path: Path) -> Path:
    """Lab 3's reference with `source` as a new code cell after the exercise's cell."""
    nb = json.loads(catalog.lab(3).reference.read_text())
    at = next(i for i, c in enumerate(nb["cells"]) if "def shard_map_double" in "".join(c["source"]))
    nb["cells"].insert(at + 1, nbformat.v4.new_code_cell(source))
    path.write_text(json.dumps(nb))
    return path


def with_code(nb: dict, *replacements: tuple[str, str]) -> dict:
    """`nb` with each (old, new) replaced in every code cell (in place; also returned)."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            for old, new in replacements:
                source = source.replace(old, new)
            cell["source"] = source
    return nb


def reference_code(lab: int) -> str:
    cells = json.loads(catalog.lab(lab).reference.read_text())["cells"]
    return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def failed_on_cpu_8(kit, lab_outcomes, variant, lab: int, *replacements, hidden: bool = True) -> dict:
    """Lab `lab`'s reference with `replacements` on cpu-1 and cpu-8: every test passes on cpu-1; cpu-8's failures.
    `hidden=False`: the public tests alone, as the student's `make lab-N` runs them."""
    assert all(old in reference_code(lab) for old, _ in replacements), "a replacement finds nothing"
    done = kit(
        "lab",
        str(lab),
        "--notebook",
        str(variant(lab, *replacements)),
        "--configs",
        "cpu-1,cpu-8",
        *["--hidden"] * hidden,
    )
    outcomes = lab_outcomes(lab)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values()), not_passed(
        outcomes["cpu-1"]
    )
    failed = {t: o for t, o in outcomes["cpu-8"].items() if o["status"] != "passed"}
    assert (done.returncode == 0) == (not failed), done.stdout + done.stderr
    return failed


def not_passed(outcomes: dict) -> dict[str, str]:
    """One configuration's outcomes that did not pass, as `{test: "status: the message's start"}`: what an
    assertion shows when a test that should pass did not."""
    return {
        t: f"{o['status']}: {str(o.get('message') or '')[:240]}"
        for t, o in outcomes.items()
        if o["status"] != "passed"
    }


class Ran(dict):
    """`failures_by_config`'s result; shown in a failed assertion as its exit status and each configuration's
    tests that did not pass, with the start of their messages (not the whole outcome records)."""

    def __repr__(self) -> str:
        configs = {k: not_passed(v) for k, v in self.items() if isinstance(v, dict)}
        return f"exit status {self.get('returncode')}; not passed: {configs}; output ends: {self.get('output', '')[-600:]}"

    __str__ = __repr__


def failures_by_config(
    kit, lab_outcomes, variant, lab: int, old: str, new: str, expected: set[str], *, hidden: bool = True
) -> dict:
    """Lab `lab`'s reference with `old` replaced by `new`, judged on cpu-1 and cpu-8 with hidden tests (or, with
    `hidden=False`, the public tests alone, as `make lab-N`): its exit status, its output, and per configuration
    the tests that did not pass (`expected` must all have run on cpu-8)."""
    assert old in reference_code(lab), (
        f"lab {lab}'s reference changed: the text to replace is no longer in it"
    )
    done = kit(
        "lab",
        str(lab),
        "--notebook",
        str(variant(lab, (old, new))),
        "--configs",
        "cpu-1,cpu-8",
        *["--hidden"] * hidden,
    )
    outcomes = lab_outcomes(lab)
    assert expected <= set(outcomes["cpu-8"]), sorted(outcomes["cpu-8"])
    return Ran(
        returncode=done.returncode,
        output=done.stdout + done.stderr,
        **{
            config: {t: o for t, o in outcomes[config].items() if o["status"] != "passed"}
            for config in outcomes
        },
    )
