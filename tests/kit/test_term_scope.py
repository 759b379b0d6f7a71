"""The term's scope kept with the course's state (labkit/grading/state/term.py): the sources, labs and
configurations a bare `make grade` grades again, and what a narrower run grades (the rest is held).

Pure: no notebook runs here; the grading runs that use the term are in test_course_state.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.grading.running import held
from labkit.grading.state import term

LABS = list(range(1, 15))
HERE = ["cpu-1", "cpu-8", "cpu-2x4"]


def resolve(folder: Path, submissions=None, labs=None, configs=None, forget=()):
    return term.resolve(
        folder,
        submissions=submissions,
        labs=labs,
        configs=configs,
        forget=list(forget),
        all_labs=LABS,
        default_configs=HERE,
        is_download=lambda p: p.suffix == ".zip",
    )


@pytest.fixture
def subs(tmp_path: Path) -> Path:
    (tmp_path / "submissions").mkdir()
    return tmp_path / "submissions"


def test_a_bare_run_grades_the_kept_labs_configs_and_sources(tmp_path, subs):
    first = resolve(tmp_path / "course", subs, [3, 5], ["cpu-1", "cpu-8"])
    first.save()
    bare = resolve(tmp_path / "course")
    assert (bare.labs, bare.configs) == ([3, 5], ["cpu-1", "cpu-8"])
    assert (bare.run_labs, bare.run_configs, bare.narrowed) == ([3, 5], ["cpu-1", "cpu-8"], False)
    assert [s["path"] for s in bare.sources] == [str(subs.absolute())] and not bare.changes


def test_a_narrower_run_keeps_the_term_and_grades_only_what_it_names(tmp_path, subs):
    resolve(tmp_path / "course", subs, [3, 5], ["cpu-1", "cpu-8"]).save()
    narrow = resolve(tmp_path / "course", labs=[3])
    assert (narrow.labs, narrow.run_labs, narrow.narrowed) == ([3, 5], [3], True)
    assert "every other unit is held as it was" in "\n".join(narrow.lines())
    wider = resolve(tmp_path / "course", labs=[7], configs=["cpu-2x4"])
    assert (wider.labs, wider.run_labs, wider.configs) == ([3, 5, 7], [7], ["cpu-1", "cpu-8", "cpu-2x4"])
    assert "labs: 7 added to the term" in wider.changes


def test_forget_drops_a_kept_value_and_the_given_one_is_the_terms(tmp_path, subs):
    resolve(tmp_path / "course", subs, [3, 5], ["cpu-1", "cpu-8"]).save()
    again = resolve(tmp_path / "course", labs=[3], forget=["labs"])
    assert (again.labs, again.run_labs) == ([3], [3]) and any("labs: forgotten" in c for c in again.changes)
    assert resolve(tmp_path / "course", forget=["configs"]).configs == HERE
    with pytest.raises(term.TermError, match="--forget lab: no such course input"):
        term.split_forget("overrides,lab", ["roster", "overrides"])
    assert term.split_forget("labs,overrides", ["overrides"]) == (["labs"], "overrides")


def test_downloads_add_up_in_the_term_and_are_read_again_only_when_they_changed(tmp_path):
    week1, week2 = tmp_path / "canvas-lab3.zip", tmp_path / "canvas-lab5.zip"
    week1.write_bytes(b"one")
    week2.write_bytes(b"two")
    resolve(tmp_path / "course", week1, [3]).save()
    second = resolve(tmp_path / "course", week2, [5])
    assert [Path(s["path"]).name for s in second.sources] == ["canvas-lab3.zip", "canvas-lab5.zip"]
    out = tmp_path / "out"
    out.mkdir()
    term.Read(out).mark(str(week1), term.digest(week1), ["a note of week 1"])
    read = term.Read(out)  # as the next run reads it
    assert not read.fresh(str(week1), term.digest(week1)) and read.fresh(str(week2), term.digest(week2))
    assert read.notes(str(week1)) == ["a note of week 1"]
    week1.write_bytes(b"one, and a late one")
    assert read.fresh(str(week1), term.digest(week1))
    assert term.Read(tmp_path / "shard").fresh(str(week1), term.digest(week1))  # another OUT reads it itself


def test_a_folder_class_and_lms_downloads_are_not_mixed_silently(tmp_path, subs):
    zipped = tmp_path / "canvas.zip"
    zipped.write_bytes(b"z")
    resolve(tmp_path / "course", zipped, [3]).save()
    with pytest.raises(term.TermError, match="cannot be added up.*--forget submissions"):
        resolve(tmp_path / "course", subs)
    assert [s["kind"] for s in resolve(tmp_path / "course", subs, forget=["submissions"]).sources] == [
        "folder"
    ]
    with pytest.raises(term.TermError, match="does not exist"):
        resolve(tmp_path / "other", tmp_path / "nowhere")


def test_a_kept_term_that_is_not_the_kits_is_named(tmp_path):
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / term.FILE).write_text(json.dumps({"labs": ["three"]}))
    with pytest.raises(term.TermError, match="term.json: the term's kept scope cannot be read"):
        resolve(tmp_path / "course")


def test_a_selection_holds_every_unit_it_does_not_name_and_grades_what_was_never_graded():
    row = {"student": "a", "lab": 5, "config": "cpu-1", "points": 3}
    before = held.Previous(rows={("a", 5, "cpu-1"): row, ("a", 3, "cpu-1"): {}, ("b", 3, "cpu-1"): {}})
    only = held.Selection({3}, {"cpu-1"}, {"a"}, before)
    assert (
        only.grades("a", 3, "cpu-1") and not only.grades("b", 3, "cpu-1") and not only.grades("a", 5, "cpu-1")
    )
    assert only.grades("c", 5, "cpu-1")  # new to the class: nothing to hold
