"""The reference's cards, recorded beside each lab's public tests, are those of the calls the student's card shows:
a public test that changes its inputs changes its call's id, and a card recorded for the old id is never shown
beside the student's (lab 14 printed none for any design). Record them again with
`labkit lab N --notebook reference/lab-N.ipynb --configs cpu-8 --record-costs`."""

import json

import pytest

from labkit import cost
from labkit.course import catalog
from labkit.judge import callplan, judge


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
