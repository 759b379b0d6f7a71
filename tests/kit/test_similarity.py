"""Submissions to look at together (labkit/grading/classwide/similarity.py): what counts as the same code, and what does not.

Notebooks here are built by hand: a small handout with one exercise, and students' versions of it.
"""

from __future__ import annotations

import json

import pytest

from labkit.grading.classwide import similarity

HANDOUT = [
    "import jax\nimport jax.numpy as jnp\nfrom jax.sharding import PartitionSpec as P",
    (
        'def layer_norm_sharded(x, mesh):\n    """Normalise each row of x, its rows split over \'data\'."""\n'
        "    raise NotImplementedError"
    ),
    'check("layer_norm_sharded")',
]

SOLUTION = '''def layer_norm_sharded(x, mesh):
    """Normalise each row of x, its rows split over 'data'."""
    # each device holds whole rows, so the statistics need no collective
    def local(block):
        mean = jnp.mean(block, axis=-1, keepdims=True)
        centred = block - mean
        variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
        return centred / jnp.sqrt(variance + 1e-6)
    spec = P("data", None)
    return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec)(x)
'''

# The same code with every name of the student's own changed, other comments, other spacing and quotes.
RENAMED = '''def layer_norm_sharded(inp, m):
    """My layer norm."""
    def f(b):
        mu = jnp.mean(b, axis=-1, keepdims=True)

        c = b-mu   # centre it
        var = jnp.mean(c*c, axis=-1, keepdims=True)
        return c / jnp.sqrt(var + 1e-6)
    s = P('rows', None)
    return jax.shard_map(f, mesh=m, in_specs=s, out_specs=s)(inp)
'''

# The same idea written otherwise: an all-reduce of partial sums over the columns.
DIFFERENT = """def layer_norm_sharded(x, mesh):
    n = x.shape[-1]
    def local(block):
        total = jax.lax.psum(jnp.sum(block, axis=-1, keepdims=True), "model")
        mean = total / n
        square = jax.lax.psum(jnp.sum((block - mean) ** 2, axis=-1, keepdims=True), "model")
        return (block - mean) * jax.lax.rsqrt(square / n + 1e-6)
    return jax.shard_map(local, mesh=mesh, in_specs=P(None, "model"), out_specs=P(None, "model"))(x)
"""


def notebook(*cells: str, outputs: str = "") -> dict:
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": "# Lab 3"},
            *(
                {
                    "cell_type": "code",
                    "metadata": {},
                    "execution_count": None,
                    "source": c,
                    "outputs": [{"output_type": "stream", "name": "stdout", "text": outputs}]
                    if outputs
                    else [],
                }
                for c in cells
            ),
        ],
    }


def handed_in(solution: str, outputs: str = "") -> list[str]:
    return similarity.code_cells(notebook(HANDOUT[0], solution, HANDOUT[2], outputs=outputs))


@pytest.fixture(scope="module")
def handout() -> dict:
    return similarity.starter(HANDOUT)


def entry(cells: list[str], handout: dict, digest: str = "") -> dict:
    return {"digest": digest, "code": similarity.fingerprint_of(cells, handout)}


def results_with(submissions: dict[str, dict]) -> dict:
    return {
        "labs": [{"number": 3, "name": "lab-3"}],
        "students": {s: {"notes": [], "submissions": {"3": e}} for s, e in submissions.items()},
    }


def test_renamed_variables_comments_spacing_and_quotes_leave_the_same_tokens():
    assert similarity.tokens(RENAMED) == similarity.tokens(SOLUTION)
    assert similarity.tokens(DIFFERENT) != similarity.tokens(SOLUTION)


def test_what_the_code_does_not_choose_keeps_its_name():
    seq = similarity.tokens("import jax.numpy as jnp\ntotal = jnp.sum(x, axis=0) + len(x)")
    assert {"jax", "jnp", "sum", "axis", "len"} <= set(seq)
    assert "total" not in seq and "x" not in seq and "v1" in seq


def test_a_cell_that_does_not_parse_is_still_compared():
    assert similarity.tokens("def f(:\n  x = 1") == similarity.tokens("def g(:\n  y = 1")
    assert similarity.tokens("%timeit f(x)\ny = f(x)") == similarity.tokens("z = f(x)")


def test_the_unchanged_handout_gives_no_code_of_ones_own(handout):
    code = similarity.fingerprint_of(HANDOUT, handout)
    assert code == {"normalised": "", "shingles": []}


def test_the_handouts_own_lines_are_left_out_of_an_edited_cell(handout):
    own = similarity.fingerprint_of(handed_in(SOLUTION), handout)["shingles"]
    everything = similarity.fingerprint_of(handed_in(SOLUTION))["shingles"]
    assert len(own) >= similarity.MIN_SHINGLES
    assert set(own) < set(everything)


def test_two_copies_of_the_handout_are_never_listed(handout):
    same = entry(HANDOUT, handout, digest="d0")
    assert similarity.pairs(results_with({"ann": same, "ben": dict(same)})) == []


def test_byte_identical_files_are_listed_as_such(handout):
    copy = entry(handed_in(SOLUTION), handout, digest="d1")
    assert similarity.pairs(results_with({"ann": copy, "ben": dict(copy)})) == [
        {"lab": 3, "students": ["ann", "ben"], "how": "byte-identical", "similarity": 1.0}
    ]


def test_renamed_variables_and_other_outputs_read_as_identical_after_normalising(handout):
    found = similarity.pairs(
        results_with(
            {
                "ann": entry(handed_in(SOLUTION, outputs="1.0"), handout, digest="d1"),
                "ben": entry(handed_in(RENAMED, outputs="2.0"), handout, digest="d2"),
            }
        )
    )
    assert found == [
        {"lab": 3, "students": ["ann", "ben"], "how": "identical after normalising", "similarity": 1.0}
    ]


def test_a_small_change_reads_as_near_identical_with_its_similarity(handout):
    edited = SOLUTION.replace("1e-6", "1e-5")
    found = similarity.pairs(
        results_with(
            {"ann": entry(handed_in(SOLUTION), handout, "d1"), "ben": entry(handed_in(edited), handout, "d2")}
        )
    )
    assert [(p["students"], p["how"]) for p in found] == [(["ann", "ben"], "near-identical")]
    assert similarity.NEAR <= found[0]["similarity"] < 1


def test_code_written_otherwise_is_not_listed(handout):
    found = similarity.pairs(
        results_with(
            {
                "ann": entry(handed_in(SOLUTION), handout, "d1"),
                "ben": entry(handed_in(DIFFERENT), handout, "d2"),
                "cy": entry(handed_in(RENAMED), handout, "d3"),
            }
        )
    )
    assert [p["students"] for p in found] == [["ann", "cy"]]


def test_short_answers_alike_are_not_listed_unless_the_files_are_the_same(handout):
    short = "def layer_norm_sharded(x, mesh):\n    return x / 2"
    found = similarity.pairs(
        results_with(
            {
                "ann": entry(handed_in(short), handout, "d1"),
                "ben": entry(handed_in(short.replace("x", "y")), handout, "d2"),
            }
        )
    )
    assert found == []


def test_submissions_of_different_labs_are_never_compared(handout):
    res = results_with({"ann": entry(handed_in(SOLUTION), handout, "d1")})
    res["labs"].append({"number": 4, "name": "lab-4"})
    res["students"]["ben"] = {"notes": [], "submissions": {"4": entry(handed_in(SOLUTION), handout, "d1")}}
    assert similarity.pairs(res) == []


def test_a_notebook_file_is_read_for_its_code_cells_only(tmp_path, handout):
    path = tmp_path / "lab-3.ipynb"
    path.write_text(json.dumps(notebook(HANDOUT[0], SOLUTION, outputs="printed")))
    assert similarity.fingerprint(path, handout) == similarity.fingerprint_of([HANDOUT[0], SOLUTION], handout)
    path.write_text("not a notebook")
    assert similarity.fingerprint(path, handout) is None


def test_a_declared_groups_one_submission_is_not_a_pair(handout):
    copy = entry(handed_in(SOLUTION), handout, digest="d1")
    res = results_with({"ann": copy, "ben": dict(copy), "cy": dict(copy)})
    res["students"]["ann"]["group"] = res["students"]["ben"]["group"] = "team-1"
    assert [p["students"] for p in similarity.pairs(res)] == [["ann", "cy"], ["ben", "cy"]]
    gradescope = results_with(
        {"ann": dict(copy, group=["ann", "ben"]), "ben": dict(copy, group=["ann", "ben"])}
    )
    assert similarity.pairs(gradescope) == []


def test_a_gradescope_group_submission_reaches_the_results_as_one_group(tmp_path):
    import io

    from test_lms import GROUP_META, ROSTER, make_zip, nb

    from labkit.course import catalog
    from labkit.grading.intake import handin

    z = make_zip(
        tmp_path / "gs.zip",
        {"submission_metadata.yml": GROUP_META, "submission_444/lab-3.ipynb": nb("alice and dana")},
    )
    out = tmp_path / "out"
    subs, times = handin.submissions_of(z, out, ROSTER, io.StringIO())
    handed = handin.keep(out, subs, ["alice", "dana"], [catalog.lab(3)], times)
    assert handed["alice", 3]["group"] == handed["dana", 3]["group"] == ["alice", "dana"]
    people = {"alice": {}, "dana": {}}
    assert similarity.together(people, "alice", "dana", handed["alice", 3], handed["dana", 3])
