"""The expectations a lab test states, and the messages a student reads when they fail."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from labkit.checks import (
    AsNumpy,
    FactUnavailable,
    Mismatch,
    call,
    card_of,
    check,
    compiled_call,
    expect_close,
    expect_collective,
    expect_collectives_within,
    expect_dtype,
    expect_equal,
    expect_held_below,
    expect_input_split,
    expect_jitted,
    expect_replicated,
    expect_shape,
    expect_split_across,
    expect_work_share,
    expect_work_split,
    sent_per_device,
)
from labkit.judge import plaindata


def value(x):
    return plaindata.decode(plaindata.encode(x))


def sharded(n_pieces, devices, length=16, replicated=False):
    """A decoded jax-like value whose shards are described by hand."""
    step = length // n_pieces
    shards = [
        {
            "device": d,
            "index": [[0, length]] if replicated else [[(d % n_pieces) * step, (d % n_pieces + 1) * step]],
            "replica_id": 0,
        }
        for d in range(devices)
    ]
    data = plaindata.encode(np.zeros(length, np.float32))
    data["jax"] = True
    data["sharding"] = {
        "type": "NamedSharding",
        "device_ids": list(range(devices)),
        "fully_replicated": replicated,
        "fully_addressable": True,
        "mesh": {"data": devices},
        "spec": [] if replicated else ["data"],
        "shards": shards,
    }
    return plaindata.decode(data)


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(Mismatch) as e:
        fn(*args, **kwargs)
    return str(e.value)


def test_close_values_pass():
    expect_close(value(np.array([1.0, 2.0])), [1.0, 2.0 + 1e-7])


def test_a_value_mismatch_says_where_and_what():
    text = message(expect_close, value(np.array([0.0, 2.0, 3.0])), [0.0, 2.0, 6.0])
    assert "1 of 3 values differ" in text and "index [2]" in text and "expected 6" in text and "got 3" in text


def test_a_shape_mismatch_names_both_shapes():
    text = message(expect_close, value(np.zeros(8)), np.zeros(16))
    assert "expected shape (16,)" in text and "got shape (8,)" in text


def test_none_is_explained():
    assert "forget to `return`" in message(expect_close, value(None), [1.0])


def test_a_hint_follows_the_mismatch():
    text = message(expect_shape, value(np.zeros(2)), (3,), hint="Did you psum?")
    assert text.endswith("Did you psum?")


def test_dtype():
    expect_dtype(value(np.zeros(2, np.float32)), "float32")
    assert "expected dtype float32, got float64" in message(expect_dtype, value(np.zeros(2)), "float32")


def test_equal_on_plain_values():
    expect_equal(value(3), 3)
    assert "expected 3" in message(expect_equal, value("3"), 3)
    assert "expected None" in message(expect_equal, value([1]), None)


def test_split_across_every_device():
    expect_split_across(sharded(8, 8), 8)


def test_a_result_on_one_device_is_not_split():
    text = message(expect_split_across, sharded(1, 1), 8)
    assert "all 8 devices" in text and "lives on 1" in text


def test_a_replicated_result_is_not_split():
    assert "full copy on every device" in message(expect_split_across, sharded(1, 8, replicated=True), 8)


def test_a_numpy_result_has_no_sharding():
    assert "plain (numpy or Python) value" in message(expect_split_across, value(np.zeros(8)), 8)


def test_replicated():
    expect_replicated(sharded(1, 8, replicated=True), 8)
    assert "full copy" in message(expect_replicated, sharded(8, 8), 8)


def test_equal_calls_share_an_id_and_different_inputs_do_not():
    a = call("f", np.arange(3.0))
    assert a.id == call("f", np.arange(3.0)).id
    assert a.id != call("f", np.arange(4.0)).id


def test_check_refuses_parameters_no_call_provides():
    with pytest.raises(TypeError):

        @check(got=call("f"))
        def test_x(got, other):
            pass


def test_a_value_that_a_known_mistake_gives_is_named_by_that_mistake():
    from labkit.checks import expect_close_naming_mistakes

    mistakes = {"You kept one block's sum": np.float32(1.0), "You averaged": np.float32(0.5)}
    expect_close_naming_mistakes(value(np.float32(4.0)), 4.0, mistakes)
    text = message(expect_close_naming_mistakes, value(np.float32(1.0)), 4.0, mistakes, hint="try psum")
    assert (
        "expected 4, got 1" in text and text.endswith("You kept one block's sum") and "try psum" not in text
    )
    other = message(expect_close_naming_mistakes, value(np.float32(3.0)), 4.0, mistakes, hint="try psum")
    assert "mistake" not in other and "You" not in other and other.endswith("try psum")


def test_a_mistake_that_gives_the_right_answer_is_never_named():
    from labkit.checks import expect_close_naming_mistakes

    text = message(
        expect_close_naming_mistakes,
        value(np.arange(4.0)),
        np.ones(4),
        {"Same as right": np.ones(4), "Wrong shape": np.arange(8.0), "Off by one": np.arange(4.0)},
    )
    assert text.endswith("Off by one") and "Same as right" not in text


def test_the_summary_counts_skipped_tests_out_and_still_passes():
    from labkit.judge.judge import Outcome
    from labkit.run.execute import RunRecord
    from labkit.student.report import summary

    outcomes = [
        Outcome("test_a", "f", "cpu-2x4", "cpu-2x4", "passed"),
        Outcome("test_b", "f", "cpu-2x4", "cpu-2x4", "skipped", "one process only"),
    ]
    line, ok = summary(["cpu-2x4"], outcomes, {"cpu-2x4": RunRecord("cpu-2x4", "ok")})
    assert ok and line == "1/1 on cpu-2x4 (1 skipped)"
    outcomes[0].status = "failed"
    assert summary(["cpu-2x4"], outcomes, {"cpu-2x4": RunRecord("cpu-2x4", "ok")})[1] is False


# -- expectations on the compiled program ------------------------------------------------------


def compiled(**facts):
    """A decoded value whose call carried these facts of its compiled program."""
    base = {
        "devices": 8,
        "collectives": [],
        "memory": {"argument": 0, "output": 0, "temp": 0, "alias": 0},
        "flops": 100.0,
        "inputs": [],
        "outputs": [],
        "top_level": ["jit"],
    }
    return dataclasses.replace(
        value(np.zeros(4, np.float32)), compiled=plaindata.decode_compiled({**base, **facts})
    )


def weight(path, whole, each, replicated=False):
    return {
        "path": path,
        "shape": [whole // 4],
        "dtype": "float32",
        "bytes": whole,
        "device_bytes": each,
        "replicated": replicated,
        "pieces": 1 if replicated else whole // each,
    }


def test_an_input_stored_one_eighth_per_device_is_split():
    expect_input_split(compiled(inputs=[weight("args[1]", 4096, 512)]), 1, 8, name="w1")


def test_an_input_whole_on_every_device_is_named_with_the_mistake():
    got = compiled(inputs=[weight("args[1]", 4096, 4096, replicated=True)])
    text = message(expect_input_split, got, 1, 8, name="w1", hint="That is data parallelism, not FSDP")
    assert text.startswith("every device holds all of w1 (4096 bytes on each of 8 devices)")
    assert text.endswith("That is data parallelism, not FSDP")


def test_every_leaf_of_a_nested_input_is_checked():
    got = compiled(inputs=[weight("args[0]['a']", 64, 8), weight("args[0]['b']", 64, 64, replicated=True)])
    assert "args[0]['b']" in message(expect_input_split, got, 0, 8)


def test_an_all_reduce_over_every_device_is_found_and_a_missing_one_named():
    everyone = {"op": "all-reduce", "shape": "f32[]", "groups": [list(range(8))]}
    expect_collective(compiled(collectives=[everyone]), "all-reduce", 8)
    half = {"op": "all-reduce", "shape": "f32[]", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    text = message(expect_collective, compiled(collectives=[half]), "all-reduce", 8)
    assert "no all-reduce over all 8 devices" in text and "all-reduce over 4" in text


def test_a_device_doing_the_whole_batchs_flops_is_named():
    expect_work_split(compiled(flops=150.0), 1000.0, 8)
    expect_work_split(
        compiled(flops=780.0), 1000.0, 2
    )  # half the products on two devices, and the rest of a step
    assert "every device computes all of it" in message(expect_work_split, compiled(flops=1100.0), 1000.0, 8)


def test_a_device_repeating_part_of_its_neighbours_work_is_named():
    expect_work_share(compiled(flops=130.0), 1000.0, 8)  # its 125, and a little around it
    text = message(expect_work_share, compiled(flops=500.0), 1000.0, 8, what="x @ w")
    assert (
        text.startswith("one device does 500 FLOPs, 0.50 of the 1e+03 that x @ w needs")
        and "1/8 share" in text
    )


ROWS_OF_A_2X4_GRID = [{0, 1, 2, 3}, {4, 5, 6, 7}]


def test_collectives_inside_the_rows_of_a_grid_pass_and_one_across_them_is_named():
    over_model = {"op": "all-to-all", "shape": "f32[2,8]", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    expect_collectives_within(compiled(collectives=[over_model]), ROWS_OF_A_2X4_GRID, allowed="over 'model'")
    over_data = {"op": "all-reduce", "shape": "f32[8]", "groups": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    text = message(
        expect_collectives_within,
        compiled(collectives=[over_model, over_data]),
        ROWS_OF_A_2X4_GRID,
        allowed="over 'model'",
    )
    assert (
        text
        == "the compiled program has an all-reduce that joins devices [0, 4], where only collectives over "
        "'model' are allowed"
    )
    across = {"op": "collective-permute", "shape": "f32[8]", "pairs": [[3, 4]]}
    assert "a collective-permute that joins devices [3, 4]" in message(
        expect_collectives_within, compiled(collectives=[across]), ROWS_OF_A_2X4_GRID, allowed="over 'model'"
    )


def test_a_ring_shift_sends_its_block_once_and_a_device_sending_to_itself_sends_nothing():
    ring = {"op": "collective-permute", "shape": "f32[64]", "pairs": [[i, (i + 1) % 8] for i in range(8)]}
    assert sent_per_device(compiled(collectives=[ring])) == 256
    assert sent_per_device(compiled(devices=1, collectives=[{**ring, "pairs": [[0, 0]]}])) == 0


def test_a_collective_that_names_no_groups_joins_every_device_for_the_card_and_the_tests_alike():
    whole = {"op": "all-reduce", "shape": "f32[256]", "groups": []}  # HLO's replica_groups={}: all devices
    got = compiled(devices=8, collectives=[whole])
    assert sent_per_device(got) == card_of(got).sent["all-reduce"] == 2 * 7 / 8 * 1024


def test_the_card_of_a_call_is_the_kits_card_of_its_compiled_program():
    gather = {"op": "all-gather", "shape": "f32[1024]", "groups": [list(range(8))]}
    card = card_of(
        compiled(
            flops=2e6,
            collectives=[gather],
            outputs=[{"path": "out", "shape": [8], "dtype": "float32", "bytes": 32, "device_bytes": 4}],
            memory={"argument": 512, "output": 4, "temp": 4096, "alias": 0},
        )
    )
    assert card.devices == 8 and card.flops == 2e6 and card.dtype == "f32"
    assert card.sent == {"all-gather": 7 / 8 * 4096} and card.held == {
        "argument": 512,
        "output": 4,
        "temp": 4096,
    }
    with pytest.raises(FactUnavailable, match="cannot be made here: no FLOPs here"):
        card_of(compiled(flops={"unavailable": "no FLOPs here"}))


def test_a_device_holding_as_much_as_a_whole_input_is_named():
    small = {"argument": 4096, "output": 1024, "temp": 4096, "alias": 0}
    expect_held_below(compiled(memory=small), 32768, what="all of x")
    big = {"argument": 4096, "output": 1024, "temp": 49152, "alias": 0}
    assert message(expect_held_below, compiled(memory=big), 32768, what="all of x").startswith(
        "one device holds 52 KiB of arguments and temporaries, at least the 32 KiB of all of x"
    )


def test_work_done_op_by_op_is_not_jitted():
    expect_jitted(compiled(top_level=["device_put", "jit"]))
    assert "outside any jax.jit (add, sin)" in message(expect_jitted, compiled(top_level=["add", "sin"]))


def test_missing_facts_fail_even_on_one_device_and_say_why():
    got = dataclasses.replace(
        value(np.zeros(4)), compiled=plaindata.Unavailable("jax.jit could not trace it")
    )
    with pytest.raises(FactUnavailable) as e:
        expect_collective(got, "all-reduce", 1)
    assert "jax.jit could not trace it" in str(e.value) and isinstance(e.value, Mismatch)
    memoryless = compiled(flops={"unavailable": "cost_analysis() gives no FLOPs on this backend"})
    assert "cannot be made here: cost_analysis()" in message(expect_work_split, memoryless, 10.0, 1)


def test_a_value_from_a_plain_call_has_no_facts_to_check():
    assert "compiled_call" in message(expect_input_split, value(np.zeros(4)), 0, 8)


def test_a_compiled_call_shares_its_id_with_the_plain_call_and_asks_for_facts():
    plain, examined = call("f", 3, "x"), compiled_call("f", 3, "x")
    assert plain.id == examined.id and plain == examined
    assert examined.facts and not plain.facts


def test_a_call_made_plainly_by_one_test_and_examined_by_another_runs_once_examined(tmp_path):
    from labkit.judge import judge

    (tmp_path / "test_two.py").write_text(
        "from labkit.checks import call, check, compiled_call\n\n"
        "@check(got=call('f', 1))\ndef test_plain(got):\n    pass\n\n"
        "@check(got=compiled_call('f', 1))\ndef test_examined(got):\n    pass\n\n"
        "@check(got=call('g', 1))\ndef test_other(got):\n    pass\n"
    )
    calls = {c["function"]: c for c in judge.collect_calls([tmp_path])}
    assert sorted(calls) == ["f", "g"]
    assert calls["f"].get("facts") is True and "facts" not in calls["g"]


def test_a_placed_grid_fits_the_devices_of_the_run():
    from labkit.judge.harness import fit_mesh_shape

    assert fit_mesh_shape(None, 8) == (8,)
    assert fit_mesh_shape((2, -1), 8) == (2, 4)
    assert fit_mesh_shape((2, -1), 1) == (1, 1)
    assert fit_mesh_shape((2, -1), 3) == (1, 3)
    assert fit_mesh_shape((4, 2), 8) == (4, 2)


def test_an_input_sized_by_devices_is_as_written_up_to_its_rows_and_in_shifted_copies_beyond():
    from labkit.checks import by_devices

    x = by_devices(np.arange(32.0, dtype=np.float32).reshape(16, 2), shift=100)
    for n in (1, 2, 8, 16):
        assert plaindata.copies_for(16, n) == 1
        assert np.array_equal(x.on(SimpleNamespace(device_count=n)), x.value)
    assert plaindata.copies_for(16, 256) == 16 and plaindata.copies_for(96, 256) == 8
    on_256 = x.on(SimpleNamespace(device_count=256))
    assert on_256.shape == (256, 2) and on_256.dtype == np.float32
    blocks = on_256.reshape(16, 16, 2)
    assert np.array_equal(blocks[0], x.value) and np.array_equal(blocks[3], x.value + 300)
    assert len({b.tobytes() for b in on_256}) == 256  # no two devices get the same row


def on_a_pod_of_256(x, monkeypatch) -> tuple[tuple, np.ndarray]:
    """What a process of 256 devices makes of the input `x`: the shape it traces at from the call's shapes alone
    (`callplan.for_the_student`), and the value it gets."""
    import jax

    from labkit.judge import callplan, harness

    spec = {"id": "c", **compiled_call("f", x).encoded(), "verify": True}
    shapes = callplan.for_the_student([spec])[0]["args"][0]
    monkeypatch.setattr(jax, "device_count", lambda: 256)
    return harness._materialise(shapes).shape, np.asarray(
        harness._materialise(call("f", x).encoded()["args"][0])
    )


def test_an_input_sized_by_devices_can_grow_its_columns_for_a_grid_split_by_columns(monkeypatch):

    from labkit.checks import by_devices

    grid = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    x = by_devices(grid, shift=1000, axis=1)
    assert np.array_equal(x.on(SimpleNamespace(device_count=64)), grid)
    on_256 = x.on(SimpleNamespace(device_count=256))  # a 2 x 128 grid's columns: 256 of them
    assert on_256.shape == (2, 256) and np.array_equal(on_256[:, 64:128], grid + 1000)
    assert call("f", x).id != call("f", by_devices(grid, shift=1000)).id  # another input, another call
    shape, value = on_a_pod_of_256(x, monkeypatch)
    assert shape == (2, 256) and np.array_equal(value, on_256)
    with pytest.raises(TypeError, match="axes 2"):
        by_devices(grid, axis=2)
    assert call("f", by_devices(grid, shift=1000, axis=(1,))).id == call("f", x).id  # one axis, one spelling


def test_an_input_sized_by_devices_can_grow_rows_and_columns_with_no_two_blocks_alike(monkeypatch):

    from labkit.checks import by_devices

    matrix = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
    x = by_devices(matrix, shift=1, axis=(0, 1))
    assert np.array_equal(x.on(SimpleNamespace(device_count=32)), matrix)
    on_256 = x.on(SimpleNamespace(device_count=256))  # rows one a device, columns for a 2 x 128 grid
    assert on_256.shape == (256, 256)
    blocks = {on_256[i : i + 32, j : j + 64].tobytes() for i in range(0, 256, 32) for j in range(0, 256, 64)}
    assert len(blocks) == 8 * 4  # every copy shifted past every other
    shape, value = on_a_pod_of_256(x, monkeypatch)
    assert shape == (256, 256) and np.array_equal(value, on_256)
    with pytest.raises(TypeError, match="axes"):
        by_devices(matrix, axis=(0, 0))


def test_an_input_sized_by_devices_keeps_its_id_and_reaches_each_process_grown_for_its_devices(monkeypatch):
    import jax

    from labkit.checks import by_devices, placed
    from labkit.judge import callplan, harness

    x = by_devices(np.linspace(-1.0, 1.0, 32, dtype=np.float32), shift=0.5)
    plain, examined, split = call("f", x), compiled_call("f", x), call("f", placed(x, ("data",)))
    # one call whatever the devices, and not the call of the plain array
    assert plain.id == examined.id != call("f", x.value).id
    spec = {"id": examined.id, **examined.encoded(), "verify": True}
    shapes = callplan.for_the_student([spec])[0]["args"][0]
    assert shapes["kind"] == "abstract" and shapes["grow"] == {"shift": 0.5}  # no values, but it still grows
    monkeypatch.setattr(jax, "device_count", lambda: 256)
    assert harness._materialise(shapes).shape == (256,)
    got = np.asarray(harness._materialise(plain.encoded()["args"][0]))
    assert np.array_equal(got[:32], x.value) and np.allclose(got[32:64], x.value + 0.5)
    assert split.encoded()["args"][0]["grow"] == {"shift": 0.5} and "place" in split.encoded()["args"][0]
    as_numpy = call("f", AsNumpy(x)).encoded()["args"][0]  # grows as asked, and arrives as numpy
    assert as_numpy["grow"] == {"shift": 0.5} and as_numpy["as"] == "numpy"
    grown_numpy = harness._materialise(as_numpy)
    assert type(grown_numpy) is np.ndarray and grown_numpy.shape == (256,)
    monkeypatch.setattr(jax, "device_count", lambda: 8)
    assert np.array_equal(np.asarray(harness._materialise(plain.encoded()["args"][0])), x.value)


def test_a_check_not_judged_for_a_topology_is_skipped_there_saying_why_and_judged_everywhere_else():
    from labkit.checks import not_judged_for

    on = lambda name, topology: SimpleNamespace(config=SimpleNamespace(name=name, compile_for=topology))
    with pytest.raises(pytest.skip.Exception, match="not judged on v5e-256: the compiler writes both alike"):
        not_judged_for(on("v5e-256", "v5e:16x16"), ("v5e:16x16",), "the compiler writes both alike")
    for run in (on("v5e-8", "v5e:2x4"), on("cpu-8", None)):
        assert not_judged_for(run, ("v5e:16x16",), "the compiler writes both alike") is None


def test_a_check_not_judged_on_a_topology_is_skipped_there_before_its_call_is_read_and_judged_elsewhere():
    # lab 10's ring over 256 devices cannot even be called with the lab's inputs there: the skip comes first
    from labkit.checks import LabRun
    from labkit.course import configs
    from labkit.judge.outcomes import CallFailed
    from labkit.run.execute import RunRecord

    x = np.arange(8, dtype=np.float32)
    raised = call("ring_sum", x)
    seen = []

    @check(not_judged_on=(("v5e:16x16",), "the ring outgrows one machine"), got=raised)
    def test_ring(got):
        seen.append(got)

    def run_on(name: str) -> LabRun:
        record = RunRecord(
            name,
            "ok",
            environment={"device_count": 8},
            results={
                raised.id: {
                    "error": {
                        "type": "ValueError",
                        "message": "array split does not result in an equal division",
                    }
                }
            },
        )
        return LabRun(name, configs.by_name(name), record)

    with pytest.raises(pytest.skip.Exception, match="not judged on v5e-256: the ring outgrows one machine"):
        test_ring(run_on("v5e-256"))
    for name in ("v5e-8", "cpu-8"):  # judged there: the call's own failure is the test's
        with pytest.raises(CallFailed, match="`ring_sum` raised ValueError"):
            test_ring(run_on(name))
    assert seen == []
    for bad in ((("v5e:16x16",), ""), ("v5e:16x16", "why"), (("v5e:16x16",),)):
        with pytest.raises(TypeError, match="not_judged_on"):
            check(not_judged_on=bad, got=raised)


def test_an_input_sized_by_devices_can_give_each_device_of_a_larger_pod_several_rows(monkeypatch):

    from labkit.checks import by_devices

    batch = np.arange(32 * 2, dtype=np.float32).reshape(32, 2)
    x = by_devices(batch, shift=100, per_device=2)  # two micro-batches a device
    for n in (1, 8, 32):  # up to its rows, as written
        assert np.array_equal(x.on(SimpleNamespace(device_count=n)), batch)
    assert x.on(SimpleNamespace(device_count=256)).shape == (512, 2)
    assert plaindata.copies_for(96, 256, per_device=4) == 32  # 3,072 rows: 12 a device, a multiple of 4
    assert call("f", x).id != call("f", by_devices(batch, shift=100)).id
    assert (
        call("f", by_devices(batch, shift=100, per_device=1)).id == call("f", by_devices(batch, shift=100)).id
    )
    shape, value = on_a_pod_of_256(x, monkeypatch)
    assert shape == value.shape == (512, 2)
    with pytest.raises(TypeError, match="per_device"):
        by_devices(batch, per_device=0)


def test_an_input_grown_on_several_axes_gives_its_first_axis_the_rows_a_device_asks_for():
    from labkit.checks import by_devices

    batch = np.zeros((32, 64), np.float32)  # a batch of 32 rows of 64 features, both split over every device
    on_256 = by_devices(batch, shift=1, axis=(0, 1), per_device=2).on(SimpleNamespace(device_count=256))
    assert on_256.shape == (512, 256)  # two rows a device, one feature a device


def test_an_input_sized_by_devices_can_grow_only_as_far_as_one_row_of_a_grid(monkeypatch):
    from labkit.checks import by_devices

    # lab 14's model dimension: split over the 'model' axis of a 2 x n/2 grid alone, never over its 'data' rows
    weight = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    x = by_devices(weight, shift=0.5, axis=(0, 1), grid_rows=2)
    for n in (1, 8, 32, 128):  # up to 64 columns of a 2 x 64 grid, as written
        assert np.array_equal(x.on(SimpleNamespace(device_count=n)), weight)
    on_256 = x.on(SimpleNamespace(device_count=256))  # the 128 of a 2 x 128 grid, not every device's 256
    assert on_256.shape == (128, 128)
    assert by_devices(weight, axis=(0, 1)).on(SimpleNamespace(device_count=256)).shape == (256, 256)
    assert np.array_equal(on_256[64:, :64], weight + 0.5)
    assert np.array_equal(on_256[:, 64:], on_256[:, :64] + 1.0)  # every copy shifted past every other
    odd = plaindata.copies_along((64,), {"shift": 0, "grid_rows": 2}, 65)
    assert odd == {0: plaindata.copies_for(64, 65)}  # 1 x 65, as placed's mesh_shape=(2, -1) fits it
    assert call("f", x).id != call("f", by_devices(weight, shift=0.5, axis=(0, 1))).id
    assert call("f", by_devices(weight, grid_rows=1)).id == call("f", by_devices(weight)).id  # one spelling
    shape, value = on_a_pod_of_256(x, monkeypatch)
    assert shape == value.shape == (128, 128) and np.array_equal(value, on_256)
    with pytest.raises(TypeError, match="grid_rows"):
        by_devices(weight, grid_rows=0)


def test_an_input_sized_by_devices_can_give_each_device_a_piece_for_every_device(monkeypatch):
    from labkit.checks import by_devices

    # a ring all-reduce cuts each device's block into a piece for every device: 1024 rows, n x n up to 32
    ring = np.arange(1024 * 2, dtype=np.float32).reshape(1024, 2)
    x = by_devices(ring, shift=0.25, pieces=1)
    for n in (1, 2, 8, 16, 32):  # n x n no more than its rows: as written
        assert np.array_equal(x.on(SimpleNamespace(device_count=n)), ring)
    on_256 = x.on(SimpleNamespace(device_count=256))  # 64 copies: 256 rows a device, one for each device
    assert on_256.shape == (65536, 2) and np.array_equal(on_256[1024:2048], ring + 0.25)
    assert by_devices(ring, shift=0.25).on(SimpleNamespace(device_count=256)).shape == (
        1024,
        2,
    )  # rows enough
    both_ways = by_devices(np.zeros((2048, 3), np.float32), pieces=2)  # two pieces a device: half each way
    assert both_ways.on(SimpleNamespace(device_count=32)).shape == (2048, 3)
    assert both_ways.on(SimpleNamespace(device_count=256)).shape == (131072, 3)
    shape, value = on_a_pod_of_256(x, monkeypatch)
    assert shape == value.shape == (65536, 2) and np.array_equal(value, on_256)
    # the encoding, and so every call's id, is what it was where `pieces` is not given
    assert by_devices(ring, shift=0.25).grow() == {"shift": 0.25} and x.grow() == {"shift": 0.25, "pieces": 1}
    assert call("f", x).id != call("f", by_devices(ring, shift=0.25)).id
    for wrong in (0, -1):
        with pytest.raises(TypeError, match="pieces"):
            by_devices(ring, pieces=wrong)


def test_an_input_given_by_its_shape_alone_can_grow_with_the_pod(monkeypatch):
    import jax

    from labkit.checks import by_devices, shaped
    from labkit.judge import callplan, harness

    # a production stack of 8 layers: one a stage on up to 8 chips, and on 256 a model of 256 such layers
    stack = by_devices(shaped((8, 1024, 1024)))
    assert stack.on(SimpleNamespace(device_count=8)) == shaped((8, 1024, 1024))
    on_256 = stack.on(SimpleNamespace(device_count=256))
    assert on_256 == shaped((256, 1024, 1024)) and on_256.nbytes == 32 * stack.value.nbytes
    made = compiled_call("f", stack, shaped((4, 1024)))
    assert made.compile_only  # judged on the compile-only TPU configurations alone, as any shaped input
    with pytest.raises(TypeError, match="shape only"):
        call("f", stack)
    encoded = made.encoded()["args"][0]
    assert encoded == {
        "kind": "abstract",
        "shape": [8, 1024, 1024],
        "dtype": "float32",
        "grow": {"shift": 0.0},
    }
    spec = {"id": "c", **made.encoded(), "verify": True}
    assert callplan.compile_only(spec) and callplan.for_the_student([spec])[0]["args"][0] == encoded
    monkeypatch.setattr(jax, "device_count", lambda: 256)
    assert harness._materialise(encoded).shape == (256, 1024, 1024)
    with pytest.raises(TypeError, match="axes"):
        by_devices(shaped((8, 1024)), axis=2)


def test_sizes_of_an_input_grown_with_the_pod_reach_the_call_as_the_shape_the_input_reached(monkeypatch):
    import jax

    from labkit.checks import GrownSize, by_devices, sizes_of
    from labkit.judge import callplan, harness

    # lab 13's predict_sent(kind, shape) takes sizes; the program it predicts takes the array itself
    x = by_devices(np.zeros((64, 32), np.float32), shift=1, axis=(0, 1), per_device=2)
    rows, columns = sizes_of(x)
    assert isinstance(rows, GrownSize) and isinstance(columns, GrownSize)
    assert sizes_of(by_devices(np.zeros((64, 3), np.float32)))[1] == 3  # an axis that never grows: an int
    spec = {"id": "c", **call("predict_sent", "psum", sizes_of(x)).encoded()}
    shape = callplan.for_the_student([spec])[0]["args"][1]
    for n in (1, 8, 32, 64, 256):
        run = SimpleNamespace(device_count=n)
        assert (rows.on(run), columns.on(run)) == x.on(run).shape
        monkeypatch.setattr(jax, "device_count", lambda n=n: n)
        assert harness._materialise(shape) == x.on(run).shape  # what the student's process is asked at
    assert x.on(SimpleNamespace(device_count=256)).shape == (512, 256)  # two rows a device, rows only
    assert harness._materialise(shape) == (512, 256) and type(harness._materialise(shape)[0]) is int
    # the call is one call on every configuration, and not the call at the sizes as written
    assert call("f", sizes_of(x)).id == call("f", sizes_of(x)).id != call("f", (64, 32)).id
    with pytest.raises(TypeError, match="by_devices"):
        sizes_of(np.zeros((4, 4)))


def test_an_input_sized_by_devices_can_stay_wide_enough_for_each_device_of_a_larger_pod(monkeypatch):
    from labkit.checks import by_devices

    # lab 14's work problem: 256 hidden units, 8 for each device of a 2 x n/2 grid's row on a pod past 32 devices
    w1 = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    x = by_devices(w1, shift=0.5, axis=(1, 0), per_device=8, grid_rows=2, widen=True)
    for n in (1, 2, 8, 16, 32):  # as written: the tests' own sizes
        assert np.array_equal(x.on(SimpleNamespace(device_count=n)), w1)
    narrow = by_devices(w1, axis=(1, 0), per_device=8, grid_rows=2)  # 256 units already divide over 128
    assert narrow.on(SimpleNamespace(device_count=256)).shape == (128, 256)
    on_256 = x.on(SimpleNamespace(device_count=256))
    assert on_256.shape == (128, 1024) and np.array_equal(on_256[:64, 256:512], w1 + 0.5)
    assert call("f", x).id != call("f", by_devices(w1, shift=0.5, axis=(1, 0), per_device=8, grid_rows=2)).id
    shape, value = on_a_pod_of_256(x, monkeypatch)
    assert shape == value.shape == (128, 1024) and np.array_equal(value, on_256)
