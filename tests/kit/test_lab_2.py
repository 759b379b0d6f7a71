"""Lab 2 through the real pipeline: answers that are right on one device and wrong on eight are caught."""

from notebook_variants import not_passed, reference_code


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


REFERENCE_COLUMN_SUMS = """    tiles = jax.device_put(x, NamedSharding(grid_mesh(), P("rows", "cols")))
    return sum_of_rows(tiles)
"""
# The whole matrix summed where it lies, the sums then placed in the layout the exercise shows: right values,
# right layout, and one device did all the adding.
SUMMED_THEN_PLACED = """    return jax.device_put(jnp.sum(x, axis=0), NamedSharding(grid_mesh(), P("cols")))
"""
# The partial sums of each tile added down each grid column by hand, in a shard_map, defined once per grid.
COLUMN_SUMS_BY_HAND = """    grid = grid_mesh()
    tiles = jax.device_put(x, NamedSharding(grid, P("rows", "cols")))
    return column_sums_by_hand(grid)(tiles)


@functools.cache
def column_sums_by_hand(grid):
    add_down = lambda tile: jax.lax.psum(tile.sum(axis=0), "rows")
    return jax.jit(jax.shard_map(add_down, mesh=grid, in_specs=P("rows", "cols"), out_specs=P("cols")))
"""
REFERENCE_FOLLOW = "    return two_sin_plus_one(x)\n"
# Each device's rows mapped by hand on a line of every device, the program defined once per mesh.
FOLLOW_BY_HAND = """    return rows_by_hand(Mesh(np.array(jax.devices()), ("data",)))(x)


@functools.cache
def rows_by_hand(line):
    each = lambda rows: 2.0 * jnp.sin(rows) + 1.0
    return jax.jit(jax.shard_map(each, mesh=line, in_specs=P("data"), out_specs=P("data")))
"""
WORK_WHERE_THE_TILES_ARE = "test_column_sums_are_added_up_where_the_tiles_are"


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
    guessed = variant(
        2,
        UNJITTED,
        FROM_SHARDING,
        (REFERENCE_SPLIT, WHOLE_THEN_PLACED),
        (REFERENCE_COLUMN_SUMS, SUMMED_THEN_PLACED),
    )
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
    # the sum of the whole matrix, placed in pieces after: the values and the layout pass, the work is named
    for layout in (
        "test_column_sums_are_the_sums_of_each_column",
        "test_column_sums_come_back_partially_replicated",
    ):
        assert by_config["cpu-8"][layout]["status"] == "passed", by_config["cpu-8"][layout]
    assert by_config["cpu-1"][WORK_WHERE_THE_TILES_ARE]["status"] == "passed"
    one_device = by_config["cpu-8"][WORK_WHERE_THE_TILES_ARE]
    assert not one_device["hidden"] and one_device["status"] == "failed", one_device
    assert "each device adds up only the numbers of its own tile" in one_device["message"], one_device[
        "message"
    ]


def test_designs_written_by_hand_with_shard_map_pass_every_test_on_1_8_and_32_devices(
    kit, lab_outcomes, variant
):
    """Each exercise is a goal: the same results written with shard_map, the partial sums added or scattered
    by hand (the scattered pieces in another device order), pass what the reference passes."""
    by_hand = ((REFERENCE_FOLLOW, FOLLOW_BY_HAND), (REFERENCE_COLUMN_SUMS, COLUMN_SUMS_BY_HAND))
    designs = (*by_hand, (REFERENCE_SPLIT, SCATTERED_BY_HAND))
    assert all(old in reference_code(2) for old, _ in designs), "lab 2's reference changed"
    done = kit(
        "lab", "2", "--notebook", str(variant(2, *designs)), "--configs", "cpu-1,cpu-8,cpu-32", "--hidden"
    )
    outcomes = lab_outcomes(2)
    assert set(outcomes) == {"cpu-1", "cpu-8", "cpu-32"}, sorted(outcomes)
    assert WORK_WHERE_THE_TILES_ARE in outcomes["cpu-32"] and WHOLE_ON_A_DEVICE in outcomes["cpu-32"]
    failed = {config: not_passed(o) for config, o in outcomes.items() if not_passed(o)}
    assert done.returncode == 0 and not failed, (failed, done.stdout[-1500:])
