"""What a student reads besides the verdicts: test names that read as sentences, one figure for the TPU
download (the one set-up computes from uv.lock), and no libtpu start-up noise in a Jupyter kernel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


STUDENT_DOCS = ("README.md", "docs/index.md", "docs/student.md")


def test_the_student_docs_give_the_tpu_download_that_set_up_computes_from_uv_lock():
    from labkit.machine import envsetup

    sizes = envsetup.lock_sizes(ROOT / "uv.lock")
    computed = {f"about {envsetup.human(size)}" for (name, _), size in sizes.items() if name == "libtpu"}
    assert computed, "no libtpu wheel for this machine in uv.lock"
    stated = {}
    for doc in STUDENT_DOCS:
        for line in (ROOT / doc).read_text().splitlines():
            if "EXTRAS=tpu" in line:
                for figure in re.findall(r"about \d[\d.]* [MG]B", line):
                    stated.setdefault(figure, []).append(doc)
    assert stated, "no doc states the TPU download"
    assert set(stated) <= computed, f"the docs say {stated}; set-up computes {sorted(computed)}"


LIBTPU_NOISE = ("Failed to find host bounds", "TPU_WORKER_HOSTNAMES", "Source Location Trace")


def test_a_jupyter_kernel_with_libtpu_installed_shows_none_of_its_start_up_noise_and_logs_it(tmp_path):
    pytest.importorskip("libtpu")
    code = (
        "import ipykernel\n"  # as in a Jupyter kernel
        "import jax\n"
        "from labkit.notebook import Checker\n"
        "print(jax.device_count(), 'devices')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TPU_", "LABKIT_"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env | {"LABKIT_BUILD": str(tmp_path / "build"), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "8 devices" in done.stdout
    said = done.stdout + done.stderr
    assert not [n for n in LIBTPU_NOISE if n in said], said
    log = tmp_path / "build" / "jupyter-start.log"
    assert "TPU_WORKER_HOSTNAMES" in log.read_text()
