"""The course and manual site (`make docs`): assembled from the kit's own files, built offline.

    python -m labkit.course.docsite [--out build/site]

The site's sources are put together in `build/docs-src/`: the guides in `docs/` (student, TA,
organiser, authoring, containers, the sandbox and its threat model, the architecture, development), the course (every
student notebook in reading order, as `make list` gives it, and the pages the labs share, such as
`labs/meshes.md`; never a reference solution), the benchmarks (BENCHMARKS.md), and the pictures the
kit draws itself (`labkit/course/pictures.py`). MkDocs with the Material theme builds them into
`build/site/` with `--strict`: a link to a page or an anchor that does not exist fails the build.
The site needs no network to build or to read (no web fonts; the theme's `offline` plugin).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from labkit.course import catalog, pictures

ROOT = catalog.ROOT
SOURCES = ROOT / "build" / "docs-src"
SITE = ROOT / "build" / "site"

# Links in docs/ that point out of it, as the repository lays files out -> where the site puts them.
LINKS = {"../BENCHMARKS.md": "benchmarks.md", "../labs/": "course/"}

# The guides, in the order of the site's navigation: (file in docs/, title).
GUIDES = (
    ("index.md", "Home"),
    ("student.md", "Student guide"),
    ("grading.md", "TA guide"),
    ("workshop.md", "Organiser's guide"),
    ("authoring.md", "Writing labs"),
    ("containers.md", "Containers and offline use"),
    ("sandbox.md", "Sandbox and threat model"),
    ("architecture.md", "Architecture"),
    ("development.md", "Developing the kit"),
)


def _config(course: list[tuple[str, str]]) -> dict:
    nav = [{title: name} for name, title in GUIDES]
    nav.insert(2, {"The course": [{"About the labs": "course.md"}, *({t: p} for p, t in course)]})
    nav.append({"Benchmarks": "benchmarks.md"})
    return {
        "site_name": "JAX SPMD lab kit",
        "docs_dir": "docs",
        "site_dir": str(SITE),
        "use_directory_urls": False,  # pages open from the file system, offline
        "strict": True,
        "theme": {
            "name": "material",
            "font": False,
            "features": ["navigation.sections", "content.code.copy"],
        },
        "markdown_extensions": [
            "tables",
            "admonition",
            "pymdownx.superfences",
            "pymdownx.details",
            {"toc": {"permalink": True}},
        ],
        "plugins": [
            "search",
            "offline",
            {"mkdocs-jupyter": {"execute": False, "include_source": False, "ignore_h1_titles": True}},
        ],
        # The theme's offline plugin loads a small shim for search from unpkg.com unless one is named
        # here: the site names the copy it carries (iframe-worker 1.0.4, MIT, docs/vendor/).
        "extra": {"polyfills": ["vendor/iframe-worker-1.0.4-shim.js"]},
        "validation": {
            "omitted_files": "warn",
            "absolute_links": "warn",
            "unrecognized_links": "warn",
            "anchors": "warn",
        },
        "nav": nav,
    }


def assemble(out: Path = SOURCES, root: Path = ROOT, python: str = sys.executable) -> Path:
    """Put the site's sources together in `out` (replaced); returns the mkdocs.yml written there."""
    if out.exists():
        shutil.rmtree(out)
    docs = out / "docs"
    docs.mkdir(parents=True)
    for name, _ in GUIDES + (("course.md", ""),):
        # links written for the repository (docs/ beside BENCHMARKS.md and labs/) become the site's
        text = (root / "docs" / name).read_text()
        for repository, in_site in LINKS.items():
            text = text.replace(f"]({repository}", f"]({in_site}")
        (docs / name).write_text(text)
    shutil.copy2(root / "BENCHMARKS.md", docs / "benchmarks.md")
    shutil.copytree(root / "docs" / "vendor", docs / "vendor")
    for shot in sorted((root / "docs").glob("*.png")):  # screenshots the guides show (the review page)
        shutil.copy2(shot, docs / shot.name)
    course = []
    (docs / "course").mkdir()
    for lab in catalog.reading_order(root):
        shutil.copy2(lab.student, docs / "course" / lab.student.name)
        course.append((f"course/{lab.student.name}", lab.title))
    for page in sorted((root / "labs").glob("*.md")):
        shutil.copy2(page, docs / "course" / page.name)
        course.append((f"course/{page.name}", page.read_text().splitlines()[0].lstrip("# ").strip()))
    pictures.write_all(docs / "img", python)
    config = out / "mkdocs.yml"
    config.write_text(json.dumps(_config(course), indent=1))  # JSON is YAML
    return config


def build(site: Path = SITE, sources: Path = SOURCES, root: Path = ROOT) -> int:
    config = assemble(sources, root)
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        print(
            "error: mkdocs is not installed in this environment: `make docs` installs the `docs` group",
            file=sys.stderr,
        )
        return 1
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", NO_COLOR="1")
    # Not --quiet: that hides the warnings --strict counts. MkDocs' INFO lines are left out.
    # mkdocs-jupyter keeps a cache of rendered notebooks in `.cache/` where it runs: beside the sources
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "-f", str(config), "-d", str(site)],
        env=env,
        cwd=sources.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    said = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and not line.startswith("INFO")
    ]
    if said:
        print("\n".join(said), file=sys.stderr)
    if done.returncode == 0:
        print(f"The site is in {site}/ (open {site / 'index.html'}).")
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.course.docsite", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=SITE, help="the site's folder (default build/site)")
    args = p.parse_args(argv)
    return build(args.out.resolve())


if __name__ == "__main__":
    sys.exit(main())
