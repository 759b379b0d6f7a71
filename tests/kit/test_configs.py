from labkit import configs


def test_cpu_configs_set_the_device_count_before_jax_starts():
    assert configs.CONFIGS["cpu-1"].env["JAX_NUM_CPU_DEVICES"] == "1"
    assert configs.CONFIGS["cpu-8"].env["JAX_NUM_CPU_DEVICES"] == "8"
    assert configs.CONFIGS["cpu-8"].devices == 8


def test_a_run_never_inherits_the_callers_device_variables():
    env = configs.CONFIGS["cpu-1"].environment({"JAX_NUM_CPU_DEVICES": "8", "XLA_FLAGS": "--x", "HOME": "/h"})
    assert env["JAX_NUM_CPU_DEVICES"] == "1"
    assert "XLA_FLAGS" not in env
    assert env["HOME"] == "/h"


def test_tpu_is_unavailable_here_with_a_reason():
    ok, reason = configs.CONFIGS["tpu"].availability()
    assert not ok and "TPU" in reason


def test_parse_keeps_order_and_drops_repeats():
    assert [c.name for c in configs.parse("cpu-8,cpu-1,cpu-8")] == ["cpu-8", "cpu-1"]


def test_parse_defaults_to_every_configuration():
    assert [c.name for c in configs.parse(None)] == list(configs.DEFAULT)


def test_parse_names_the_unknown_configuration_and_lists_the_known_ones():
    try:
        configs.parse("cpu-1,gpu-4")
    except configs.UnknownConfig as e:
        assert "'gpu-4'" in str(e) and "cpu-8" in str(e)
    else:
        raise AssertionError("gpu-4 was accepted")
