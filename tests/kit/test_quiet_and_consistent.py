"""What a student reads besides the verdicts: test names that read as sentences, one figure for the TPU
download (the one set-up computes from uv.lock), and no libtpu start-up noise in a Jupyter kernel."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Words ending in "s" that are singular: "every process", "each class" read as sentences.
# A plural after "every" or "each" with one of these next is not read as a possessive here.
LINKS = {"of", "on", "in", "to", "and", "with", "from", "across", "over", "that", "is", "are"}
SINGULAR = {"process", "class", "axis", "bias", "loss", "pass", "address", "access", "status", "mass"}


def _test_names() -> list[tuple[str, str]]:
    found = []
    for folder in ("public", "hidden"):
        for path in sorted((ROOT / "tests" / folder).rglob("test_*.py")):
            for name in re.findall(r"^def (test_\w+)", path.read_text(), flags=re.M):
                found.append((str(path.relative_to(ROOT)), name))
    return found


def _possessive_without_apostrophe(name: str) -> str:
    """The words of `name` that read as a possessive once its underscores are spaces ("" where none):
    "every rows softmax", "each devices rows", "its stages layers"."""
    words = name.removeprefix("test_").split("_")
    for i, word in enumerate(words[:-1]):
        after = words[i + 1]
        if word in ("every", "each") and after.endswith("s") and after not in SINGULAR and i + 2 < len(words):
            nxt = words[i + 2]
            if nxt not in LINKS:
                return " ".join(words[i : i + 3])
        if word == "its" and i + 2 < len(words) and after.endswith("s") and words[i + 2].endswith("s"):
            return " ".join(words[i : i + 3])
    return ""


def test_every_public_and_hidden_test_name_reads_as_a_sentence_without_a_missing_apostrophe():
    names = _test_names()
    assert len(names) > 100, "the tests were not found"
    bad = {f"{path}::{name}": why for path, name in names if (why := _possessive_without_apostrophe(name))}
    assert not bad, bad


def test_the_possessive_rule_catches_the_names_it_is_about():
    assert _possessive_without_apostrophe("test_row_softmax_gives_every_rows_softmax") == "every rows softmax"
    assert _possessive_without_apostrophe("test_fits_each_chip_holding_only_its_stages_layers") == (
        "its stages layers"
    )
    assert not _possessive_without_apostrophe("test_every_process_holds_its_rows_of_x")
    assert not _possessive_without_apostrophe("test_layer_grid_leaves_its_rows_split_over_every_device")
