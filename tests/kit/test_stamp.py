"""`make lab-N` says how to open the notebook and notes a notebook saved before the last check()."""

from __future__ import annotations

import os

from labkit.student import stamp


def _notebook(tmp_path, saved: float):
    nb = tmp_path / "lab-3.ipynb"
    nb.write_text("{}")
    os.utime(nb, (saved, saved))
    return nb


def test_a_notebook_saved_before_the_last_check_is_noted(tmp_path):
    folder = tmp_path / "build"
    stamp.write(folder, now=2_000_000.0)
    lines = stamp.advice(_notebook(tmp_path, 1_000_000.0), folder)
    assert "jupyter lab" in lines[0]
    assert any("before your last check()" in line and "save it in JupyterLab" in line for line in lines), (
        lines
    )


def test_a_notebook_saved_after_the_last_check_or_never_checked_gets_no_note(tmp_path):
    folder = tmp_path / "build"
    nb = _notebook(tmp_path, 3_000_000.0)
    assert len(stamp.advice(nb, folder)) == 1  # no stamp yet: only how to open it
    stamp.write(folder, now=2_000_000.0)
    assert len(stamp.advice(nb, folder)) == 1


def test_a_stamp_that_is_a_link_or_not_a_time_is_no_stamp(tmp_path):
    folder = tmp_path / "build"
    folder.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text('{"time": 5}')
    (folder / stamp.NAME).symlink_to(target)
    assert stamp.read(folder) is None
    (folder / stamp.NAME).unlink()
    (folder / stamp.NAME).write_text('{"time": "soon"}')
    assert stamp.read(folder) is None
