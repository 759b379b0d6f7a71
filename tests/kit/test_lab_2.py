"""Lab 2 through the real pipeline: answers that are right on one device and wrong on eight are caught."""

from notebook_variants import failures_by_config


def test_lowered_hlo_and_a_missing_constraint_pass_on_cpu_1_and_fail_the_hidden_tests_on_cpu_8(
    kit, lab_outcomes, variant
):
    buggy = variant(
        2,
        (".lower(x).compile().as_text()", ".lower(x).as_text()"),
        (
            'return jax.lax.with_sharding_constraint(total, NamedSharding(grid, P(("rows", "cols"))))',
            "return total",
        ),
    )
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
    assert (
        "with_sharding_constraint" in unconstrained["message"]
        and "partially replicated" in unconstrained["message"]
    )
    assert by_config["cpu-8"]["test_column_sums_of_a_wide_random_matrix"]["status"] == "passed"


# -- column_sums_split: one piece of the sums per device, never every sum whole on a device -------------

REFERENCE_SPLIT = """        return jax.lax.with_sharding_constraint(total, NamedSharding(grid, P(("rows", "cols"))))

    return sums
"""

# The sums made whole on every device inside the jit (an all-reduce of the columns), placed in pieces after it.
WHOLE_THEN_PLACED = """        return jax.lax.with_sharding_constraint(total, NamedSharding(grid, P()))

    return lambda tiles: jax.device_put(sums(tiles), NamedSharding(grid, P(("rows", "cols"))))
"""

# Each device's partial sums reduce-scattered down its grid column by hand: pieces in another device order.
SCATTERED_BY_HAND = """        return total

    def per_device(tile):
        return jax.lax.psum_scatter(tile.sum(axis=0), "rows", scatter_dimension=0, tiled=True)

    return jax.jit(jax.shard_map(per_device, mesh=grid, in_specs=P("rows", "cols"), out_specs=P(("cols", "rows"))))
"""

WHOLE_ON_A_DEVICE = "test_column_sums_split_never_makes_every_sum_whole_on_a_device"


# follow_data without jit; collectives_of_sum guessed from the placement instead of read from the program; the
# column sums made whole on every device, then placed in pieces.
UNJITTED = ("    return two_sin_plus_one(x)\n", "    return 2.0 * jnp.sin(x) + 1.0\n")
GUESS = (
    'return ["all-reduce"] if len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated else []'
)
FROM_SHARDING = ("text = jax.jit(jnp.sum).lower(x).compile().as_text()", GUESS)


def test_follow_data_without_jit_fails_publicly_and_a_guess_and_whole_column_sums_fail_hidden_tests_on_cpu_8(
    kit, lab_outcomes, variant
):
    guessed = variant(2, UNJITTED, FROM_SHARDING, (REFERENCE_SPLIT, WHOLE_THEN_PLACED))
    done = kit("lab", "2", "--notebook", str(guessed), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1
    by_config = lab_outcomes(2)
    for config in ("cpu-1", "cpu-8"):
        unjitted = by_config[config]["test_follow_data_does_its_work_inside_jit"]
        assert unjitted["status"] == "failed" and not unjitted["hidden"], unjitted
        assert "op by op, outside any jax.jit" in unjitted["message"] and "@jax.jit" in unjitted["message"]
        assert by_config[config]["test_follow_data_computes_two_sin_plus_one"]["status"] == "passed"
    public_guesses = [
        o for name, o in by_config["cpu-8"].items() if name.startswith("test_collectives_of_a_sum")
    ]
    assert public_guesses and all(o["status"] == "passed" for o in public_guesses), public_guesses
    empty = "test_collectives_of_an_empty_array_split_by_rows_come_from_the_program_not_the_placement"
    assert by_config["cpu-1"][empty]["status"] == "passed"
    caught = by_config["cpu-8"][empty]
    assert caught["hidden"] and caught["status"] == "failed", caught
    assert "whatever x.sharding says" in caught["message"]
    whole = by_config["cpu-8"][WHOLE_ON_A_DEVICE]
    assert by_config["cpu-1"][WHOLE_ON_A_DEVICE]["status"] == "passed"
    assert whole["hidden"] and whole["status"] == "failed", whole
    assert "hands each device all 32 column sums" in whole["message"], whole["message"]
    assert by_config["cpu-8"]["test_column_sums_split_is_not_left_partially_replicated"]["status"] == "passed"


def test_column_sums_reduce_scattered_by_hand_in_another_device_order_pass_every_test(
    kit, lab_outcomes, variant
):
    ran = failures_by_config(
        kit, lab_outcomes, variant, 2, REFERENCE_SPLIT, SCATTERED_BY_HAND, {WHOLE_ON_A_DEVICE}
    )
    assert ran["returncode"] == 0 and not ran["cpu-1"] and not ran["cpu-8"], ran
