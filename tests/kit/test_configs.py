from labkit.course import configs
from labkit.run import allowance, execute


def test_cpu_configs_set_the_device_count_before_jax_starts():
    assert configs.CONFIGS["cpu-1"].env["JAX_NUM_CPU_DEVICES"] == "1"
    assert configs.CONFIGS["cpu-8"].env["JAX_NUM_CPU_DEVICES"] == "8"
    assert configs.CONFIGS["cpu-8"].devices == 8


def test_a_run_never_inherits_the_callers_device_variables():
    env = configs.CONFIGS["cpu-1"].environment({"JAX_NUM_CPU_DEVICES": "8", "XLA_FLAGS": "--x", "HOME": "/h"})
    assert env["JAX_NUM_CPU_DEVICES"] == "1"
    assert env["XLA_FLAGS"] == configs.CPU_COMPILE_FLAGS  # the configuration's, not the caller's
    assert env["HOME"] == "/h"


def test_simulated_cpu_devices_compile_without_llvm_optimisations_and_real_accelerators_with_xlas_defaults():
    # A lab's programs are small: on CPU, compiling them is most of a run (configs.CPU_COMPILE_FLAGS says why)
    for name in ("cpu-1", "cpu-8", "cpu-2x4", "cpu-4x2", "cpu-32", "cpu-3", "cpu-3x2", "v5e-8", "v5e-256"):
        assert configs.parse(name)[0].env["XLA_FLAGS"] == "--xla_backend_optimization_level=0", name
    for name in ("tpu", "gpu"):
        assert "XLA_FLAGS" not in configs.CONFIGS[name].environment({"XLA_FLAGS": "--x"}), name


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


# ----------------------------------------------------------------------------------------
# Pod sizes and accelerators.
# ----------------------------------------------------------------------------------------


def test_every_pod_size_has_a_cpu_configuration_with_that_many_devices():
    for n in configs.POD_SIZES:
        config = configs.parse(f"cpu-{n}")[0]
        assert config.devices == n and config.env["JAX_NUM_CPU_DEVICES"] == str(n) and config.processes == 1


def test_cpu_4x2_is_four_processes_of_two_devices_each():
    config = configs.parse("cpu-4x2")[0]
    assert (config.processes, config.devices, config.env["JAX_NUM_CPU_DEVICES"]) == (4, 8, "2")
    joined = config.process_env(3, "127.0.0.1:5000")
    assert joined["LABKIT_NUM_PROCESSES"] == "4" and joined["LABKIT_PROCESS_ID"] == "3"
    assert joined["LABKIT_LOCAL_DEVICE_IDS"] == "0,1"


def test_any_cpu_count_is_accepted_by_name():
    assert configs.parse("cpu-3")[0].devices == 3
    assert configs.parse("cpu-3x2")[0].processes == 3


def test_the_new_configurations_run_only_when_named():
    named_only = ("gpu", "cpu-2", "cpu-4", "cpu-16", "cpu-32", "cpu-4x2")
    assert not set(named_only) & set(configs.DEFAULT)
    assert not set(named_only) & {c.name for c in configs.graded_by_default()}
    assert "cpu-2x4" in {c.name for c in configs.graded_by_default()}


def test_an_unknown_name_lists_every_configuration_that_exists():
    try:
        configs.parse("cpu-0")
    except configs.UnknownConfig as e:
        for name in ("cpu-1", "cpu-8", "cpu-2x4", "tpu", "gpu", "cpu-16", "cpu-32", "cpu-4x2"):
            assert name in str(e)
    else:
        raise AssertionError("cpu-0 was accepted")


def test_gpu_uses_jax_cuda_backend_with_full_float32_products():
    env = configs.CONFIGS["gpu"].environment({"JAX_DEFAULT_MATMUL_PRECISION": "bfloat16"})
    assert env["JAX_PLATFORMS"] == "cuda" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"
    assert configs.CONFIGS["gpu"].devices is None  # every GPU the machine has


def test_tpu_computes_float32_products_in_full_float32():
    assert configs.CONFIGS["tpu"].environment({})["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"


def test_every_tpu_judge_compiles_float32_products_at_one_precision_the_real_tpus():
    # The compile-only configurations export at the precision the `tpu` configuration runs at, so libtpu compiles
    # the program a TPU would run (six bfloat16 passes, float32 operands moved as float32), not one bf16 pass.
    judges = [c for c in configs.CONFIGS.values() if c.compile_for or c.platform == "tpu"]
    assert {c.name for c in judges} >= {"tpu", "v5e-8", "v6e-8", "v5p-8", "v5e-256"}
    for c in judges:
        env = c.environment({"JAX_DEFAULT_MATMUL_PRECISION": "bfloat16"})
        assert env["JAX_DEFAULT_MATMUL_PRECISION"] == configs.ACCELERATOR_MATMUL_PRECISION == "highest", (
            c.name
        )


def test_a_configuration_of_many_devices_raises_the_limits_it_cannot_start_under_and_no_other():
    # 256 simulated devices: about 1,040 threads and 10 GiB of address space in the notebook's process and the
    # verifier's; under the default 1,024 processes and 4 GiB every run died starting a thread.
    v5e_256 = configs.by_name("v5e-256").run_limits(allowance.DEFAULT_LIMITS)
    # lab 14's verifier there peaked at 12.1 GiB of address space, a wasteful design's notebook at 14.3 GiB
    assert v5e_256.processes >= 1536 and v5e_256.memory >= 15 << 30
    assert (
        v5e_256.disk == allowance.DEFAULT_LIMITS.disk
        and v5e_256.isolation == allowance.DEFAULT_LIMITS.isolation
    )
    more = allowance.Limits(memory=32 << 30, processes=8192)
    assert configs.by_name("v5e-256").run_limits(more) == more  # never lowered
    # the pod sizes keep whatever they are given, a test's small limits included
    small = allowance.Limits(memory=1 << 30, processes=64)
    for name in ("cpu-1", "cpu-8", "cpu-32", "cpu-4x2", "v5e-8", "v6e-8", "v5p-8", "tpu", "gpu"):
        assert configs.by_name(name).run_limits(small) == small, name


def test_a_configuration_of_many_devices_gives_a_notebook_the_time_it_needs_to_compile_and_no_other():
    # on two shared cores a lab's notebook took up to 110 s on v5e-256, the verifier up to 300 s: past the default
    assert configs.by_name("v5e-256").run_timeout(execute.DEFAULT_TIMEOUT) >= 500
    assert configs.by_name("v5e-256").run_timeout(3600) == 3600  # never lowered
    for name in ("cpu-1", "cpu-8", "cpu-32", "cpu-4x2", "v5e-8", "v6e-8", "v5p-8", "tpu", "gpu"):
        assert configs.by_name(name).run_timeout(5) == 5, name


def test_cpu_runs_leave_matmul_precision_at_jax_default():
    env = configs.CONFIGS["cpu-8"].environment({"JAX_DEFAULT_MATMUL_PRECISION": "bfloat16"})
    assert "JAX_DEFAULT_MATMUL_PRECISION" not in env


def test_gpu_is_unavailable_here_with_a_reason():
    ok, reason = configs.CONFIGS["gpu"].availability()
    assert not ok and "no NVIDIA GPU" in reason


def test_gpu_without_jax_cuda_plugin_says_how_to_install_it(monkeypatch):
    from labkit.machine import accelerators

    monkeypatch.setattr(accelerators, "nvidia_gpus", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(accelerators, "cuda_plugin", lambda: None)
    ok, reason = configs.CONFIGS["gpu"].availability()
    assert not ok and "make setup EXTRAS=cuda" in reason


def test_gpu_with_a_device_and_the_plugin_is_available(monkeypatch):
    from labkit.machine import accelerators

    monkeypatch.setattr(accelerators, "nvidia_gpus", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(accelerators, "cuda_plugin", lambda: "jax_cuda12_plugin")
    assert configs.CONFIGS["gpu"].availability() == (True, "")


def test_make_lab_on_gpu_without_one_is_skipped_with_the_reason_not_an_error(kit, lab_report):
    done = kit("lab", "3", "--notebook", "reference/lab-3.ipynb", "--configs", "gpu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIP  gpu skipped (no NVIDIA GPU on this machine" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert lab_report(3)["runs"]["gpu"]["status"] == "skipped"


def test_make_lab_with_an_unknown_configuration_lists_those_that_exist(kit):
    done = kit("lab", "3", "--configs", "gpu-2")
    assert done.returncode == 2
    assert (
        "unknown device configuration 'gpu-2'" in done.stderr
        and "cpu-4x2" in done.stderr
        and "gpu" in done.stderr
    )
