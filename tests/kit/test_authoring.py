import json

import pytest

from labkit.course import authoring, catalog

SOLVED = """def f(x):
    ### BEGIN SOLUTION
    return x * 2
    ### END SOLUTION
"""


def test_a_solution_region_becomes_a_stub_with_the_same_indent():
    out = authoring.strip_source(SOLVED)
    assert "return x * 2" not in out
    assert '    raise NotImplementedError("write your solution here")' in out
    assert out.startswith("def f(x):")


@pytest.mark.parametrize(
    "source",
    [
        "### BEGIN SOLUTION\nx = 1\n",
        "x = 1\n### END SOLUTION\n",
        "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n",
    ],
)
def test_unbalanced_markers_are_refused(source):
    with pytest.raises(authoring.MarkerError):
        authoring.strip_source(source)


@pytest.mark.parametrize("lab", catalog.labs(), ids=lambda lab: lab.name)
def test_student_notebooks_are_up_to_date_with_the_references(lab):
    assert not authoring.stale(lab.reference, lab.student), f"run `make student-notebooks` for {lab.name}"


@pytest.mark.parametrize("lab", catalog.labs(), ids=lambda lab: lab.name)
def test_notebooks_in_git_carry_no_outputs_and_no_solutions(lab):
    for path in (lab.reference, lab.student):
        for cell in json.loads(path.read_text())["cells"]:
            assert not cell.get("outputs"), f"{path} has outputs"
    assert "BEGIN SOLUTION" not in lab.student.read_text()


def test_generation_never_overwrites_a_notebook_a_student_edited(tmp_path):
    lab = catalog.labs()[0]
    student = tmp_path / "lab.ipynb"
    assert authoring.generate(lab.reference, student)
    nb = json.loads(student.read_text())
    nb["cells"][-1]["source"] = "my own work"
    student.write_text(json.dumps(nb))
    before = student.read_text()
    ref = tmp_path / "ref.ipynb"
    ref_nb = json.loads(lab.reference.read_text())
    ref_nb["cells"][0]["source"] = "# A changed heading"
    ref.write_text(json.dumps(ref_nb))
    with pytest.raises(authoring.EditedNotebook):
        authoring.generate(ref, student)
    assert student.read_text() == before


def test_an_unedited_generated_notebook_is_regenerated(tmp_path):
    lab = catalog.labs()[0]
    student = tmp_path / "lab.ipynb"
    authoring.generate(lab.reference, student)
    ref = tmp_path / "ref.ipynb"
    ref_nb = json.loads(lab.reference.read_text())
    ref_nb["cells"][0]["source"] = "# A changed heading"
    ref.write_text(json.dumps(ref_nb))
    assert authoring.generate(ref, student)
    assert "A changed heading" in student.read_text()


def test_what_several_labs_need_lives_in_one_shared_page_and_no_two_labs_share_a_paragraph():
    """A paragraph (over 80 characters) found in two labs must be a pointer to a shared page in labs/ that
    exists; anything longer said twice is copy that drifts."""
    import collections
    import json
    import re

    labs = catalog.labs()[0].student.parent
    found = collections.defaultdict(set)
    for lab in catalog.labs():
        for cell in json.loads(lab.student.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                for paragraph in re.split(r"\n\s*\n", "".join(cell["source"])):
                    text = " ".join(paragraph.split())
                    if len(text) > 80:
                        found[text].add(lab.number)
    repeated = {text: labs_ for text, labs_ in found.items() if len(labs_) > 1}
    pages = {text: re.findall(r"labs/(\w+\.md)", text) for text in repeated}
    copied = {text[:100]: sorted(numbers) for text, numbers in repeated.items() if not pages[text]}
    assert copied == {}, "paragraphs copied between labs: move them to a page in labs/ and point to it"
    for text, names in pages.items():
        assert all((labs / name).is_file() for name in names), (names, text[:100])
        assert len(text) < 300, "a pointer, not the text itself"
    assert (labs / "meshes.md").is_file()


def test_make_list_gives_the_reading_order_and_each_moved_lab_comes_after_what_it_needs():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "labkit", "list"],
        cwd=catalog.ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    numbers = [int(line.split()[0]) for line in done.stdout.splitlines() if line.strip()]
    assert numbers == [lab.number for lab in catalog.reading_order()]
    assert sorted(numbers) == [lab.number for lab in catalog.labs()]
    assert numbers.index(12) == numbers.index(3) + 1 and "read it after lab 3" in done.stdout
    # what lab 12 uses is taught before it: jit and placements (lab 2), shard_map (lab 3)
    text = catalog.lab(12).student.read_text()
    assert "shard_map" in text and numbers.index(12) > numbers.index(3) > numbers.index(2)
