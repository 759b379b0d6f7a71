"""The student release: everything a student needs, no reference solution, no hidden test, and it runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from labkit.course import catalog, release

ROOT = Path(__file__).resolve().parents[2]
MARKER_LINE = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$", re.MULTILINE)


def labkit(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600):
    env = dict(os.environ, COLUMNS="160", NO_COLOR="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "labkit", *args],
        check=False,
        cwd=cwd,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A release built by the real command line, as `make release` does."""
    out = tmp_path_factory.mktemp("release") / "student-release"
    done = labkit("release", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def solution_regions() -> list[str]:
    """The body of every marked solution in reference/, whitespace squeezed (read here, not through labkit)."""
    regions = []
    for path in sorted((ROOT / "reference").glob("lab-*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            for body in re.findall(r"### BEGIN SOLUTION\s*\n(.*?)\n\s*### END SOLUTION", source, re.DOTALL):
                regions.append(squeeze(body))
    return [r for r in regions if r]


def squeeze(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def notebook_code(path: Path) -> str:
    return squeeze(
        "\n".join(
            "".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
        )
    )


def test_the_release_holds_what_a_student_needs(built):
    for name in (
        "labkit/__init__.py",
        "labkit/cli.py",
        "labs/lab-3.ipynb",
        "labs/meshes.md",
        "tests/public/lab_3",
        "Makefile",
        "noxfile.py",
        "pyproject.toml",
        "uv.lock",
        "README.md",
    ):
        assert (built / name).exists(), name
    assert {p.name for p in (built / "labs").glob("lab-*.ipynb")} == {
        lab.student.name for lab in catalog.labs()
    }


def test_the_release_has_no_reference_and_no_hidden_tests(built):
    assert not (built / "reference").exists() and not (built / "tests" / "hidden").exists()
    assert not any(f.startswith(("reference/", "tests/hidden/")) or "/hidden/" in f for f in files(built))
    assert not any(f.startswith((".ci/", "tests/kit/")) for f in files(built))


def test_no_notebook_in_the_release_has_a_solution_marker(built):
    for path in (built / "labs").glob("*.ipynb"):
        assert "BEGIN SOLUTION" not in path.read_text(), path.name


def test_only_the_kit_files_that_document_the_markers_mention_them(built):
    mentions = [f for f in files(built) if MARKER_LINE.search((built / f).read_text(errors="replace"))]
    assert set(mentions) <= {"labkit/course/authoring.py", "docs/authoring.md"}, mentions


def test_no_reference_solution_appears_in_any_student_notebook(built):
    regions = solution_regions()
    assert regions, "the reference notebooks should have marked solutions to look for"
    for path in (built / "labs").glob("*.ipynb"):
        code = notebook_code(path)
        leaked = [r.splitlines()[0] for r in regions if len(r) > 40 and r in code]
        assert not leaked, f"{path.name} contains solutions starting with {leaked}"


def test_the_archive_holds_the_same_files_as_the_folder(built):
    archive = built.with_name(built.name + ".tar.gz")
    with tarfile.open(archive) as tar:
        members = sorted(m.name.removeprefix(built.name + "/") for m in tar.getmembers() if m.isfile())
    assert members == files(built)


def test_building_again_replaces_the_release_with_the_same_archive(built, tmp_path):
    first = built.with_name(built.name + ".tar.gz").read_bytes()
    again = release.build(built)
    assert again.read_bytes() == first


def test_a_folder_that_is_not_a_release_is_never_overwritten(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(release.ReleaseError, match="not an earlier release"):
        release.build(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def fake_kit(root: Path) -> Path:
    """A tiny kit with one lab whose reference has a solution."""
    for name in (
        "Makefile",
        "noxfile.py",
        "pyproject.toml",
        "uv.lock",
        "README.md",
        "BENCHMARKS.md",
        "docs/index.md",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    (root / "labkit").mkdir()
    (root / "labkit" / "__init__.py").write_text("")
    (root / "tests" / "public" / "lab_1").mkdir(parents=True)
    cell = textwrap.dedent("""\
        def answer(x):
            ### BEGIN SOLUTION
            secret_total = x.sum() * 42 + 7
            return secret_total
            ### END SOLUTION""")
    nb = {
        "cells": [
            {"cell_type": "markdown", "id": "fake-1", "metadata": {}, "source": "# Lab 1 · Fake"},
            {
                "cell_type": "code",
                "id": "fake-2",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": cell,
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "reference").mkdir()
    (root / "reference" / "lab-1.ipynb").write_text(json.dumps(nb))
    return root


def test_a_clean_fake_kit_releases_a_stub_in_place_of_the_solution(tmp_path):
    root = fake_kit(tmp_path / "kit")
    release.build(tmp_path / "out", root=root)
    student = (tmp_path / "out" / "labs" / "lab-1.ipynb").read_text()
    assert "secret_total" not in student and "NotImplementedError" in student


def test_a_solution_copied_into_the_public_tests_is_refused_and_no_archive_is_written(tmp_path):
    root = fake_kit(tmp_path / "kit")
    (root / "tests" / "public" / "lab_1" / "notes.py").write_text(
        "secret_total = x.sum() * 42 + 7\nreturn secret_total\n"
    )
    with pytest.raises(release.LeakedSolution, match="tests/public/lab_1/notes.py contains the solution"):
        release.build(tmp_path / "out", root=root)
    assert not (tmp_path / "out.tar.gz").exists()


def test_a_reference_folder_in_a_release_is_a_leak(tmp_path):
    root = fake_kit(tmp_path / "kit")
    (tmp_path / "out" / "reference").mkdir(parents=True)
    assert "reference/ is in the release" in release.leaks(tmp_path / "out", root)


def test_lab_3_runs_from_inside_the_release_and_fails_cleanly_as_not_implemented(built, tmp_path):
    done = labkit(
        "lab",
        "3",
        "--configs",
        "cpu-1",
        cwd=built,
        env={"LABKIT_ROOT": str(built), "LABKIT_BUILD": str(tmp_path / "build")},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not implemented yet" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    report = json.loads((tmp_path / "build" / "lab-3" / "report.json").read_text())
    assert Path(report["notebook"]).resolve() == (built / "labs" / "lab-3.ipynb").resolve()
    assert report["outcomes"] and {o["status"] for o in report["outcomes"]} == {"todo"}
    assert not any(o["hidden"] for o in report["outcomes"])
