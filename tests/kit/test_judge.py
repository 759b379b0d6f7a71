"""How the kit runs a lab's tests: pytest in the kit's process, with the kit's plugin and pytest's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from labkit.course import catalog

PLUGIN = "import pathlib, os\npathlib.Path(os.environ['LOADED']).write_text('loaded')\n"


def _installed_plugin(site: Path) -> None:
    """A pytest plugin installed in `site` as pip would install one: it says so in a file when imported."""
    (site / "planted_plugin.py").write_text(PLUGIN)
    info = site / "planted_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nplanted = planted_plugin\n")


def _collect(site: Path, loaded: Path, code: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(site), LOADED=str(loaded))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=catalog.ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_pytest_plugin_installed_beside_the_kit_is_not_loaded_by_the_judge(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _installed_plugin(site)
    tests = [str(d) for d in catalog.lab(3).test_dirs()]
    # pytest on its own loads it: the plugin is installed where the judge would find it
    _collect(site, tmp_path / "by-pytest", f"import pytest; pytest.main({tests} + ['--collect-only', '-q'])")
    assert (tmp_path / "by-pytest").exists()
    _collect(site, tmp_path / "by-judge", f"from labkit.judge import judge; judge.collect_calls({tests})")
    assert not (tmp_path / "by-judge").exists()
