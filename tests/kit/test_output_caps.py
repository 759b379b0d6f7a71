"""What one call may return grows with the pod past 32 devices, as inputs grown with it do (`program.output_caps`).

On 1 to 32 devices a call returns at most MAX_OUTPUT_ELEMENTS values (MAX_OUTPUT_BYTES bytes); on a pod of 256,
where `checks.by_devices` makes an input up to eight times the size written, eight times that; the run's calls
together never more than MAX_RUN_ELEMENTS on any pod.
"""

from __future__ import annotations

import numpy as np
import pytest

from labkit.judge import program

# Lab 14's step on a model dimension of 128 (the 'model' axis of a 2 x 128 grid on 256 devices), hidden 256:
# the parameters and their momentum (2 x 131,072 values) and the loss.
STEP = [np.zeros((128, 128), np.float32)] * 4 + [
    np.zeros((128, 256), np.float32),
    np.zeros((256, 128), np.float32),
]
LAB_14_ON_256 = (STEP, STEP, np.zeros((), np.float32))


def test_one_calls_cap_is_the_same_on_1_to_32_devices_and_grows_with_a_larger_pod():
    for devices in (1, 2, 4, 8, 16, 32):
        assert program.output_caps(devices) == (program.MAX_OUTPUT_ELEMENTS, program.MAX_OUTPUT_BYTES)
    assert program.output_caps(256) == (8 * program.MAX_OUTPUT_ELEMENTS, 8 * program.MAX_OUTPUT_BYTES)
    assert program.output_caps(64) == (2 * program.MAX_OUTPUT_ELEMENTS, 2 * program.MAX_OUTPUT_BYTES)
    assert program.output_caps(256)[0] == program.MAX_RUN_ELEMENTS  # never more than the whole run's


def test_a_call_one_value_over_the_cap_on_8_devices_is_read_on_256():
    assert sum(a.size for a in LAB_14_ON_256[0]) * 2 + 1 == program.MAX_OUTPUT_ELEMENTS + 1
    with pytest.raises(program.TooLarge, match=f"the kit reads at most {program.MAX_OUTPUT_ELEMENTS} values"):
        program.bounded(LAB_14_ON_256, [program.MAX_RUN_ELEMENTS], devices=8)
    budget = [program.MAX_RUN_ELEMENTS]
    program.bounded(LAB_14_ON_256, budget, devices=256)
    assert budget == [program.MAX_RUN_ELEMENTS - program.MAX_OUTPUT_ELEMENTS - 1]  # counted against the run


def test_the_runs_total_is_the_same_on_every_pod():
    budget = [program.MAX_RUN_ELEMENTS]
    for _ in range(7):  # 7 x 262,145 values: all but a few thousand of the run's 2,097,152
        program.bounded(LAB_14_ON_256, budget, devices=256)
    with pytest.raises(program.TooLarge, match=f"more than {program.MAX_RUN_ELEMENTS} values together"):
        program.bounded(LAB_14_ON_256, budget, devices=256)
    too_many = np.zeros(8 * program.MAX_OUTPUT_ELEMENTS + 1, np.float32)
    with pytest.raises(program.TooLarge, match="from one call"):
        program.bounded(too_many, [program.MAX_RUN_ELEMENTS], devices=256)
