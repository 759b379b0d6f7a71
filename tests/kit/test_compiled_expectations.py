"""The expectations on compiled programs that judge the schedule and the traffic, on facts written by hand:
a permute's pairs one by one, the count of steps, and a budget failure that names what is over."""

from test_checks import ROWS_OF_A_2X4_GRID, compiled, message

from labkit.checks import expect_collectives_within, expect_sent_within, expect_steps_within, sent_per_device


def shift(s: int) -> dict:
    """One ppermute by `s` within each row of a 2 x 4 grid: a collective-permute whose pairs span both rows."""
    return {
        "op": "collective-permute",
        "shape": "f32[2,8]",
        "pairs": [[r * 4 + k, r * 4 + (k + s) % 4] for r in range(2) for k in range(4)],
    }


def test_a_permute_within_each_grid_row_passes_though_its_pairs_span_every_row():
    expect_collectives_within(
        compiled(collectives=[shift(1), shift(2), shift(3)]), ROWS_OF_A_2X4_GRID, allowed="over 'model'"
    )
    across = {**shift(1), "pairs": shift(1)["pairs"] + [[3, 4]]}
    assert "a collective-permute that joins devices [3, 4]" in message(
        expect_collectives_within, compiled(collectives=[across]), ROWS_OF_A_2X4_GRID, allowed="over 'model'"
    )


def test_a_schedule_is_counted_in_permutes_and_a_device_sending_to_itself_is_no_step():
    ring = {**shift(1), "pairs": [[i, (i + 1) % 8] for i in range(8)]}
    to_itself = {**ring, "pairs": [[i, i] for i in range(8)]}
    expect_steps_within(compiled(collectives=[ring] * 5 + [to_itself] * 9), 5, 8, what="five steps")
    text = message(expect_steps_within, compiled(collectives=[ring] * 6), 5, 8, what="five steps")
    assert (
        text
        == "the compiled program runs 6 collective-permutes one after another, where five steps needs at most 5"
    )


def test_a_budget_failure_names_the_figure_the_limit_and_each_collective():
    reduce = {"op": "all-reduce", "shape": "f32[32]{0}", "groups": [list(range(8))]}
    expect_sent_within(compiled(collectives=[reduce]), 224, 8, what="one all-reduce")
    text = message(expect_sent_within, compiled(collectives=[reduce]), 112, 8, what="one reduce-scatter")
    assert text.startswith(
        "each device sends 224 bytes, where the budget is 112 bytes (one reduce-scatter; up to 1.1 "
        "times that passes)"
    ), text
    assert "all-reduce of f32[32] over 8 devices: 224 bytes" in text


def test_a_collective_the_program_did_not_ask_for_is_named_the_compilers_choice_not_the_students():
    reduce = {"op": "all-reduce", "shape": "f32[32]{0}", "groups": [list(range(8))]}
    hint = "A psum sends every device the whole vector: write psum_scatter"
    # the TPU compiler turned the reduce-scatter the program asks for into an all-reduce: no hint on what to write
    replaced = compiled(collectives=[reduce], written=["reduce-scatter"], compiled_for="TPU v5e 2x4")
    # charged as the reduce-scatter it stands for (112 bytes, not the all-reduce's 224): within that budget
    expect_sent_within(replaced, 112, 8, what="one reduce-scatter", hint=hint)
    text = message(expect_sent_within, replaced, 56, 8, what="half a reduce-scatter", hint=hint)
    assert "each device sends 112 bytes" in text, text
    assert "the TPU compiler's form of the reduce-scatter your program asks for: counted as that" in text
    assert (
        "Your program asks for reduce-scatter itself; the all-reduce is a choice of the TPU compiler" in text
    )
    assert "psum_scatter" not in text
    # the same for a small all-gather the TPU compiler gathers with an all-reduce of the zero-padded result
    gathered = compiled(collectives=[reduce], written=["all-gather"], compiled_for="TPU v5e 2x4")
    assert sent_per_device(gathered) == 112
    # where the program asks for an all-reduce itself, every all-reduce is charged as what it is
    both = compiled(collectives=[reduce], written=["all-gather", "all-reduce"], compiled_for="TPU v5e 2x4")
    assert sent_per_device(both) == 224
    # jit's partitioner put the all-reduce in a program that asks for none: said so, and the hint stays
    text = message(
        expect_sent_within, compiled(collectives=[reduce], written=[]), 112, 8, what="x", hint=hint
    )
    assert "Your program asks for no collective itself; the all-reduce is a choice of the compiler" in text
    assert hint in text
    # a psum the program wrote is the student's: the hint, and no word of the compiler
    text = message(
        expect_sent_within,
        compiled(collectives=[reduce], written=["all-reduce"]),
        112,
        8,
        what="x",
        hint=hint,
    )
    assert hint in text and "choice" not in text
    # where the kit did not read what the program asks for (a student's own check), nothing is said of it
    assert "choice" not in message(expect_sent_within, compiled(collectives=[reduce]), 112, 8, what="x")
