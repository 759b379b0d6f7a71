"""What a run writes back is decoded against bounded schemas (labkit/judge/records.py) before the kit uses it.

Every record comes from the student's side: a local run's results file, each process's of a
multi-process run, a pod's results and its record of how it ended, and the verifier's verified.json
(the student's exported program ran there). None needs a notebook run here: each file is made by hand.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from labkit.course import configs
from labkit.grading.running import pods
from labkit.judge import records, verify
from labkit.run import allowance, execute, scratch

FACTS = {
    "devices": 8,
    "top_level": ["shard_map"],
    "memory": {"argument": 64, "output": 64, "temp": 0, "alias": 0},
    "flops": 16.0,
    "collectives": [],
    "seconds": 0.1,
}
VALUE = {"kind": "array", "dtype": "float32", "shape": [2], "data": [1.0, 2.0], "jax": True, "sharding": None}


def result(**over) -> dict:
    return {"id": "c1", "value": VALUE, "facts": FACTS, "stdout": ""} | over


def write_results(folder: Path, payload) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def test_a_well_formed_payload_is_read_as_it_was_written(tmp_path):
    path = write_results(tmp_path, {"environment": {"device_count": 8}, "results": [result()]})
    environment, results = execute.read_results(path, None)
    assert environment == {"device_count": 8}
    assert results == {"c1": result()}


def test_facts_whose_memory_is_a_string_are_refused_naming_the_field(tmp_path):
    # the case: a reported call whose facts.memory is a string made cost.card raise for the whole class
    path = write_results(tmp_path, {"environment": {}, "results": [result(facts=FACTS | {"memory": "lots"})]})
    with pytest.raises(ValueError, match=r"facts\.memory"):
        execute.read_results(path, None)


MALFORMED = {
    "results-not-a-list": {"environment": {}, "results": {"c1": result()}},
    "a-result-without-id": {"environment": {}, "results": [{"value": VALUE}]},
    "an-id-that-is-a-number": {"environment": {}, "results": [result(id=7)]},
    "two-results-for-one-call": {"environment": {}, "results": [result(), result()]},
    "a-value-of-no-known-kind": {
        "environment": {},
        "results": [result(value={"kind": "pickle", "data": "..."})],
    },
    "a-value-that-is-a-list": {"environment": {}, "results": [result(value=[1, 2])]},
    "a-shape-of-strings": {"environment": {}, "results": [result(value=VALUE | {"shape": ["2"]})]},
    "bytes-that-are-a-list": {"environment": {}, "results": [result(value=VALUE | {"bytes": [0, 0]})]},
    "an-error-without-type": {"environment": {}, "results": [result(error={"message": "x"})]},
    "stdout-of-a-megabyte": {"environment": {}, "results": [result(stdout="x" * (1 << 20))]},
    "flops-infinite": {"environment": {}, "results": [result(facts=FACTS | {"flops": 1e400})]},
    "a-collective-without-op": {"environment": {}, "results": [result(facts=FACTS | {"collectives": [{}]})]},
    "negative-devices": {"environment": {}, "results": [result(facts=FACTS | {"devices": -1})]},
    "an-environment-of-ten-thousand-names": {
        "environment": {str(i): i for i in range(10_000)},
        "results": [],
    },
    "too-many-results": {
        "environment": {},
        "results": [result(id=f"c{i}") for i in range(records.MOST_CALLS + 1)],
    },
    "nested-too-deeply": "[" * 100_000 + "]" * 100_000,
    "not-json": '{"environment": ',
}


@pytest.mark.parametrize("payload", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_results_payload_is_refused_as_unreadable(tmp_path, payload):
    path = write_results(tmp_path, payload)
    with pytest.raises(
        ValueError
    ):  # records.Malformed: the run's results could not be read, that unit's error
        execute.read_results(path, None)


def test_a_results_file_larger_than_the_cap_is_not_read(tmp_path):
    path = write_results(
        tmp_path, {"environment": {}, "results": [result(stdout=" " * (records.MAX_BYTES + 1))]}
    )
    with pytest.raises(scratch.Refused, match="larger than"):
        execute.read_results(path, None)


def test_records_keep_no_field_the_kit_does_not_know(tmp_path):
    path = write_results(
        tmp_path, {"environment": {}, "results": [result(judged_by="verified", mine={"a": 1})]}
    )
    _, results = execute.read_results(path, None)
    assert "judged_by" not in results["c1"] and "mine" not in results["c1"]


# ---- a pod's output: its record of how it ended, and its results ------------------------------------------


def pod_output(folder: Path, ended, payload) -> Path:
    folder.mkdir(parents=True)
    (folder / pods.ENDED).write_text(ended if isinstance(ended, str) else json.dumps(ended))
    if payload is not None:
        write_results(scratch.RunFolders(folder / pods.RUN).scratch, payload)
    return folder


CALLS = [
    {"id": "c1", "function": "f", "args": [], "kwargs": {}}
]  # the kit's calls: a result for another is dropped


def record_of(out: Path, tmp_path: Path) -> execute.RunRecord:
    return pods.record_of(
        out, configs.CONFIGS["cpu-1"], CALLS, tmp_path / "kit", 60, allowance.DEFAULT_LIMITS
    )


def test_a_pods_results_with_malformed_facts_are_that_units_error_naming_the_field(tmp_path):
    out = pod_output(
        tmp_path / "out",
        {"status": "ok", "seconds": 1.0},
        {
            "environment": {},
            "results": [result(facts=FACTS | {"memory": "lots"}, program={"host_data": True})],
        },
    )
    record = record_of(out, tmp_path)
    assert record.status == "error" and record.results == {}
    assert "not what the kit's harness writes" in record.message and "facts.memory" in record.message, (
        record.message
    )


@pytest.mark.parametrize(
    "ended",
    [
        {"status": "fine"},
        {"status": "ok", "seconds": "a while"},
        {"status": "ok", "timed_out": "no"},
        ["ok"],
        "{",
    ],
    ids=["unknown-status", "seconds-a-string", "timed-out-a-string", "a-list", "not-json"],
)
def test_a_pods_malformed_record_of_its_run_is_that_units_error(tmp_path, ended):
    out = pod_output(tmp_path / "out", ended, {"environment": {}, "results": [result()]})
    record = record_of(out, tmp_path)
    assert record.status == "error" and record.results == {}, record
    assert "a record the kit does not read" in record.message, record.message


def test_a_pods_well_formed_output_is_read(tmp_path):
    out = pod_output(
        tmp_path / "out", {"status": "ok", "seconds": 2.5}, {"environment": {}, "results": [result()]}
    )
    record = record_of(out, tmp_path)
    assert record.status == "ok" and record.seconds == 2.5 and record.results["c1"]["value"] == VALUE


# ---- the verifier's verified.json ---------------------------------------------------------------------------


class _Done:
    def wait(self, timeout=None):
        return 0

    def kill(self):
        pass


@pytest.mark.parametrize(
    "found",
    [
        {"results": {"c1": {"value": "six", "facts": FACTS}}},
        {"results": {"c1": {"value": VALUE, "facts": FACTS | {"memory": "lots"}}}},
        {"results": [{"value": VALUE}]},
        {"results": {"c1": {"value": VALUE | {"data": [0.0] * 10}, "facts": {"devices": 0}}}},
    ],
    ids=["value-a-string", "memory-a-string", "results-a-list", "zero-devices"],
)
def test_a_malformed_verified_json_gives_no_value_and_says_the_kits_run_gave_no_results(
    tmp_path, monkeypatch, found
):
    from labkit.run import sandbox

    def launch(argv, run):  # the verifier "ran" and wrote this
        Path(argv[-1]).write_text(json.dumps(found))
        return _Done()

    monkeypatch.setattr(sandbox, "launch", launch)
    record = execute.RunRecord("cpu-1", "ok", results={"c1": {"id": "c1", "program": {"program": "AAAA"}}})
    verify.verify(
        record, [{"id": "c1", "function": "f", "verify": True}], tmp_path, {}, allowance.DEFAULT_LIMITS, 60
    )
    mine = record.results["c1"]
    assert mine["judged_by"] == "unverified" and "value" not in mine and "facts" not in mine, mine
    assert "ended without results" in mine["error"]["message"]


def test_a_well_formed_verified_json_gives_its_value(tmp_path, monkeypatch):
    from labkit.run import sandbox

    def launch(argv, run):
        Path(argv[-1]).write_text(
            json.dumps({"results": {"c1": {"value": VALUE, "facts": FACTS}}, "seconds": 1})
        )
        return _Done()

    monkeypatch.setattr(sandbox, "launch", launch)
    record = execute.RunRecord("cpu-1", "ok", results={"c1": {"id": "c1", "program": {"program": "AAAA"}}})
    verify.verify(
        record, [{"id": "c1", "function": "f", "verify": True}], tmp_path, {}, allowance.DEFAULT_LIMITS, 60
    )
    assert record.results["c1"]["value"] == VALUE and record.results["c1"]["judged_by"] == "verified"


def test_a_malformed_payload_of_one_process_of_a_multi_process_run_is_not_taken(tmp_path):
    bad = write_results(
        tmp_path / "bad", {"environment": {}, "results": [result(facts=FACTS | {"memory": "lots"})]}
    )
    good = write_results(tmp_path / "good", {"environment": {"process_index": 1}, "results": [result()]})
    assert execute._read_payload(bad) is None  # the run is then an error naming that process
    assert execute._read_payload(good) == ({"process_index": 1}, {"c1": result()})


def test_a_verified_json_larger_than_the_cap_is_not_loaded(tmp_path, monkeypatch):
    from labkit.run import sandbox

    n = records.VERIFIED_MAX_BYTES // 4  # floats of five bytes each in JSON: 25% over the verifier's cap
    head = json.dumps({"results": {"c1": {"value": VALUE | {"shape": [n], "data": []}}}})
    big = head.replace('"data": []', '"data": [' + "0.5, " * (n - 1) + "0.5]")

    def launch(argv, run):  # an output of six arrays of 2M floats was 256 MB of JSON
        Path(argv[-1]).write_text(big)
        return _Done()

    monkeypatch.setattr(sandbox, "launch", launch)
    record = execute.RunRecord("cpu-1", "ok", results={"c1": {"id": "c1", "program": {"program": "AAAA"}}})
    verify.verify(
        record, [{"id": "c1", "function": "f", "verify": True}], tmp_path, {}, allowance.DEFAULT_LIMITS, 60
    )
    assert record.results["c1"]["judged_by"] == "unverified" and "value" not in record.results["c1"]


def test_the_verifiers_own_facts_survive_the_schema_the_compiler_estimate_and_what_the_program_asks_for():
    from labkit.judge import records

    facts = {
        "devices": 8,
        "compiled_for": "TPU v5e 2x4",
        "compiler": {"seconds": 6.2e-08, "flops": 131.0, "bytes": 45568.0},
        "written": ["reduce-scatter"],
    }
    assert records.facts(facts) == facts


def test_the_judges_threads_convert_records_one_at_a_time(monkeypatch):
    # Two threads building msgspec's type information at once crashed the kit's process (records._CONVERTING).
    inside, most = [], []
    convert = records.msgspec.convert

    def watched(*args, **kw):
        inside.append(1)
        most.append(len(inside))
        time.sleep(0.05)
        inside.pop()
        return convert(*args, **kw)

    monkeypatch.setattr(records.msgspec, "convert", watched)
    payload = {"environment": {}, "results": [{"id": "c0", "value": VALUE, "facts": FACTS}]}
    threads = [threading.Thread(target=records.payload, args=(payload,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(most) == 4 and max(most) == 1
