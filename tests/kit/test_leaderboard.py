"""The class leaderboard: students whose code passes, ranked by their own card's modelled step time.

Drawn from synthetic results (what `grade` writes) with cost cards made here, so that each
student's time is known: on eight TPU v5e chips (a ring with no wraparound link: half of 100 GB/s of
send bandwidth) an fsdp_mlp card that sends N bytes per device and computes little is
communication-bound at N / 50e9 seconds.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from labkit import cost
from labkit.course import catalog, configs
from labkit.grading.classwide import gathered, leaderboard
from labkit.grading.intake import collect
from labkit.grading.publish import gradescope, markdown, pages, scoreboard
from labkit.grading.publish import merge as merging
from labkit.grading.state import roster
from labkit.run import modes

EVIL = "<img src=x onerror=\"document.title='pwned'\">"
SPEC = catalog.LEADERBOARDS[9]
CALL = "fsdp_mlp-0aa9a0024277"
REFERENCE_SENT = 7392  # the bytes the reference's fsdp_mlp sends per device: 148 ns on a v5e x8
RING = 50e9  # what one of eight v5e chips sends into a ring: no wraparound, half of 100 GB/s


def card(sent: float) -> dict:
    c = cost.Card(
        devices=8,
        flops=16640.0,
        held={"argument": 1568, "output": 512, "temp": 8448},
        sent={"all-gather": float(sent)},
        counts={"all-gather": 4},
    )
    return {CALL: {"function": "fsdp_mlp", "runs": {"cpu-8": c.to_json()}}}


def row(student: str, sent: float, passes: bool = True, config: str = "cpu-8") -> dict:
    tests = [
        {
            "test": "test_fsdp_equals_the_unsplit_mlp",
            "exercise": "fsdp_mlp",
            "file": "t.py",
            "hidden": False,
            "status": "passed",
            "message": "",
        },
        {
            "test": "test_fsdp_mlp_stores_each_weight_in_pieces_one_per_device",
            "exercise": "fsdp_mlp",
            "file": "h.py",
            "hidden": True,
            "status": "passed" if passes else "failed",
            "message": "" if passes else "w1 is whole on every device",
        },
    ]
    return {
        "student": student,
        "lab": 9,
        "config": config,
        "status": "ok" if passes else "failed",
        "passed": 2 if passes else 1,
        "total": 2,
        "message": "" if passes else "1 of 2 tests did not pass",
        "tests": tests,
        "cell_errors": [],
        "notes": [],
        "costs": card(sent),
    }


def make_results(rows: list[dict], hide: tuple[str, ...] = ()) -> dict:
    students = sorted({r["student"] for r in rows})
    return {
        "format": 1,
        "labs": [
            {
                "number": 9,
                "name": "lab-9",
                "title": "Lab 9 · Tensor parallelism and FSDP",
                "leaderboard": SPEC.to_json(),
                "reference_costs": {"cpu-8": card(REFERENCE_SENT)},
            }
        ],
        "configs": [{"name": "cpu-8", "summary": "eight simulated CPU devices", "devices": 8}],
        "students": {s: {"notes": [], **({"leaderboard": "hide"} if s in hide else {})} for s in students},
        "notes": [],
        "rows": rows,
    }


def board_of(results: dict) -> dict:
    return json.loads(scoreboard.to_json(results))["leaderboards"][0]


def leaderboard_section(markdown: str) -> str:
    start = markdown.index("## Leaderboard")
    return markdown[start : markdown.index("\n## ", start + 1)]


# ----------------------------------------------------------------------------------------
# Who is ranked, and in which order.
# ----------------------------------------------------------------------------------------


def test_students_are_ranked_by_their_modelled_step_time_fastest_first():
    results = make_results([row("alice", 20000), row("bob", 5000), row("carl", 10000)])
    places = board_of(results)["places"]
    assert [p["name"] for p in places] == ["bob", "carl", "alice"]
    assert [p["rank"] for p in places] == [1, 2, 3]
    assert [p["seconds"] for p in places] == pytest.approx([5000 / RING, 10000 / RING, 20000 / RING])
    table = leaderboard_section(markdown.to_markdown(results))
    assert (
        table.index("| 1 | bob | 100 ns |")
        < table.index("| 2 | carl | 200 ns |")
        < table.index("| 3 | alice | 400 ns |")
    )


def test_the_time_is_the_step_time_the_students_own_card_models_on_the_named_chip():
    results = make_results([row("alice", 12345)])
    want = cost.Card.from_json(card(12345)[CALL]["runs"]["cpu-8"]).timing(cost.chips()[SPEC.chip]).step
    assert board_of(results)["places"][0]["seconds"] == want
    assert board_of(results)["reference"]["time"] == "148 ns"


def test_equal_times_are_ranked_in_the_order_of_the_student_ids():
    results = make_results([row("dora", 5000), row("carl", 5000), row("bob", 5000), row("alice", 9000)])
    assert [p["name"] for p in board_of(results)["places"]] == ["bob", "carl", "dora", "alice"]


def test_a_student_whose_row_fails_is_not_ranked():
    results = make_results([row("alice", 20000), row("bob", 1000, passes=False)])
    assert [p["name"] for p in board_of(results)["places"]] == ["alice"]
    assert "bob" not in leaderboard_section(markdown.to_markdown(results))
    assert "not ranked: only code that passes every test on cpu-8 is ranked" in markdown.feedback(
        results, "bob"
    )


def test_a_passing_row_whose_card_the_kit_did_not_verify_is_listed_as_not_ranked_saying_why():
    reported = row("bob", 1000)
    reported["costs"][CALL]["reported"] = ["cpu-8"]  # the run's own report, not the kit's run of its program
    results = make_results([row("alice", 20000), reported])
    board = board_of(results)
    assert [p["name"] for p in board["places"]] == ["alice"] and board["not_ranked"] == 1
    assert "Not ranked: 1 passing run (it passes, but gave no card of a program the kit verified" in (
        leaderboard_section(markdown.to_markdown(results))
    )
    assert "not ranked: it passes, but gave no card of a program the kit verified" in markdown.feedback(
        results, "bob"
    )


def test_a_card_is_marked_reported_where_its_call_was_not_verified_by_the_kit():
    import numpy as np

    from labkit import checks

    call = checks.compiled_call("fsdp_mlp", np.ones((2, 2), np.float32))
    facts = {"devices": 8, "flops": 1.0, "memory": {"argument": 1, "output": 1, "temp": 1}, "collectives": []}
    results = {
        "cpu-8": {call.id: {"facts": facts, "judged_by": "verified"}},
        "cpu-2x4": {call.id: {"facts": facts, "judged_by": "reported"}},
    }
    (found,) = cost.cards([{"id": call.id, **call.encoded()}], results).values()
    assert found.reported == {"cpu-2x4"} and cost.from_json(cost.to_json({call.id: found}))[
        call.id
    ].reported == {"cpu-2x4"}


def test_a_row_on_another_configuration_does_not_rank_a_student():
    results = make_results([row("alice", 20000), row("bob", 1000, config="cpu-1")])
    results["configs"].append({"name": "cpu-1", "summary": "one CPU device", "devices": 1})
    assert [p["name"] for p in board_of(results)["places"]] == ["alice"]


def test_a_lab_without_a_leaderboard_draws_none():
    results = make_results([row("alice", 20000)])
    del results["labs"][0]["leaderboard"]
    assert "leaderboards" not in json.loads(scoreboard.to_json(results))
    assert "Leaderboard" not in markdown.to_markdown(results) + markdown.feedback(results, "alice")
    assert 'class="leaderboard"' not in pages.to_html(results)


# ----------------------------------------------------------------------------------------
# Opting out, and ids that are markup.
# ----------------------------------------------------------------------------------------


def test_a_student_who_opted_out_appears_as_anonymous_with_their_rank_and_never_their_id():
    results = make_results([row("alice", 5000), row("bob", 10000), row("carl", 20000)], hide=("alice",))
    results["policy"] = {"leaderboard": {"names": True}}  # a course that shows ids: the opt-out still holds
    board = board_of(results)
    assert [(p["rank"], p["name"]) for p in board["places"]] == [(1, "anonymous"), (2, "bob"), (3, "carl")]
    assert "alice" not in json.dumps(board)
    assert "alice" not in leaderboard_section(markdown.to_markdown(results))
    for other in ("bob", "carl"):  # what the others are handed back
        assert "alice" not in markdown.feedback(results, other)
        assert "alice" not in pages.feedback_html(results, other)
        assert "anonymous" in markdown.feedback(results, other)
    page = pages.to_html(results)
    start = page.index('<table class="leaderboard"')
    table = page[start : page.index("</table>", start)]
    assert "alice" not in table and "anonymous" in table


def test_a_student_who_opted_out_is_told_their_own_rank():
    results = make_results([row("alice", 5000), row("bob", 10000)], hide=("alice",))
    assert "rank 1 of 2 (shown as anonymous)" in markdown.feedback(results, "alice")


def test_markup_in_a_student_id_is_shown_as_text_on_every_leaderboard():
    results = make_results([row(EVIL, 5000), row("bob", 10000)])
    results["policy"] = {"leaderboard": {"names": True}}  # ids on the students' boards too
    for page in (
        pages.to_html(results),
        pages.feedback_html(results, "bob"),
        pages.feedback_html(results, EVIL),
    ):
        assert "<img src=x" not in page
        assert "&lt;img src=x onerror=&#34;document.title=&#39;pwned&#39;&#34;&gt;" in page
    for md in (leaderboard_section(markdown.to_markdown(results)), markdown.feedback(results, "bob")):
        assert "\\<img src=x" in md and re.search(r"(?<!\\)<", md) is None  # escaped, never a tag


# ----------------------------------------------------------------------------------------
# What a student is told.
# ----------------------------------------------------------------------------------------


def test_a_students_own_board_names_them_you_and_their_classmates_by_rank_only():
    results = make_results([row("alice", 5000), row("bob", 10000), row("carl", 20000)])
    assert [p["name"] for p in board_of(results)["places"]] == ["alice", "bob", "carl"]  # the TA's class page
    for render in (markdown.feedback, pages.feedback_html):
        page = render(results, "bob")
        assert "alice" not in page and "carl" not in page, page
        assert "classmate 1" in page and "classmate 3" in page and "you" in page


def test_a_course_whose_policy_says_names_shows_classmates_by_id():
    from labkit.grading.state import policy

    chosen = policy.parse("[leaderboard]\nnames = true\n", known_labs=[9])
    assert chosen.names and policy.Policy.from_json(chosen.to_json()).names
    results = make_results([row("alice", 5000), row("bob", 10000)])
    results["policy"] = chosen.to_json()
    assert "alice" in markdown.feedback(results, "bob")
    with pytest.raises(policy.PolicyError, match="names must be true or false"):
        policy.parse("[leaderboard]\nnames = 'yes'\n", known_labs=[9])


def test_the_students_feedback_names_their_time_and_the_references():
    results = make_results([row("alice", 5000), row("bob", 10000)])
    said = "Leaderboard (fsdp_mlp on cpu-8): yours: 200 ns on a TPU v5e; the reference: 148 ns; rank 2 of 2."
    assert said in markdown.feedback(results, "bob")
    assert said in pages.feedback_html(results, "bob")


def test_the_leaderboards_are_drawn_from_the_whole_class_after_merging_its_parts(tmp_path):
    whole = make_results([row("alice", 20000), row("bob", 5000), row("carl", 10000)])
    parts = []
    for i, students in enumerate(({"alice"}, {"bob", "carl"})):
        part = whole | {
            "students": {s: v for s, v in whole["students"].items() if s in students},
            "rows": [r for r in whole["rows"] if r["student"] in students],
        }
        scoreboard.write(part, tmp_path / f"part{i}")
        parts.append(scoreboard.read(tmp_path / f"part{i}"))
    assert scoreboard.to_json(merging.merge(parts)) == scoreboard.to_json(whole)


# ----------------------------------------------------------------------------------------
# Gradescope: each submission reports its own time; Gradescope ranks them.
# ----------------------------------------------------------------------------------------


def gradescope_results(seconds: float | None) -> dict:
    outcomes = [
        {
            "test": "test_fsdp_equals_the_unsplit_mlp",
            "config": "cpu-8",
            "status": "passed",
            "message": "",
            "hidden": False,
            "points": 1,
        }
    ]
    results = gradescope.results_json(outcomes, ["cpu-8"], gradescope.policy.Policy(), [])
    return gradescope.with_leaderboard(results, SPEC, seconds, REFERENCE_SENT / RING)


def test_gradescope_results_carry_the_leaderboard_in_gradescopes_documented_shape():
    results = gradescope_results(5e-8)
    gradescope.validate(results)
    assert results["leaderboard"] == [
        {"name": "fsdp_mlp on cpu-8: modelled step time on a TPU v5e (µs)", "value": 0.05, "order": "asc"}
    ]
    assert "yours: 50 ns on a TPU v5e; the reference: 148 ns." in results["output"]


def test_gradescope_ranks_no_submission_whose_run_does_not_pass():
    results = gradescope_results(None)
    gradescope.validate(results)
    assert results["leaderboard"] == []
    assert "not ranked" in results["output"] and "the reference: 148 ns" in results["output"]


def test_the_schema_refuses_a_leaderboard_entry_gradescope_would_not_read():
    results = gradescope_results(5e-8)
    results["leaderboard"][0]["order"] = "fastest"
    with pytest.raises(gradescope.GradescopeError):
        gradescope.validate(results)


# ----------------------------------------------------------------------------------------
# Where it is configured: the catalog, the roster.
# ----------------------------------------------------------------------------------------


def test_every_leaderboard_of_the_catalog_names_a_chip_a_configuration_and_a_call_the_reference_examines():
    for number, spec in catalog.LEADERBOARDS.items():
        lab = catalog.lab(number)
        assert spec.chip in cost.chips() and spec.config in configs.CONFIGS
        assert spec.at_size is None or configs.CONFIGS[spec.at_size].compile_for, spec
        reference = cost.to_json(cost.read_reference(lab.public_tests))
        ranked = leaderboard.ranked_on(spec)  # graded without the TPU slice: its own configuration
        assert leaderboard.step_time(reference, ranked) is not None, (
            f"{lab.name}: no reference card for {spec}"
        )


# ----------------------------------------------------------------------------------------
# At a production size: where the class was graded on the board's TPU slice, its program there ranks.
# ----------------------------------------------------------------------------------------

AT_SIZE = catalog.Leaderboard("train_step", "cpu-8", "v5e", at_size="v5e-8")


def step_card(flops: float, sent: float) -> dict:
    return cost.Card(
        devices=8,
        flops=flops,
        held={"argument": 1, "output": 1, "temp": 1},
        sent={"all-reduce": sent},
        counts={"all-reduce": 2},
    ).to_json()


def step_rows(student: str, small: dict, at_size: dict | None) -> list[dict]:
    """The student's rows of lab 14 on cpu-8 (the course's size) and, with `at_size`, on v5e-8 (both sizes)."""
    costs = {"cpu-8": {"train_step-small": {"function": "train_step", "runs": {"cpu-8": small}}}}
    if at_size is not None:
        costs["v5e-8"] = {
            "train_step-small": {"function": "train_step", "runs": {"v5e-8": small}},
            "train_step-big": {"function": "train_step", "runs": {"v5e-8": at_size}, "at_size": True},
        }
    return [
        {
            "student": student,
            "lab": 14,
            "config": config,
            "status": "ok",
            "passed": 1,
            "total": 1,
            "message": "",
            "tests": [],
            "cell_errors": [],
            "notes": [],
            "costs": card,
        }
        for config, card in costs.items()
    ]


def step_results(configs_graded: list[str], rows: list[dict]) -> dict:
    return {
        "format": 1,
        "labs": [{"number": 14, "name": "lab-14", "title": "Lab 14", "leaderboard": AT_SIZE.to_json()}],
        "configs": [{"name": c, "summary": c, "devices": 8} for c in configs_graded],
        "students": {r["student"]: {"notes": []} for r in rows},
        "notes": [],
        "rows": [r for r in rows if r["config"] in configs_graded],
    }


def test_graded_on_the_tpu_slice_the_board_ranks_the_programs_at_a_production_size():
    # At the course's size the design that computes the whole batch on every device sends less and looks
    # faster; at a production size on v5e-8 its eightfold work per chip puts it behind the split design.
    whole_batch = step_rows("wanda", step_card(8e6, 1e3), step_card(8 * 2.8e13, 1e9))
    split = step_rows("sam", step_card(1e6, 1e5), step_card(2.8e13, 7e9))
    on_cpu = step_results(["cpu-8"], whole_batch + split)
    assert [p["name"] for p in board_of(on_cpu)["places"]] == ["wanda", "sam"]
    on_tpu = step_results(["cpu-8", "v5e-8"], whole_batch + split)
    board = board_of(on_tpu)
    assert [p["name"] for p in board["places"]] == ["sam", "wanda"]
    assert board["title"].startswith(
        "train_step at a production size on v5e-8, modelled step time on a TPU v5e"
    )
    assert board["config"] == "v5e-8" and board["at_size"] == "v5e-8"
    assert "Leaderboard (train_step at a production size on v5e-8): yours:" in markdown.feedback(
        on_tpu, "sam"
    )


def test_the_production_size_card_is_its_own_entry_shown_as_such():
    found = cost.from_json(step_rows("sam", step_card(1e6, 1e5), step_card(2.8e13, 7e9))[1]["costs"])
    assert sorted((e.name, e.at_size) for e in found.values()) == [
        ("train_step", False),
        ("train_step at a production size", True),
    ]
    assert any("train_step at a production size on v5e-8" in line for line in cost.text(found))


def test_the_graded_results_carry_the_labs_leaderboard():
    subs = collect.Submissions(students={"alice": {}})
    results = gathered.results_of(
        [], [catalog.lab(9), catalog.lab(3)], [configs.CONFIGS["cpu-8"]], subs, ["alice"]
    )
    assert [lab.get("leaderboard") for lab in results["labs"]] == [SPEC.to_json(), None]


def test_a_roster_line_can_hide_a_student_from_the_leaderboards():
    people = roster.parse("student,name,leaderboard\nalice,Alice,hide\nbob,Bob,\ncarl,Carl,show\n")
    assert people.students["alice"]["leaderboard"] == "hide"
    assert "leaderboard" not in people.students["bob"]
    with pytest.raises(roster.RosterError, match="line 2: leaderboard 'maybe'"):
        roster.parse("student,leaderboard\nalice,maybe\n")


# ----------------------------------------------------------------------------------------
# One submission graded as Gradescope grades it (real JAX, real sandbox): its own time, ranked.
# ----------------------------------------------------------------------------------------


@pytest.mark.skipif(modes.bubblewrap()[0] is None, reason="bubblewrap cannot make a sandbox on this machine")
def test_gradescope_reports_the_reference_solutions_own_time_on_the_leaderboard(tmp_path):
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    shutil.copy(catalog.lab(9).reference, root / "submission" / "lab-9.ipynb")
    results = gradescope.run(root, 9)
    assert results["score"] == sum(t["max_score"] for t in results["tests"]), results["output"]
    [entry] = results["leaderboard"]
    assert entry["order"] == "asc" and entry["value"] == pytest.approx(REFERENCE_SENT / RING * 1e6, rel=0.01)
    assert json.loads((root / "results" / "results.json").read_text())["leaderboard"] == [entry]
    assert "yours: 148 ns on a TPU v5e; the reference: 148 ns." in results["output"]


def test_the_cards_of_a_run_keep_the_call_at_a_production_size_apart_from_the_courses():
    import numpy as np

    from labkit import checks

    small = checks.compiled_call("train_step", np.ones((2, 2), np.float32))
    big = checks.compiled_call("train_step", checks.shaped((8192, 8192)))
    calls = [{"id": c.id, **c.encoded()} for c in (small, big)]
    facts = {"devices": 8, "flops": 1.0, "memory": {"argument": 1, "output": 1, "temp": 1}, "collectives": []}
    found = cost.cards(calls, {"v5e-8": {c.id: {"facts": facts} for c in (small, big)}})
    assert {cid: e.at_size for cid, e in found.items()} == {small.id: False, big.id: True}
