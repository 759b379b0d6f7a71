"""The picture of the schedule (`labkit.judge.timeline`): one device's timeline read from known programs written as
HLO text (pure Python), its SVG, and, once, `labkit lab 10` writing it for the reference."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import cost
from labkit.judge import records, timeline

V5E = cost.chips()["v5e"]
ROOT = Path(__file__).resolve().parents[2]

# Two async collectives started before a long product and waited for after it (as the TPU compiler schedules
# them): both run on the network beside the product.
OVERLAPPED = """\
HloModule overlapped, is_scheduled=true

ENTRY %main (p: f32[1024,1024], q: f32[256]) -> (f32[1024,1024], f32[2048], f32[256]) {
  %p = f32[1024,1024]{1,0} parameter(0)
  %q = f32[256]{0} parameter(1)
  %ags = (f32[256]{0}, f32[2048]{0}) all-gather-start(%q), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %cps = (f32[256]{0}, f32[256]{0}, u32[], u32[]) collective-permute-start(%q), channel_id=2, source_target_pairs={{0,1},{1,0}}
  %dot = f32[1024,1024]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="<script>evil</script>"}
  %agd = f32[2048]{0} all-gather-done(%ags)
  %cpd = f32[256]{0} collective-permute-done(%cps)
  ROOT %t = (f32[1024,1024]{1,0}, f32[2048]{0}, f32[256]{0}) tuple(%dot, %agd, %cpd)
}
"""

# A product, then a synchronous all-reduce of its result (XLA:CPU's kind): the device waits for all of it.
BLOCKING = """\
HloModule blocking, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[256,256]) -> f32[256,256] {
  %p = f32[256,256]{1,0} parameter(0)
  %dot = f32[256,256]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %ar = f32[256,256]{1,0} all-reduce(%dot), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
}
"""


def pipeline(steps: int) -> str:
    """A pipeline's loop as XLA:CPU writes it: each step a stage's product, then a permute to the next stage."""
    return f"""\
HloModule pipeline, is_scheduled=true

%body (param: (s32[], f32[64,64])) -> (s32[], f32[64,64]) {{
  %param = (s32[], f32[64,64]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%param), index=0
  %x = f32[64,64]{{1,0}} get-tuple-element(%param), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %dot = f32[64,64]{{1,0}} dot(%x, %x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %sent = f32[64,64]{{1,0}} collective-permute(%dot), channel_id=1, source_target_pairs={{{{0,1}},{{1,2}},{{2,3}}}}
  ROOT %t = (s32[], f32[64,64]{{1,0}}) tuple(%next, %sent)
}}

%cond (param.1: (s32[], f32[64,64])) -> pred[] {{
  %param.1 = (s32[], f32[64,64]{{1,0}}) parameter(0)
  %i.1 = s32[] get-tuple-element(%param.1), index=0
  %n = s32[] constant({steps})
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}}

ENTRY %main (x: f32[64,64]) -> f32[64,64] {{
  %x.0 = f32[64,64]{{1,0}} parameter(0)
  %zero = s32[] constant(0)
  %start = (s32[], f32[64,64]{{1,0}}) tuple(%zero, %x.0)
  %loop = (s32[], f32[64,64]{{1,0}}) while(%start), condition=%cond, body=%body, backend_config={{"known_trip_count":{{"n":"{steps}"}}}}
  ROOT %out = f32[64,64]{{1,0}} get-tuple-element(%loop), index=1
}}
"""


def test_two_async_collectives_run_beside_the_compute_between_their_start_and_done():
    steps = timeline.steps(OVERLAPPED, 8)
    assert [s["op"] for s in steps] == ["all-gather", "collective-permute", "compute", "done", "done"]
    s = timeline.schedule(steps, V5E)
    compute = [g for g in s.segments if g.lane == "compute" and g.op == "compute"]
    network = [g for g in s.segments if g.lane == "network"]
    assert len(compute) == 1 and {g.op for g in network} == {"all-gather", "collective-permute"}
    assert all(
        g.beside and g.end <= compute[0].end for g in network
    )  # drawn beside, inside the product's time
    assert network[0].end <= network[1].start  # one network: one collective after the other
    assert s.idle == 0 and not [g for g in s.segments if g.op == "wait"]
    assert s.total == pytest.approx(compute[0].end)
    assert s.hidden == pytest.approx(s.network)
    # all-gather: 7/8 of 8 KiB over a line of 8 v5e chips (half the ring's bandwidth)
    assert network[0].seconds == pytest.approx(7 / 8 * 8192 / (V5E.send_bandwidth / 2))


def test_a_synchronous_collective_after_compute_is_idle_time_equal_to_its_own():
    s = timeline.schedule(timeline.steps(BLOCKING, 8), V5E)
    (product,) = [g for g in s.segments if g.op == "compute"]
    (reduce,) = [g for g in s.segments if g.op == "all-reduce"]
    assert reduce.start == pytest.approx(product.end) and not reduce.beside
    expected = cost.bytes_sent("all-reduce", 256 * 256 * 4, 8) / (V5E.send_bandwidth / 2)
    assert reduce.seconds == pytest.approx(expected)
    assert s.idle == pytest.approx(expected) and s.hidden == 0  # nothing hidden behind compute
    assert s.total == pytest.approx(product.seconds + expected)
    (wait,) = [g for g in s.segments if g.op == "wait"]
    assert (wait.start, wait.end) == (pytest.approx(reduce.start), pytest.approx(reduce.end))


@pytest.mark.parametrize(("microbatches", "stages"), [(4, 4), (8, 4)])
def test_a_pipelines_loop_of_permutes_is_unrolled_by_its_trip_count(microbatches, stages):
    trips = microbatches + stages - 1
    steps = timeline.steps(pipeline(trips), 4)
    assert steps[0] == {"op": "loop", "times": trips, "length": 2}  # carried once, with its trip count
    s = timeline.schedule(steps, V5E)
    permutes = [g for g in s.segments if g.op == "collective-permute"]
    products = [g for g in s.segments if g.op == "compute"]
    assert len(permutes) == len(products) == trips
    assert all(a.end <= b.start + 1e-18 for a, b in itertools.pairwise(permutes))
    assert s.idle == pytest.approx(trips * 64 * 64 * 4 / V5E.link_bandwidth)


def test_a_long_loop_is_drawn_in_part_and_summarised_and_a_loop_that_only_computes_is_one_step():
    s = timeline.schedule(timeline.steps(pipeline(500), 4), V5E)
    assert len(s.segments) == timeline.DRAWN and s.more == 3 * 500 - timeline.DRAWN  # compute, permute, wait
    assert s.total > s.drawn_to and "not drawn" in timeline.summary("yours", s)
    quiet = pipeline(9).replace(
        "collective-permute(%dot), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3}}", "negate(%dot)"
    )
    assert [st["op"] for st in timeline.steps(quiet, 4)] == ["compute"]


def test_the_steps_carry_numbers_and_the_kits_own_names_only_and_fit_the_facts_schema():
    steps = timeline.steps(OVERLAPPED, 8) + timeline.steps(pipeline(7), 4)
    strings = {v for s in steps for v in s.values() if isinstance(v, str)}
    assert strings <= set(timeline.OPS)
    assert records.facts({"devices": 8, "timeline": steps})["timeline"] == json.loads(json.dumps(steps))
    with pytest.raises(records.Malformed):
        records.facts({"devices": 8, "timeline": [{"op": "<script>"}]})
    with pytest.raises(records.Malformed):
        records.facts({"devices": 8, "timeline": [{"op": "compute"}] * (timeline.MOST_STEPS + 1)})


def test_a_forged_loop_of_nothing_is_refused_not_run_for_ever():
    with pytest.raises(ValueError, match="unrolled"):
        timeline.schedule(
            [{"op": "loop", "times": 20_000, "length": 1}, {"op": "loop", "times": 20_000}], V5E
        )


def test_the_svg_has_no_script_escapes_its_text_and_states_the_idle_total():
    mine = timeline.schedule(timeline.steps(BLOCKING, 8), V5E)
    reference = timeline.schedule(timeline.steps(OVERLAPPED, 8), V5E)
    picture = timeline.svg([("yours", mine), ("the reference's", reference)], 'f <b>&"x"</b> on cpu-8')
    assert "<script" not in picture.lower() and "<b>" not in picture and "&lt;b&gt;" in picture
    assert "evil" not in picture and "href" not in picture
    assert f"idle (waiting on communication nothing overlaps) {cost.format_seconds(mine.idle)}" in picture
    assert picture.count('lane="') == 0 and picture.startswith("<svg") and picture.rstrip().endswith("</svg>")
    import xml.etree.ElementTree as ET

    ET.fromstring(picture)  # well-formed


def test_the_chip_is_the_one_compiled_for_else_the_cards_first():
    assert timeline.chip_of("TPU v6e 2x4").key == "v6e"
    assert timeline.chip_of(None).key == "v5e"
    assert "TPU compiler's own schedule" in timeline.caption("f", "v6e-8", "TPU v6e 2x4", V5E)
    assert "XLA:CPU" in timeline.caption("f", "cpu-8", None, V5E)


def test_the_feedback_page_embeds_the_picture_beside_the_references_and_the_class_page_does_not():
    from labkit.grading.publish import pages
    from tests.kit.test_feedback import make_results

    results = make_results()
    mine = {"c1": {"function": "pipeline_forward", "runs": {"cpu-8": {"steps": timeline.steps(BLOCKING, 8)}}}}
    theirs = {
        "c1": {"function": "pipeline_forward", "runs": {"cpu-8": {"steps": timeline.steps(OVERLAPPED, 8)}}}
    }
    next(r for r in results["rows"] if (r["student"], r["lab"]) == ("alice", 10))["timelines"] = mine
    results["labs"][1]["reference_timelines"] = {"cpu-8": theirs}
    page = pages.feedback_html(results, "alice")
    assert page.count('id="tl0-title"') == 1 and "&lt;svg" not in page and "<script" not in page.lower()
    assert "the reference&#x27;s" in page and "pipeline_forward on cpu-8" in page
    assert "tl0-title" not in pages.feedback_html(results, "bob")
    assert "tl0-title" not in pages.to_html(results)  # the class page: no student's pictures


def test_make_lab_10_on_the_reference_writes_the_picture_and_names_it(tmp_path):
    build = tmp_path / "build"
    env = dict(os.environ, LABKIT_BUILD=str(build))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "lab",
            "10",
            "--notebook",
            "reference/lab-10.ipynb",
            "--configs",
            "cpu-8",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    named = [line for line in done.stdout.splitlines() if line.startswith("Timeline")]
    assert named, done.stdout[-3000:] + done.stderr[-3000:]
    path = Path(named[0].split(": ", 1)[1].strip())
    picture = path.read_text()
    assert path.suffix == ".svg" and "<script" not in picture and "idle" in picture
    assert "the reference&#x27;s" in picture  # lab 10's reference timeline, recorded beside its costs


def test_a_collective_fused_into_a_computation_is_drawn_after_its_fusions_compute():
    fused = """\
HloModule fused, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%inner (p0: f32[256,256]) -> f32[256,256] {
  %p0 = f32[256,256]{1,0} parameter(0)
  %d = f32[256,256]{1,0} dot(%p0, %p0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %r = f32[256,256]{1,0} all-reduce(%d), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
}

ENTRY %main (p: f32[256,256]) -> f32[256,256] {
  %p = f32[256,256]{1,0} parameter(0)
  ROOT %f = f32[256,256]{1,0} fusion(%p), kind=kCustom, calls=%inner
}
"""
    steps = timeline.steps(fused, 8)
    assert [s["op"] for s in steps] == ["compute", "all-reduce"]
    assert steps[0]["flops"] >= 2 * 256**3


def test_a_called_computation_holding_a_loop_keeps_the_loops_body_apart():
    called = pipeline(5).replace("ENTRY %main (x: f32[64,64])", "%sub (x: f32[64,64])") + (
        """
ENTRY %main (y: f32[64,64]) -> f32[64,64] {
  %y = f32[64,64]{1,0} parameter(0)
  %c = f32[64,64]{1,0} call(%y), to_apply=%sub
  ROOT %after = f32[64,64]{1,0} negate(%c)
}
"""
    )
    steps = timeline.steps(called, 4)
    assert [s["op"] for s in steps] == ["loop", "compute", "collective-permute", "compute"]
    assert steps[0]["length"] == 2  # the negate after the call is not merged into the loop's body
    assert len([g for g in timeline.schedule(steps, V5E).segments if g.op == "collective-permute"]) == 5


def test_recording_a_reference_on_another_configuration_keeps_the_runs_already_recorded(tmp_path):
    first = {"c": {"function": "f", "runs": {"cpu-8": {"steps": timeline.steps(BLOCKING, 8)}}}}
    second = {"c": {"function": "f", "runs": {"v5e-8": {"steps": timeline.steps(OVERLAPPED, 8)}}}}
    timeline.write_reference(tmp_path, first)
    timeline.write_reference(tmp_path, second)
    assert sorted(timeline.read_reference(tmp_path)["c"]["runs"]) == ["cpu-8", "v5e-8"]


def test_a_malformed_reference_is_left_out_not_raised():
    mine = {"c": {"function": "f", "runs": {"cpu-8": {"steps": timeline.steps(BLOCKING, 8)}}}}
    for broken in ({"c": []}, {"c": {"runs": []}}, {"c": {"runs": {"cpu-8": {"steps": "x"}}}}, []):
        ((rows, _),) = timeline.pictures(mine, broken if isinstance(broken, dict) else {})
        assert [name for name, _ in rows] == ["yours"]
