"""The environment the tests run in: no two distributions install the same top-level module, none is half
there, and tools with a world of their own (checkov) stay out of it."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from labkit.machine import venvfiles

SITE = Path(sysconfig.get_paths()["purelib"])


def test_no_two_distributions_in_the_environment_install_the_same_top_level_module():
    assert venvfiles.clashes(SITE) == {}, "move the tool that brings the clash into an environment of its own"


def test_every_installed_distribution_has_all_its_files():
    assert venvfiles.damaged(SITE) == {}, "`make setup` reinstalls them"


def test_checkov_is_not_in_the_environment():
    assert not list(SITE.glob("checkov-*.dist-info")) and not list(SITE.glob("bc_python_hcl2-*.dist-info"))


def test_a_module_two_distributions_install_is_found(tmp_path):
    for dist, files in (
        ("python_hcl2-8.1.4", ["hcl2/__init__.py", "hcl2/api.py"]),
        ("bc_python_hcl2-0.4.2", ["hcl2/__init__.py", "hcl2/parser.py"]),
        ("google_a-1", ["google/a/__init__.py"]),
        ("google_b-1", ["google/b/__init__.py"]),
    ):
        info = tmp_path / f"{dist}.dist-info"
        info.mkdir()
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in files) + f"{info.name}/RECORD,,\n")
        for f in files:
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f).write_text("")
    # google/ is a namespace package (no __init__.py of its own): shared by design, not a clash.
    assert venvfiles.clashes(tmp_path) == {"hcl2": ["bc_python_hcl2", "python_hcl2"]}
    (tmp_path / "hcl2" / "api.py").unlink()
    assert venvfiles.damaged(tmp_path) == {"python_hcl2": ["hcl2/api.py"]}
