"""Lab 13 end to end: predictions are judged by the programs the run compiles, not by numbers in the tests.

Wrong predictions (an all-gather counted as one block, an all-reduce without its factor of two, the
bfloat16 peak for float32 products) pass on one device, where nothing is sent, and fail their named
tests on eight. And when the given FSDP program changes (it keeps w2 whole and gathers only w1), the
reference's own predictions, made for the program as the lab gives it, fail on eight devices: the
tests read the answer from the compiled program, whatever it is."""

import json

from notebook_variants import failed_on_cpu_8

from labkit.course import catalog

WRONG_PREDICTIONS = [
    ('"all_gather": ring * devices * block', '"all_gather": ring * block'),
    ("tensor = 2 * ring * 4 * batch * d_model", "tensor = ring * 4 * batch * d_model"),
    ("chip.f32_flops / flops_per_row", "chip.bf16_flops / flops_per_row"),
]


def test_wrong_predictions_pass_on_cpu_1_and_fail_their_named_tests_on_cpu_8(kit, lab_outcomes, variant):
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 13, *WRONG_PREDICTIONS)
    assert set(failed) == {
        "test_predict_sent_of_all_gather_matches_the_compiled_program",
        "test_predict_sent_of_all_gather_on_another_shape_matches_the_compiled_program",
        "test_fewer_bytes_at_a_large_batch_matches_the_compiled_programs",
        "test_fewer_bytes_at_the_turning_point_matches_the_compiled_programs",
        "test_fsdp_compute_bound_batch_matches_the_card_of_the_compiled_program",
        "test_fsdp_compute_bound_batch_on_another_mlp_matches_the_card_of_its_compiled_program",
    }, sorted(failed)
    gather = failed["test_predict_sent_of_all_gather_matches_the_compiled_program"]
    assert gather["exercise"] == "predict_sent" and gather["points"] == 1
    assert "the compiled program sends 7168" in gather["message"] and "not one block" in gather["message"]
    fewer = failed["test_fewer_bytes_at_a_large_batch_matches_the_compiled_programs"]
    assert "you answered 'same'" in fewer["message"] and ": 'fsdp'" in fewer["message"], fewer["message"]
    bound = failed["test_fsdp_compute_bound_batch_matches_the_card_of_the_compiled_program"]
    assert "reaches compute = communication at about 9175 " in bound["message"], bound["message"]


# The given FSDP program keeps w2 whole on every device and gathers only w1: it sends half the bytes.
W2_KEPT_WHOLE = [
    ('        w2 = jax.lax.all_gather(w2, "data", axis=0, tiled=True)\n', ""),
    (
        'in_specs=(P("data"),) * 3, out_specs=P("data")',
        'in_specs=(P("data"), P("data"), P()), out_specs=P("data")',
    ),
]


def test_the_answers_follow_the_compiled_program_so_a_changed_program_fails_the_references_predictions(
    kit, lab_outcomes, variant
):
    failed = failed_on_cpu_8(kit, lab_outcomes, variant, 13, *W2_KEPT_WHOLE)
    assert set(failed) == {
        "test_fewer_bytes_at_a_small_batch_matches_the_compiled_programs",
        "test_fewer_bytes_at_the_turning_point_matches_the_compiled_programs",
        "test_fewer_bytes_with_a_wider_hidden_layer_matches_the_compiled_programs",
        "test_fsdp_compute_bound_batch_matches_the_card_of_the_compiled_program",
        "test_fsdp_compute_bound_batch_on_another_mlp_matches_the_card_of_its_compiled_program",
    }, sorted(failed)
    small = failed["test_fewer_bytes_at_a_small_batch_matches_the_compiled_programs"]
    assert "send 7168 bytes per device (fsdp_forward) and 7168 (tensor_forward): 'same'" in small["message"]


def test_the_passes_the_lab_and_the_docs_give_each_precision_are_jaxs_own():
    """Six bfloat16 passes is Precision.HIGHEST; the default is one pass on a TPU and TF32 on an H100: JAX's own
    documentation of Precision says so, and the lab and docs/student.md must not give six to float32 itself."""
    import jax

    doc = " ".join(jax.lax.Precision.__doc__.split())
    assert "HIGHEST: Slowest but most accurate. On TPU: performs float32 computations in 6 bfloat16" in doc
    assert (
        "DEFAULT: Fastest mode, but least accurate. On TPU: performs float32 computations in bfloat16" in doc
    )
    assert "tensorfloat32 if available (e.g. on A100 and H100" in doc
    cells = json.loads(catalog.lab(13).reference.read_text())["cells"]
    lab = " ".join(" ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").split())
    student = " ".join((catalog.ROOT / "docs" / "student.md").read_text().split())
    assert "on a TPU, six bfloat16 passes)" not in lab
    for text in (lab, student):
        assert "six bfloat16 passes on a TPU" in text and "one bfloat16 pass on a TPU" in text
        assert "TF32 on an H100" in text
