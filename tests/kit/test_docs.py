"""The course and manual site: `make docs` builds it offline from the kit's own files, with the course in
reading order and no solution in it, pictures the kit draws, and a build that fails on a broken link."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import doc_commands
import pytest

from labkit.course import catalog, docsite, pictures

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def site() -> Path:
    """The site as the README's `make docs` builds it, into build/site."""
    done = subprocess.run(
        ["bash", "-c", doc_commands.typed("make docs")],
        cwd=ROOT,
        env=doc_commands.user_environment(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return ROOT / "build" / "site"


def test_the_site_has_every_guide_the_benchmarks_and_every_lab_in_reading_order(site):
    for name, _ in docsite.GUIDES:
        assert (site / name.replace(".md", ".html")).is_file(), name
    assert (site / "benchmarks.html").is_file()
    for lab in catalog.labs():
        assert (site / "course" / lab.student.name.replace(".ipynb", ".html")).is_file(), lab.name
    config = json.loads((ROOT / "build" / "docs-src" / "mkdocs.yml").read_text())
    course = next(item["The course"] for item in config["nav"] if "The course" in item)
    labs = [
        int(re.search(r"lab-(\d+)", p).group(1)) for entry in course for p in entry.values() if "lab-" in p
    ]
    assert labs == [lab.number for lab in catalog.reading_order()]


def test_the_course_pages_carry_the_student_notebooks_and_no_solution(site):
    for lab in catalog.labs():
        page = (site / "course" / lab.student.name.replace(".ipynb", ".html")).read_text()
        assert "BEGIN SOLUTION" not in page and "END SOLUTION" not in page
        reference = json.loads(lab.reference.read_text())["cells"]
        student = "".join("".join(c["source"]) for c in json.loads(lab.student.read_text())["cells"])
        solutions = [
            line.strip()
            for c in reference
            if c["cell_type"] == "code"
            for line in "".join(c["source"]).splitlines()
            if len(line.strip()) > 30 and line.strip() not in student
        ]
        found = [line for line in solutions if line.replace('"', "&quot;") in page or line in page]
        assert found == [], (lab.name, found[:3])


def test_the_site_reads_offline_it_loads_nothing_from_another_host(site):
    external = re.compile(r'<(?:script|link|img|iframe)[^>]*\b(?:src|href)="(?:https?:)?//[^"]*"')
    for page in site.rglob("*.html"):
        assert not external.findall(page.read_text()), page
    assert (site / "vendor" / "iframe-worker-1.0.4-shim.js").is_file(), (
        "search's shim is carried, not fetched"
    )


def test_the_pictures_are_drawn_by_the_kit_and_shown(site):
    for name in ("sharding.svg", "pipeline.svg", "layers.svg", "architecture.svg"):
        assert (site / "img" / name).read_text().startswith("<svg")
    assert "img/sharding.svg" in (site / "course.html").read_text()
    assert "img/layers.svg" in (site / "sandbox.html").read_text()
    assert "img/architecture.svg" in (site / "architecture.html").read_text()


def test_the_architecture_page_names_every_module_of_the_kit_and_none_that_is_not_there():
    page = (ROOT / "docs" / "architecture.md").read_text()
    found = set(re.findall(r"`(?:labkit/)?((?:[a-z]+/)*[a-z_][a-z0-9_]*\.py)`", page))
    # a test module, or a package's own __init__.py, is named on the page but is not a module to name
    named = {n for n in found if not n.startswith("tests/") and n != "__init__.py"}
    package = ROOT / "labkit"
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py") if p.name != "__init__.py"}
    assert named - modules == set(), "named on the page, but not in labkit/"
    assert modules - named == set(), "in labkit/, but not named on the page"


def test_the_architecture_picture_puts_only_the_students_kernel_beyond_the_trust_boundary():
    untrusted = [stage for stage, _, trusted in pictures.STAGES if not trusted]
    assert untrusted == ["the student's kernel"]
    kernel = next(modules for stage, modules, _ in pictures.STAGES if stage in untrusted)
    assert {"judge/harness.py", "judge/plaindata.py", "facts.py"} <= set(re.findall(r"[a-z_/]+\.py", kernel))
    for _, modules, _ in pictures.STAGES:
        for name in re.findall(r"[a-z_/]+\.py", modules):
            assert (ROOT / "labkit" / name).is_file(), name
    svg = pictures.architecture_svg()
    assert svg.startswith("<svg") and all(
        stage.replace("'", "&#x27;") in svg for stage, _, _ in pictures.STAGES
    )


def test_the_sharding_picture_is_what_jax_says():
    layouts = pictures.sharding_layouts()
    both, rows, cols = layouts
    assert len(both) == 8 and all(
        len(devices) == 1 for _, devices in both
    )  # P('rows', 'cols'): one block each
    assert len(rows) == 2 and all(
        len(devices) == 4 for _, devices in rows
    )  # P('rows', None): copied along 'cols'
    assert len(cols) == 4 and all(len(devices) == 2 for _, devices in cols)
    assert sorted(d for _, devices in both for d in devices) == list(range(8))


def test_the_pipeline_picture_has_the_bubble_of_gpipe():
    plan = pictures.gpipe_schedule(4, 6)
    forward = {(s, t) for (s, t), work in plan.items() if work.startswith("F")}
    assert len(forward) == 24 and max(t for _, t in forward) == 4 + 6 - 2
    assert plan[(3, 3)] == "F0" and plan[(0, 5)] == "F5"


def test_a_broken_link_or_anchor_fails_the_build_and_is_named(tmp_path, capfd):
    kit = tmp_path / "kit"
    for name in ("docs", "labs"):
        shutil.copytree(ROOT / name, kit / name)
    shutil.copy2(ROOT / "BENCHMARKS.md", kit / "BENCHMARKS.md")
    (kit / "docs" / "student.md").write_text(
        (kit / "docs" / "student.md").read_text()
        + "\nSee [the missing page](nowhere.md) and [a missing anchor](grading.md#no-such-heading).\n"
    )
    assert docsite.build(tmp_path / "site", tmp_path / "src", kit) != 0
    said = capfd.readouterr().err
    assert "nowhere.md" in said and "no-such-heading" in said, said


def test_the_readme_is_short_and_points_every_reader_to_a_guide_that_exists():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", text)
    assert {"docs/student.md", "docs/grading.md", "docs/workshop.md"} <= set(links)
    assert all((ROOT / link).is_file() for link in links)


def test_the_guides_links_also_resolve_in_the_repository():
    """docs/ is read on the forge too: its links name files as the repository lays them out (the build
    maps them to the site); only the pictures, which the build draws, are not in the repository."""
    broken = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "img/")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []
