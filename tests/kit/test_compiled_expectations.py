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
    replaced = compiled(
        collectives=[reduce],
        written=["reduce-scatter"],
        written_sizes=[["reduce-scatter", 32]],
        compiled_for="TPU v5e 2x4",
    )
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
    gathered = compiled(
        collectives=[reduce],
        written=["all-gather"],
        written_sizes=[["all-gather", 32]],
        compiled_for="TPU v5e 2x4",
    )
    assert sent_per_device(gathered) == 112
    # where the program asks for an all-reduce itself, every all-reduce is charged as what it is
    both = compiled(
        collectives=[reduce],
        written=["all-gather", "all-reduce"],
        written_sizes=[["all-gather", 32], ["all-reduce", 32]],
        compiled_for="TPU v5e 2x4",
    )
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


EIGHT = [list(range(8))]


def on_v6e(collectives, written_sizes):
    return compiled(
        collectives=[{"op": op, "shape": shape, "groups": EIGHT} for op, shape in collectives],
        written=sorted({w[0] for w in written_sizes}),
        written_sizes=written_sizes,
        compiled_for="TPU v6e 2x4",
    )


# Lab 9's FSDP gradients as libtpu compiles them for v6e: two of the four all-gathers and three of the four
# reduce-scatters the program writes become all-reduces, two of them tuples (read from the TPU compiler's program).
FSDP_ON_V6E = [
    ("all-reduce", "(f32[256]{0:T(256)S(1)}, f32[128]{0:T(128)S(1)})"),
    ("all-gather", "f32[128,256]{1,0:T(8,128)S(1)}"),
    ("all-gather", "f32[256,128]{1,0:T(8,128)S(1)}"),
    ("all-reduce", "(f32[128,256]{0,1:T(8,128)S(1)}, f32[256]{0:T(256)S(1)}, f32[128]{0:T(128)S(1)})"),
    ("reduce-scatter", "f32[32,128]{1,0:T(8,128)S(1)}"),
]
FSDP_WRITES = [
    *(["all-gather", *d] for d in ((128, 256), (256,), (256, 128), (128,))),
    *(["reduce-scatter", *d] for d in ((128, 256), (256,), (256, 128), (128,))),
]


def test_all_reduces_a_tpu_compiler_writes_for_gathers_and_scatters_are_charged_array_by_array():
    from labkit.judge.compiled import sent_parts

    got = on_v6e(FSDP_ON_V6E, FSDP_WRITES)
    charged = {}
    for sent, _, kind in sent_parts(got):
        charged[kind] = charged.get(kind, 0) + sent
    weights = 4 * (128 * 256 + 256 + 256 * 128 + 128)
    # every array once, (n-1)/n of it: the all-gathers' and reduce-scatters' worth of what the program writes
    # each array once, (n-1)/n of it: a reduce-scatter of each gradient and an all-gather of each weight
    assert charged == {"reduce-scatter": 7 / 8 * weights, "all-gather": 7 / 8 * weights}
    text = message(expect_sent_within, got, 1, 8, what="x")
    assert "f32[128,256], the TPU compiler's form of the reduce-scatter your program asks for" in text, text


def test_an_all_reduce_is_charged_whole_where_the_collective_of_its_size_was_kept_or_never_written():
    # the reduce-scatter the program writes is kept: an all-reduce of its operand's size is not its stand-in
    kept = on_v6e(
        [("reduce-scatter", "f32[32]{0}"), ("all-reduce", "f32[256]{0}")], [["reduce-scatter", 256]]
    )
    assert sent_per_device(kept) == 7 / 8 * 1024 + 2 * 7 / 8 * 1024
    # an all-reduce of a size the program writes no collective of: charged as an all-reduce
    other = on_v6e([("all-reduce", "(f32[256]{0}, f32[64]{0})")], [["reduce-scatter", 256]])
    assert sent_per_device(other) == 7 / 8 * 1024 + 2 * 7 / 8 * 256
    # two all-reduces of one written reduce-scatter's size: one stands for it, the other is charged whole
    twice = on_v6e([("all-reduce", "f32[256]{0}"), ("all-reduce", "f32[256]{0}")], [["reduce-scatter", 256]])
    assert sent_per_device(twice) == 7 / 8 * 1024 + 2 * 7 / 8 * 1024
    # the same program on the configuration's own compiler: nothing stands for anything
    assert (
        sent_per_device(
            compiled(
                collectives=[{"op": "all-reduce", "shape": "f32[256]{0}", "groups": EIGHT}],
                written=["reduce-scatter"],
                written_sizes=[["reduce-scatter", 256]],
            )
        )
        == 2 * 7 / 8 * 1024
    )
