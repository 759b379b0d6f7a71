"""Lab 10 end to end: a ppermute that sends backwards is right with one stage only."""


def test_a_ppermute_in_the_wrong_direction_passes_on_cpu_1_and_fails_on_cpu_8(kit, lab_outcomes, variant):
    buggy = variant(10, ("forward = [(i, (i + 1) % n) for i in range(n)]",
                         "forward = [((i + 1) % n, i) for i in range(n)]"))
    done = kit("lab", "10", "--notebook", str(buggy), "--configs", "cpu-1,cpu-8", "--hidden")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = lab_outcomes(10)
    assert outcomes["cpu-1"] and all(o["status"] == "passed" for o in outcomes["cpu-1"].values())
    ring = outcomes["cpu-8"]["test_blocks_move_to_the_next_stage_not_the_previous_one"]
    assert ring["hidden"] and ring["status"] == "failed"
    assert "moved to the previous device, not the next" in ring["message"] and "(source, destination)" in ring["message"]
    pipe = outcomes["cpu-8"]["test_pipeline_sends_activations_forward_through_every_stage"]
    assert pipe["hidden"] and pipe["status"] == "failed"
    assert "activations travelled backwards" in pipe["message"]
