"""Lab 2 through the real pipeline: answers that are right on one device and wrong on eight are caught."""


def test_lowered_hlo_and_a_missing_constraint_pass_on_cpu_1_and_fail_the_hidden_tests_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(2, (".lower(x).compile().as_text()", ".lower(x).as_text()"),
                    ("return jax.lax.with_sharding_constraint(total, NamedSharding(grid, P((\"rows\", \"cols\"))))",
                     "return total"))
    done = kit("lab", "2", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1
    by_config = lab_outcomes(2)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}

    lowered = by_config["cpu-8"]["test_collectives_are_read_from_the_compiled_not_the_lowered_program"]
    assert lowered["status"] == "failed" and lowered["hidden"]
    assert "expected ['all-reduce'] on 8 device(s), got []" in lowered["message"]
    assert ".compile().as_text()" in lowered["message"]

    unconstrained = by_config["cpu-8"]["test_column_sums_split_is_not_left_partially_replicated"]
    assert unconstrained["status"] == "failed" and unconstrained["hidden"]
    assert "with_sharding_constraint" in unconstrained["message"] and "partially replicated" in unconstrained["message"]
    assert by_config["cpu-8"]["test_column_sums_of_a_wide_random_matrix"]["status"] == "passed"
