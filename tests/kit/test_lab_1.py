"""Lab 1 through the real pipeline: a placement that is right on one device and wrong on eight is caught."""


def test_a_copy_on_a_mesh_of_one_device_passes_on_cpu_1_and_fails_the_hidden_test_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(1, ("everywhere = NamedSharding(Mesh(np.array(jax.devices())",
                        "everywhere = NamedSharding(Mesh(np.array(jax.devices()[:1])"))
    done = kit("lab", "1", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1
    by_config = lab_outcomes(1)
    assert {o["status"] for o in by_config["cpu-1"].values()} == {"passed"}
    caught = by_config["cpu-8"]["test_replicate_gives_every_device_a_copy_not_only_device_0"]
    assert caught["status"] == "failed" and caught["hidden"]
    assert "full copy on each of 8 devices" in caught["message"] and "jax.devices()[:1]" in caught["message"]
    assert by_config["cpu-8"]["test_shard_rows_of_a_tall_random_matrix"]["status"] == "passed"
