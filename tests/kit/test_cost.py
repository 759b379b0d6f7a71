"""The cost card's model against figures computed by hand, and against a real compiled program on 8 devices."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, said

from labkit import cost

CHIPS = cost.chips()


def test_every_chip_names_its_source_and_has_every_figure():
    assert {"v5e", "v6e", "h100"} <= set(CHIPS)
    for chip in CHIPS.values():
        assert chip.source and chip.topology
        assert chip.f32_flops < chip.bf16_flops
        assert min(chip.hbm_bytes, chip.hbm_bandwidth, chip.send_bandwidth) > 0


@pytest.mark.parametrize(
    ("op", "result", "n", "expected"),
    [
        # all-reduce of 1 KiB over 8: a reduce-scatter then an all-gather, each 7/8 of the array
        ("all-reduce", 1024, 8, 2 * 7 / 8 * 1024),
        # all-gather whose gathered result is 1 KiB: each device sends its 128 B to the 7 others' ring
        ("all-gather", 1024, 8, 7 * 128),
        # reduce-scatter to a 128 B block from a 1 KiB array: 7 blocks of 128 B pass through each device
        ("reduce-scatter", 128, 8, 7 * 128),
        # all-to-all of 1 KiB: all but the block a device keeps
        ("all-to-all", 1024, 4, 3 * 256),
        # ppermute: the whole buffer, once
        ("collective-permute", 512, 8, 512),
        # on one device nothing moves
        ("all-reduce", 1024, 1, 0),
    ],
)
def test_ring_bytes_each_device_sends(op, result, n, expected):
    assert cost.bytes_sent(op, result, n) == pytest.approx(expected)


def test_an_all_reduce_moves_about_twice_what_a_reduce_scatter_moves_for_the_same_array():
    array, n = 8 << 20, 8
    assert cost.bytes_sent("all-reduce", array, n) == pytest.approx(
        2 * cost.bytes_sent("reduce-scatter", array // n, n)
    )


def test_shapes_in_hlo_text_are_counted_with_their_dtypes():
    assert cost.shape_bytes("f32[8,4]{1,0}") == 128
    assert cost.shape_bytes("bf16[1024]{0}") == 2048
    assert cost.shape_bytes("(f32[8]{0}, s32[2,2]{1,0})") == 48
    assert cost.shape_bytes("f32[]") == 4


def _facts(**changes) -> dict:
    facts = {
        "devices": 8,
        "flops": 1e9,
        "memory": {"argument": 1 << 20, "output": 1 << 20, "temp": 0, "alias": 0},
        "collectives": [{"op": "all-reduce", "shape": "f32[262144]{0}", "groups": [list(range(8))]}],
        "outputs": [{"dtype": "float32"}],
    }
    return facts | changes


def test_a_card_by_hand_on_a_v5e():
    c = cost.card(_facts())
    assert c.flops == 1e9 and c.held_total == 2 << 20
    assert c.sent == {"all-reduce": pytest.approx(2 * 7 / 8 * (1 << 20))}
    t = c.timing(CHIPS["v5e"])
    assert t.compute == pytest.approx(1e9 / 197e12)  # float32 at JAX's default precision: one bf16 pass
    assert t.memory == pytest.approx((2 << 20) / 819e9)
    # eight v5e chips are a slice with no wraparound link: the ring is a line, at half of 100 GB/s
    assert t.communication == pytest.approx(2 * 7 / 8 * (1 << 20) / 50e9)
    # 5.1 µs of arithmetic against 36.7 µs on the wire and 2.6 µs of HBM: communication bounds it
    assert t.bound == "communication" and t.fits
    # at precision "highest" float32 takes six bf16 passes: 30.5 µs, still under the wire's 36.7 µs
    assert c.timing(CHIPS["v5e"], precision="highest").compute == pytest.approx(1e9 / 32.8e12)


def test_float32_products_at_jaxs_default_precision_are_one_bf16_pass_on_a_tpu_and_tf32_on_an_h100():
    c = cost.card(_facts(collectives=[]))
    assert c.timing(CHIPS["v5e"]).compute == pytest.approx(1e9 / CHIPS["v5e"].bf16_flops)
    assert c.timing(CHIPS["h100"]).compute == pytest.approx(1e9 / 494.7e12)
    for chip in CHIPS.values():
        assert c.timing(chip, precision="highest").compute == pytest.approx(1e9 / chip.f32_flops)
        assert chip.f32_flops < chip.f32_default_flops <= chip.bf16_flops


def test_a_ring_of_fewer_chips_than_the_torus_wraps_around_is_a_line_at_half_the_bandwidth():
    def over(width: int) -> cost.Card:
        groups = [list(range(i, i + width)) for i in range(0, 256, width)]
        return cost.card(
            _facts(
                devices=256, collectives=[{"op": "all-gather", "shape": "f32[262144]{0}", "groups": groups}]
            )
        )

    v5e, h100 = CHIPS["v5e"], CHIPS["h100"]
    line, ring = over(8), over(16)
    assert line.widths == {"all-gather": {"8": pytest.approx(line.sent_total)}}
    assert line.timing(v5e).communication == pytest.approx(line.sent_total / (v5e.send_bandwidth / 2))
    assert ring.timing(v5e).communication == pytest.approx(ring.sent_total / v5e.send_bandwidth)
    assert line.timing(h100).communication == pytest.approx(line.sent_total / h100.send_bandwidth)  # NVSwitch
    # a card an older kit wrote has no widths: its rings are timed as rings of all its devices, a line
    # under 16 of them (no group can be wider), else as wrapped
    old = cost.Card.from_json({k: v for k, v in line.to_json().items() if k != "widths"})
    assert old.timing(v5e).communication == pytest.approx(line.sent_total / v5e.send_bandwidth)
    eight = cost.card(_facts())
    eight.widths = {}
    assert eight.timing(v5e).communication == pytest.approx(eight.sent_total / (v5e.send_bandwidth / 2))
    assert cost.Card.from_json(line.to_json()) == line


def test_bfloat16_outputs_use_the_bfloat16_peak_and_a_big_matmul_is_compute_bound():
    c = cost.card(_facts(flops=1e13, collectives=[], outputs=[{"dtype": "bfloat16"}]))
    t = c.timing(CHIPS["h100"])
    assert t.compute == pytest.approx(1e13 / 989e12)
    assert t.bound == "compute" and t.communication == 0


def test_groups_smaller_than_the_mesh_count_their_own_size():
    # a psum over one axis of a 2x4 mesh: groups of 4
    c = cost.card(
        _facts(
            collectives=[
                {"op": "all-reduce", "shape": "f32[1024]{0}", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}
            ]
        )
    )
    assert c.sent["all-reduce"] == pytest.approx(2 * 3 / 4 * 4096)


def test_a_collective_permute_sends_its_buffer_once_and_nothing_when_a_device_sends_to_itself():
    # a ring shift over 8 devices, and the same ring on one device (XLA keeps it as a permute from 0 to 0)
    ring = cost.card(
        _facts(
            collectives=[
                {
                    "op": "collective-permute",
                    "shape": "f32[256]{0}",
                    "pairs": [[i, (i + 1) % 8] for i in range(8)],
                }
            ]
        )
    )
    alone = cost.card(
        _facts(
            devices=1, collectives=[{"op": "collective-permute", "shape": "f32[256]{0}", "pairs": [[0, 0]]}]
        )
    )
    assert ring.sent == {"collective-permute": 1024} and alone.sent == {}


def test_what_does_not_fit_in_hbm_is_said():
    c = cost.card(_facts(memory={"argument": 20 * 10**9, "output": 0, "temp": 0}))
    assert not c.timing(CHIPS["v5e"]).fits and c.timing(CHIPS["h100"]).fits
    text = "\n".join(cost.lines("f", "cpu-8", c, [CHIPS["v5e"]]))
    assert "does not fit its 14.9 GiB of HBM" in text


def test_unexamined_programs_give_no_card_and_say_why():
    with pytest.raises(cost.NoCard, match="could not trace"):
        cost.card({"unavailable": "jax.jit could not trace the function"})
    with pytest.raises(cost.NoCard, match="FLOPs"):
        cost.card(_facts(flops={"unavailable": "no cost analysis"}))


def test_a_lab_whose_runs_were_all_on_one_device_says_in_one_line_why_it_has_no_card():
    calls = [{"id": "a", "function": "f", "facts": True}, {"id": "b", "function": "g"}]
    one = {"cpu-1": {"a": {"facts": _facts(devices=1)}}}
    assert cost.cards(calls, one) == {}
    assert "every run examined was on one device" in cost.why_none(calls, one)
    failed = {"cpu-8": {"a": {"error": {"message": "boom"}}}}
    assert "could not be examined" in cost.why_none(calls, failed)
    assert cost.why_none([{"id": "b", "function": "g"}], one) == ""  # nothing examined: nothing to explain


def test_the_card_compares_with_the_reference_by_factors():
    reference = cost.card(
        _facts(collectives=[{"op": "reduce-scatter", "shape": "f32[32768]{0}", "groups": [list(range(8))]}])
    )
    mine = cost.card(_facts())  # an all-reduce of the whole array, then a slice
    notes = cost.compare(mine, reference)
    assert notes == ["your program has 2.0x the bytes each device sends that the reference needs"]
    assert cost.compare(reference, reference) == []
    text = cost.lines("column_sums", "cpu-8", reference, [CHIPS["v5e"]], reference=reference)
    assert text[-1].strip() == "about what the reference solution costs"


def test_a_card_opens_with_one_line_the_step_time_the_reference_beside_it_and_the_ratio():
    reference = cost.card(
        _facts(collectives=[{"op": "reduce-scatter", "shape": "f32[32768]{0}", "groups": [list(range(8))]}])
    )
    mine = cost.card(_facts())  # twice the bytes sent: a communication-bound step twice as long
    v5e = CHIPS["v5e"]
    mine_s, ref_s = mine.timing(v5e).step, reference.timing(v5e).step
    line = cost.lines("column_sums", "cpu-8", mine, [v5e], reference=reference, ranked=True)[0]
    assert line == (
        f"column_sums on cpu-8: {cost.format_seconds(mine_s)} the step the leaderboard ranks on a TPU v5e x8 "
        f"(communication-bound); the reference: {cost.format_seconds(ref_s)}, yours 2x the reference's"
    )
    alone = cost.lines("column_sums", "cpu-8", mine, [v5e])[0]
    assert alone.endswith("a step on a TPU v5e x8 (communication-bound); no reference card for this call")


def _noted(
    budget: str, figure: float, limit: float, run: str = "cpu-8", function: str = "column_sums"
) -> dict:
    """What a budget check notes (`labkit.judge.budgets.note`), by hand."""
    return {
        "budget": budget,
        "figure": figure,
        "limit": limit,
        "passed": figure <= limit,
        "function": function,
        "at_size": False,
        "run": run,
    }


def test_the_headline_ends_with_the_budget_of_its_call_and_run_nearest_its_limit():
    reference = cost.card(
        _facts(collectives=[{"op": "reduce-scatter", "shape": "f32[32768]{0}", "groups": [list(range(8))]}])
    )
    found = {"c": cost.Examined("column_sums", {"cpu-8": cost.card(_facts())})}
    refs = {"c": cost.Examined("column_sums", {"cpu-8": reference})}
    plain = cost.text(found, refs)[2]
    assert plain.endswith("yours 2x the reference's")  # no budget: nothing more said
    measured = [
        _noted("work per device", 50, 100),
        _noted("bytes each device sends", 92, 100),
        _noted("memory each device holds", 300, 100, run="cpu-2x4"),  # another run's
        _noted("work per device", 500, 100, function="cumsum"),  # another call's
    ]
    assert cost.text(found, refs, None, measured)[2] == plain + (
        "; nearest budget: bytes each device sends, 92% of its limit"
    )
    over = [*measured, _noted("memory each device holds", 140, 100)]
    assert cost.text(found, refs, None, over)[2] == plain + (
        "; nearest budget: memory each device holds, over its limit by 1.4x"
    )
    assert "nearest budget: memory each device holds, over its limit by 1.4x" in cost.html(
        found, refs, None, over
    )


def _noted_by_a_check(budget: float) -> list[dict]:
    """What a lab test's budget checks note on made-up facts of one call on cpu-8: 100 FLOPs of a limit of 150,
    224 bytes sent of a limit of 1.1 x `budget`."""
    from types import SimpleNamespace

    import numpy as np

    from labkit.checks import LabRun, Mismatch, check, compiled_call, expect_sent_within, expect_work_share
    from labkit.course import configs
    from labkit.judge import plaindata

    c = compiled_call("column_sums", np.ones(4, np.float32))
    reduce = {"op": "all-reduce", "shape": "f32[32]{0}", "groups": [list(range(8))]}  # 224 bytes each sends
    facts = _facts(flops=100.0, collectives=[reduce]) | {"inputs": [], "top_level": ["jit"]}
    result = {"value": plaindata.encode(np.zeros(4, np.float32)), "facts": facts}
    run = LabRun(
        "cpu-8",
        configs.CONFIGS["cpu-8"],
        SimpleNamespace(status="ok", environment={}, message="", results={c.id: result}),
    )

    @check(got=c)
    def test(got):
        expect_work_share(got, 800.0, 8)
        expect_sent_within(got, budget, 8, what="one all-reduce")

    try:
        test(run)
    except Mismatch:
        pass
    return run.budgets


def test_a_budget_check_notes_what_it_measured_of_its_call_when_it_passes_and_when_it_fails():
    from labkit.judge import budgets

    for budget in (224, 112):
        assert [(n["budget"], n["function"], n["run"]) for n in _noted_by_a_check(budget)] == [
            ("work per device", "column_sums", "cpu-8"),
            ("bytes each device sends", "column_sums", "cpu-8"),
        ]
    assert (
        budgets.said(_noted_by_a_check(224)) == "; nearest budget: bytes each device sends, 91% of its limit"
    )
    assert budgets.said(_noted_by_a_check(112)) == (
        "; nearest budget: bytes each device sends, over its limit by 1.82x"
    )


def test_in_jupyter_the_cards_are_a_table_of_bars_yours_against_the_reference_every_name_escaped():
    reference = cost.card(
        _facts(collectives=[{"op": "reduce-scatter", "shape": "f32[32768]{0}", "groups": [list(range(8))]}])
    )
    mine = cost.card(_facts())
    found = {"c": cost.Examined("<script>f</script>", {"cpu-8": mine})}
    page = cost.html(found, {"c": cost.Examined("f", {"cpu-8": reference})})
    assert "<script>" not in page and "&lt;script&gt;f&lt;/script&gt; on cpu-8" in page
    widths = [int(w) for w in re.findall(r"width:(\d+)px", page)]
    assert len(widths) == 2 * len(cost.SHOWN) and max(widths) == 200
    assert widths[0] == 2 * widths[1] or abs(widths[0] - 2 * widths[1]) <= 1  # yours twice the reference's
    assert cost.html({}) == ""


def test_a_time_under_a_nanosecond_is_not_shown_as_a_figure_of_picoseconds():
    assert cost.format_seconds(2.03e-14) == "under 1 ns"
    assert cost.format_seconds(0.0) == "0 s"
    assert cost.format_seconds(1.5e-9) == "1.5 ns"


def test_a_real_psum_on_eight_devices_gets_the_hand_computed_card():
    """The facts of a compiled shard_map psum (real JAX, 8 CPU devices), read into a card."""
    program = textwrap.dedent("""
        import json
        import jax, jax.numpy as jnp
        from jax.sharding import PartitionSpec as P
        from labkit import facts
        mesh = jax.make_mesh((8,), ("data",))
        f = jax.shard_map(lambda x: jax.lax.psum(x, "data"), mesh=mesh, in_specs=P("data"), out_specs=P())
        x = jax.device_put(jnp.ones((8, 1024), jnp.float32), jax.NamedSharding(mesh, P("data")))
        print(json.dumps(facts.gather(f, (x,), {})))
    """)
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    c = cost.card(json.loads(done.stdout.strip().splitlines()[-1]))
    assert c.devices == 8
    # each device's block is f32[1,1024]: 4 KiB all-reduced over 8 devices
    assert c.sent == {"all-reduce": pytest.approx(2 * 7 / 8 * 4096)}
    assert c.counts == {"all-reduce": 1}


# ----------------------------------------------------------------------------------------
# The card in `make lab-N`: the reference's own, and a right program that moves twice the bytes.
# ----------------------------------------------------------------------------------------

SCATTER = 'return jax.lax.psum_scatter(jnp.sum(rows, axis=0), "data", scatter_dimension=0, tiled=True)'
ALL_REDUCE_THEN_SLICE = (
    'total = jax.lax.psum(jnp.sum(rows, axis=0), "data")\n'
    '        block = total.shape[0] // jax.lax.psum(1, "data")\n'
    '        return jax.lax.dynamic_slice_in_dim(total, jax.lax.axis_index("data") * block, block)'
)


def test_the_reference_costs_what_its_recorded_card_says(kit, lab_report):
    from labkit.course import catalog

    done = kit("lab", "5", "--notebook", str(catalog.lab(5).reference), "--configs", "cpu-1,cpu-8")
    assert done.returncode == 0, done.stdout[-3000:]
    card_text = done.stdout[done.stdout.index("Cost cards") :]
    assert "shard_map_column_sums on cpu-8 (8 devices)" in card_text
    assert "sends reduce-scatter" in card_text and "about what the reference solution costs" in card_text
    assert "TPU v5e x8" in card_text and "NVIDIA H100 SXM x8" in card_text
    costs = lab_report(5)["costs"]
    # the examined calls of the public tests (their budgets read the compiled program), each carded on cpu-8
    assert "shard_map_column_sums" in [e["function"] for e in costs.values()], costs
    assert all(set(e["runs"]) == {"cpu-8"} for e in costs.values())  # one device: nothing to compare


def test_an_all_reduce_then_a_slice_passes_and_the_card_names_twice_the_bytes_sent(kit, variant):
    from labkit.course import catalog

    assert SCATTER in catalog.lab(5).reference.read_text().replace('\\"', '"'), "the reference changed"
    done = kit(
        "lab",
        "5",
        "--notebook",
        str(variant(5, (SCATTER, ALL_REDUCE_THEN_SLICE))),
        "--configs",
        "cpu-1,cpu-8",
    )
    card_text = done.stdout[done.stdout.index("Cost cards") :]
    assert "shard_map_column_sums on cpu-8" in card_text and "sends all-reduce" in card_text
    assert "your program has 2.0x the bytes each device sends that the reference needs" in card_text
    assert "column sums" in done.stdout  # and its public tests ran


def test_the_feedback_of_a_graded_class_shows_each_students_card_against_the_reference(tmp_path, variant):
    submissions = tmp_path / "submissions"
    (submissions / "ada").mkdir(parents=True)
    (submissions / "ada" / "lab-5.ipynb").write_bytes(
        variant(5, (SCATTER, ALL_REDUCE_THEN_SLICE)).read_bytes()
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "grade",
            "--submissions",
            str(submissions),
            "--out",
            str(tmp_path / "out"),
            "--labs",
            "5",
            "--configs",
            "cpu-8",
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    md = (tmp_path / "out" / "feedback" / "ada.md").read_text()
    assert "Cost card" in md and "shard_map_column_sums on cpu-8 (8 devices)" in md
    assert "your program has 2.0x the bytes each device sends that the reference needs" in md
    page = (tmp_path / "out" / "feedback" / "ada.html").read_text()
    assert '<pre class="card" data-config="cpu-8">' in page and "2.0x the bytes" in page


def test_a_collective_permute_is_timed_on_the_one_link_it_sends_over_not_a_rings_two():
    shift = cost.card(
        _facts(
            collectives=[
                {
                    "op": "collective-permute",
                    "shape": "f32[262144]{0}",
                    "pairs": [[i, (i + 1) % 8] for i in range(8)],
                }
            ]
        )
    )
    assert shift.timing(CHIPS["v5e"]).communication == pytest.approx((1 << 20) / 50e9)  # one ICI port one way
    assert shift.timing(CHIPS["v6e"]).communication == pytest.approx((1 << 20) / 100e9)
    gathered = cost.card(
        _facts(
            devices=16,
            collectives=[{"op": "all-gather", "shape": "f32[262144]{0}", "groups": [list(range(16))]}],
        )
    )
    # a ring of 16 (one that wraps around) sends over two ports: 100 GB/s on a v5e
    assert gathered.timing(CHIPS["v5e"]).communication == pytest.approx(15 / 16 * (1 << 20) / 100e9)


def _all_to_all(width: int, block_bytes: int) -> cost.Card:
    return cost.card(
        _facts(
            devices=width,
            collectives=[
                {"op": "all-to-all", "shape": f"f32[{block_bytes // 4}]{{0}}", "groups": [list(range(width))]}
            ],
        )
    )


BOOK_LINK_V5E = 4.5e10  # the book's one ICI link one way on a v5e (part 2); W_bidi is twice it


def test_an_all_to_all_on_a_torus_is_timed_with_the_blocks_each_chip_passes_on():
    v5e, h100 = CHIPS["v5e"], CHIPS["h100"]
    block = 4 << 20
    # The book, part 3: on a ring each link carries a quarter of the whole array V, so T = V / (4 W_bidi).
    ring = _all_to_all(16, block)
    assert ring.sent == {"all-to-all": pytest.approx(15 / 16 * block)}  # what a device sends: its own blocks
    book = 16 * block / (4 * 2 * BOOK_LINK_V5E)
    assert ring.timing(v5e).communication / book == pytest.approx(0.9)  # chips.toml's 50 GB/s against 45
    # On a line (a slice under 16 chips: no wraparound) the middle link carries V / 4 one way: twice the ring's.
    line = _all_to_all(8, block)
    assert line.timing(v5e).communication / (8 * block / (4 * BOOK_LINK_V5E)) == pytest.approx(0.9)
    assert v5e.forwarded("all-to-all", 8) == pytest.approx(16 / 7) and v5e.forwarded("all-to-all", 2) == 1
    # Without the blocks passed on, the card would time it at under half of that.
    assert line.timing(v5e).communication == pytest.approx(16 / 7 * 7 / 8 * block / 50e9)
    # Nothing else is passed on, and an H100's switch takes every block straight to its target.
    assert v5e.forwarded("all-gather", 16) == v5e.forwarded("reduce-scatter", 8) == 1
    assert h100.forwarded("all-to-all", 8) == 1
    assert line.timing(h100).communication == pytest.approx(7 / 8 * block / h100.ring_bandwidth(8))


def test_a_card_times_the_same_whatever_the_order_its_collectives_were_read_in():
    """The leaderboard times a row's cards as the grading run holds them, a test or a later run as
    scoreboard.json gives them back (its keys sorted): the sum over collectives must not depend on it."""
    unit = cost.Chip(
        key="unit",
        name="a chip sending a byte a second",
        bf16_flops=1.0,
        f32_flops=1.0,
        hbm_bytes=1.0,
        hbm_bandwidth=1.0,
        send_bandwidth=1.0,
        link_bandwidth=1.0,
        topology="",
        source="",
    )
    # 1 + 2^-53 + 2^-53 is 1 added from the left, 1 + 2^-52 from the right
    kinds = {"all-gather": 1.0, "all-reduce": 2.0**-53, "reduce-scatter": 2.0**-53}
    cards = [
        cost.Card(devices=8, flops=1.0, held={}, sent=dict(order), widths={op: {"8": b} for op, b in order})
        for order in (list(kinds.items()), list(reversed(kinds.items())))
    ]
    assert cards[0].timing(unit).communication == cards[1].timing(unit).communication  # exactly


# ----------------------------------------------------------------------------------------
# Latency: a collective takes at least its hops' time, whatever it carries (the book "How to Scale Your
# Model", part 3: about a microsecond a hop over an ICI link; chips.toml's `hop_latency`).
# ----------------------------------------------------------------------------------------


SMALL = [{"op": "all-reduce", "shape": "f32[1024]{0}", "groups": [list(range(8))]}]  # 4 KiB over 8


def test_a_collective_makes_its_hops_one_after_another_on_a_line_round_a_ring_or_across_one_link():
    v5e = CHIPS["v5e"]
    assert v5e.hop_latency == pytest.approx(1e-6) and CHIPS["v6e"].hop_latency == pytest.approx(1e-6)
    assert CHIPS["h100"].hop_latency == 0  # no figure with a source: no latency on an H100
    assert v5e.hops("all-gather", 8) == 7  # a line of 8 (no wraparound under 16): end to end
    assert v5e.hops("reduce-scatter", 4) == 3 and v5e.hops("all-to-all", 8) == 7
    assert v5e.hops("all-gather", 16) == 8  # a ring of 16: halfway round, both ways at once
    assert v5e.hops("all-reduce", 8) == 14  # a reduce-scatter, then an all-gather
    assert v5e.hops("collective-permute", 8) == 1 and v5e.hops("all-reduce", 1) == 0


def test_a_small_all_reduce_is_latency_bound_and_a_large_one_is_not():
    small = cost.card(_facts(collectives=SMALL))
    assert small.collectives == {"all-reduce": {"8": 1}}
    v5e = CHIPS["v5e"]
    plain, floored = small.timing(v5e), small.timing(v5e, latency=True)
    # 7 KiB over 50 GB/s is 143 ns; its 14 hops take 14 µs
    assert plain.communication == pytest.approx(2 * 7 / 8 * 4096 / 50e9)
    assert plain.latency == floored.latency == pytest.approx(14e-6)
    assert floored.communication == pytest.approx(14e-6) and floored.step == pytest.approx(14e-6)
    assert (
        small.timing(CHIPS["h100"], latency=True).communication == small.timing(CHIPS["h100"]).communication
    )
    text = "\n".join(cost.lines("f", "cpu-8", small, [v5e, CHIPS["h100"]]))
    assert "latency-bound: its collectives' hops take at least 14 µs (1 µs a hop)" in text
    assert "NVIDIA H100 SXM x8: compute" in text and text.count("latency-bound") == 1
    # 1 MiB: 36.7 µs on the wire, more than the 14 µs of its hops: latency changes nothing
    large = cost.card(_facts())
    assert large.timing(v5e, latency=True).communication == pytest.approx(large.timing(v5e).communication)
    assert "latency-bound" not in "\n".join(cost.lines("f", "cpu-8", large, [v5e]))
    # two all-reduces count twice the hops; a card an older kit wrote (no record by width) counts none
    twice = cost.card(_facts(collectives=SMALL * 2))
    assert twice.timing(v5e).latency == pytest.approx(28e-6)
    old = cost.Card.from_json({k: v for k, v in small.to_json().items() if k != "collectives"})
    assert old.timing(v5e, latency=True).communication == pytest.approx(plain.communication)
    assert cost.Card.from_json(small.to_json()) == small


HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: make setup EXTRAS=tpu")
def test_the_calibration_benchmark_sets_the_card_beside_the_tpu_compilers_estimate():
    """benchmarks/bench_calibration.py on one small all-reduce, compiled for v5e 2x4 and v6e 2x4 (a few seconds)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_calibration.py"
    done = subprocess.run(
        [
            sys.executable,
            str(bench),
            "--only",
            "all-reduce",
            "--sizes",
            "4096",
            "--dtypes",
            "float32",
            "--no-book",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    for chip in ("v5e", "v6e"):
        for column in ("compiler (optimal_seconds)", "card", "card with latency", "card / compiler"):
            assert f"{chip}: {column}" in header, header
    [row] = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in table[2:]]
    assert row["program"] == "all-reduce" and row["the TPU program's collectives"] == "all-reduce 4.0 KiB"
    for chip in ("v5e", "v6e"):
        compiler = row[f"{chip}: compiler (optimal_seconds)"]
        if compiler == "none" or "not above zero" in compiler:  # no estimate: no ratio, said so
            assert row[f"{chip}: card / compiler"] == ""
            continue
        ratio = float(row[f"{chip}: card / compiler"].rstrip("x"))
        assert math.isfinite(ratio) and ratio > 0
        assert row[f"{chip}: card with latency"] == "14 µs"  # 14 hops of a line of 8, a microsecond each
    # a time libtpu gives that is not above zero (-3.8 s for lab 14's step at a production size) is shown as
    # it is, with no ratio
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import bench_calibration as b; "
            "row = b.Row('step', 'float32', 1 << 20, {'v5e': b.OnChip('no collective', -3.8, None, 1e-3, 1e-3)}); "
            "print(b.compiler_table([row])[-1])",
        ],
        cwd=bench.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    cells = [c.strip() for c in shown.stdout.strip().strip("|").split("|")]
    assert cells[4] == "-3.8 s, not above zero: no ratio" and cells[-1] == "", cells


def test_a_tpu_configurations_card_says_the_precision_its_float32_products_were_judged_at():
    # Every TPU judge compiles float32 products at precision highest (configs.ACCELERATOR_MATMUL_PRECISION): one
    # bfloat16 pass would move float32 operands as bfloat16, so the card says which program it describes.
    c = cost.Card(8, 1e6, {"argument": 1024, "output": 1024, "temp": 0})
    for config in ("v5e-8", "v6e-8", "v5p-8", "v5e-256", "tpu"):
        assert cost.lines("f", config, c, [])[1] == (
            f"  f on {config} (8 devices, float32 products at precision highest), per device:"
        )
    assert cost.lines("f", "cpu-8", c, [])[1] == "  f on cpu-8 (8 devices), per device:"


# ----------------------------------------------------------------------------------------
# `make lab-5` on the reference: the headline names its budget, and the Jupyter card drawn in Chromium.
# ----------------------------------------------------------------------------------------

ARTIFACTS = Path(os.environ.get("LABKIT_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
# docs/card.png, which docs/student.md shows, is a copy of this picture (as docs/review.png is of test_review's)
CARD_SHOT = ARTIFACTS / "cost-card-lab-5.png"


def test_make_lab_5_names_the_budget_nearest_its_limit_on_the_headline_and_draws_the_card(kit, lab_report):
    from labkit.course import catalog

    lab = catalog.lab(5)
    done = kit("lab", "5", "--notebook", str(lab.reference), "--configs", "cpu-8")
    assert done.returncode == 0, said(done.stdout + done.stderr)
    heads = [line for line in done.stdout.splitlines() if line.startswith("shard_map_column_sums on cpu-8: ")]
    assert len(heads) == 1, said(done.stdout)
    # the reference sends one reduce-scatter: the budget itself, of which up to 1.1 times passes
    assert re.search(r"; nearest budget: bytes each device sends, 9\d% of its limit$", heads[0]), heads[0]
    report = lab_report(5)
    noted = [n for o in report["outcomes"] for n in o.get("budgets", [])]
    assert {
        "budget": "bytes each device sends",
        "function": "shard_map_column_sums",
        "run": "cpu-8",
    }.items() <= next(n for n in noted if n["function"] == "shard_map_column_sums").items()
    measured = [n for n in noted if n["run"] == "cpu-8"]
    page = cost.html(
        cost.from_json(report["costs"]), cost.read_reference(lab.public_tests), lab.ranked_call, measured
    )
    assert "nearest budget: bytes each device sends" in _drawn_in_chromium(page, CARD_SHOT)


def _drawn_in_chromium(page_html: str, shot: Path) -> str:
    """The cards' table drawn in headless Chromium (Debian's, as test_review's pages): its text; its picture in `shot`."""
    import shutil

    from playwright.sync_api import sync_playwright

    browser_path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(browser_path).exists():
        pytest.fail("chromium is not installed: `make system-deps` installs it (.ci/apt-packages.txt)")
    shot.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=browser_path,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 600}, device_scale_factor=1)
            page.set_content(f'<body style="font-family: sans-serif; font-size: 14px">{page_html}</body>')
            table = page.locator("table.labkit-cards")
            table.screenshot(path=str(shot))
            return table.inner_text()
        finally:
            browser.close()
