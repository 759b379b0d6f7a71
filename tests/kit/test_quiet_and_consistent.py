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


def test_make_doctor_gives_the_tpu_download_that_set_up_computes_from_uv_lock(monkeypatch):
    from importlib import metadata

    from labkit.machine import doctor, envsetup

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    check = doctor.check_libtpu()
    sizes = [n for (name, _), n in envsetup.lock_sizes(ROOT / "uv.lock").items() if name == "libtpu"]
    assert f"EXTRAS=tpu` adds it (about {envsetup.human(max(sizes))} to download;" in check.fix, check.fix


LIBTPU_NOISE = ("Failed to find host bounds", "TPU_WORKER_HOSTNAMES", "Source Location Trace")


def _run_in_a_kernel(code: str, env: dict, cwd: Path) -> str:
    """What a fresh Jupyter kernel shows for one cell: its streams (stdout and stderr) and any error."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", env=env, cwd=str(cwd), startup_timeout=120)
    try:
        shown = []
        client.execute_interactive(
            code,
            timeout=300,
            output_hook=lambda msg: shown.append(
                msg["content"].get("text", "") + "".join(msg["content"].get("traceback", []))
            ),
        )
        return "".join(shown)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_jupyter_kernel_with_libtpu_installed_shows_none_of_its_start_up_noise_and_logs_it(tmp_path):
    pytest.importorskip("libtpu")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TPU_", "LABKIT_"))}
    env |= {"LABKIT_BUILD": str(tmp_path / "build"), "PYTHONPATH": str(ROOT)}
    # a lab's first cell
    shown = _run_in_a_kernel(
        "import jax\nfrom labkit.notebook import Checker\nprint(jax.device_count(), 'devices')", env, tmp_path
    )
    assert "8 devices" in shown, shown
    assert not [n for n in LIBTPU_NOISE if n in shown], shown
    # where they went: what libtpu says depends on what else holds it at the time (nothing, or the messages)
    assert (tmp_path / "build" / "jupyter-start.log").is_file()


def test_a_process_that_only_imports_ipykernel_starts_no_jax_backend_on_import(tmp_path):
    """The kit's warm server imports ipykernel, then labkit.notebook, and forks every run's kernel from
    itself: a backend started there would fix each run's device count to the server's."""
    code = (
        "import ipykernel.kernelapp\n"
        "import labkit.notebook\n"
        "from jax._src import xla_bridge\n"
        "print('started' if xla_bridge.backends_are_initialized() else 'not started')\n"
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
    assert done.stdout.strip() == "not started", done.stdout + done.stderr
