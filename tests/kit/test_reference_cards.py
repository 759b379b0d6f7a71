"""The reference's cards, recorded beside each lab's public tests, are those of the calls the student's card shows:
a public test that changes its inputs changes its call's id, and a card recorded for the old id is never shown
beside the student's (lab 14 printed none for any design). Record them again with
`labkit lab N --notebook reference/lab-N.ipynb --configs cpu-8 --record-costs`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import cost
from labkit.course import catalog
from labkit.judge import callplan, judge

ROOT = Path(__file__).resolve().parents[2]


def shown_calls(lab: catalog.Lab) -> dict[str, str]:
    """id -> function of the calls `cost.cards` shows a card for on a CPU run: the first examined call of each
    function among the public tests (a production-size call is only compiled for a TPU, and has no CPU card)."""
    shown: dict[str, str] = {}
    kinds: set[tuple] = set()
    for call in judge.collect_calls(lab.test_dirs(hidden=False)):
        kind = (call.get("function"), callplan.compile_only(call))
        if call.get("facts") and kind not in kinds:
            kinds.add(kind)
            if not kind[1]:
                shown[call["id"]] = call["function"]
    return shown


@pytest.mark.parametrize(
    "lab", [lab for lab in catalog.labs() if lab.public_tests.is_dir()], ids=lambda lab: f"lab-{lab.number}"
)
def test_every_card_a_student_sees_has_the_references_beside_it_and_none_is_left_over(lab):
    shown = shown_calls(lab)
    path = lab.public_tests / cost.REFERENCE_FILE
    recorded = json.loads(path.read_text()) if path.exists() else {}
    assert {cid: f for cid, f in shown.items() if cid not in recorded} == {}, f"no reference card in {path}"
    assert [cid for cid in recorded if cid not in shown] == [], f"cards of calls no test makes in {path}"


IDS = """
import json, sys
from labkit.course import catalog
from labkit.judge import judge
ids = sorted({c["id"] for lab in catalog.labs() for hidden in (False, True) for c in judge.collect_calls(lab.test_dirs(hidden=hidden))})
json.dump(ids, sys.stdout)
"""


def test_every_calls_id_is_the_same_on_a_processor_without_numpys_wider_instructions():
    # A call's id is its inputs' bytes: an input made with numpy's float32 power, sin or cos (rounded otherwise by
    # its AVX-512 code than by its plain one) had another id on another machine, so lab 6's recorded card was never
    # shown there. The ids with each of numpy's dispatched instruction sets turned off must be this machine's.
    from numpy._core import _multiarray_umath

    # only those this processor has: numpy refuses to import where one turned off is not supported
    features = _multiarray_umath.__cpu_features__
    wider = " ".join(f for f in _multiarray_umath.__cpu_dispatch__ if features.get(f))
    ids = {}
    for name, off in (("this processor's", ""), ("the baseline's", wider)):
        env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
        done = subprocess.run(
            [sys.executable, "-c", IDS],
            env=env | ({"NPY_DISABLE_CPU_FEATURES": off} if off else {}),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        ids[name] = set(json.loads(done.stdout))
    mine, baseline = ids.values()
    assert mine == baseline, (
        f"ids that differ (turned off: {wider or 'nothing: this numpy dispatches none'}): "
        + str(sorted(mine ^ baseline))
    )
