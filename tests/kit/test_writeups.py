"""Lab 14's design note: the markdown cell a student fills, handed to the TA as text for the rubric."""

from __future__ import annotations

import io
import json

from labkit.course import catalog
from labkit.grading.intake import handin, writeups

LAB = catalog.lab(14)
EVIL = "We split `data` by 8. <script>alert(1)</script> ```\n# not a heading of the TA's file"


def _with_note(text: str) -> str:
    nb = json.loads(LAB.student.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).startswith(writeups.HEADING):
            cell["source"] = writeups.HEADING + "\n\n" + text
    return json.dumps(nb)


def test_the_capstone_handout_asks_for_a_design_note():
    note = writeups.extract(LAB.student)
    assert note is not None and "Why this mesh?" in note and "What does it send?" in note


def test_grading_writes_each_students_note_for_the_ta_as_text(tmp_path):
    subs, out = tmp_path / "submissions", tmp_path / "out"
    for student, text in (("ann", _with_note(EVIL)), ("ben", LAB.student.read_text())):
        (subs / student).mkdir(parents=True)
        (subs / student / "lab-14.ipynb").write_text(text)
    found, times = handin.submissions_of(subs, out, None, io.StringIO())
    handin.keep(out, found, sorted(found.students), [LAB], times)
    ann = (out / "writeups" / "ann" / "lab-14.md").read_text()
    assert "We split 'data' by 8. <script>" in ann  # the student's words, inside the fence
    assert ann.count("```") == 2 and "\n# not a heading" not in ann.split("```text", 1)[0]
    assert "Not written" in (out / "writeups" / "ben" / "lab-14.md").read_text()


def test_a_lab_without_a_note_cell_writes_none(tmp_path):
    assert (
        writeups.write(tmp_path, "ann", 3, catalog.lab(3).student, writeups.extract(catalog.lab(3).student))
        is None
    )
    assert not (tmp_path / "writeups").exists()
