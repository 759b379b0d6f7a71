"""Helpers for the kit's own tests: run the real CLI, and make notebook variants from the reference."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import checks
from labkit.course import configs
from labkit.run import jaxcache, proccgroup

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def build(tmp_path) -> Path:
    """The build folder of this test's runs (LABKIT_BUILD), so that tests never share one."""
    return tmp_path / "build"


@pytest.fixture
def kit_runs() -> list:
    """The CompletedProcess of each `kit` call of this test, in order."""
    return []


@pytest.fixture
def kit(build, kit_runs):
    """Run `python -m labkit ...` as a user would; returns the CompletedProcess (text)."""

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        env = dict(os.environ, COLUMNS="160", NO_COLOR="1", LABKIT_BUILD=str(build))
        done = subprocess.run(
            [sys.executable, "-m", "labkit", *args],
            cwd=ROOT,
            env=env,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        kit_runs.append(done)
        return done

    return run


@pytest.fixture
def lab_report(build, kit_runs):
    """The report.json of the last `lab` run of lab N in this test (where there is none: what the kit said)."""

    def read(lab: int) -> dict:
        report = build / f"lab-{lab}" / "report.json"
        if not report.exists() and kit_runs:
            last = kit_runs[-1]
            pytest.fail(
                f"no {report.name}: the kit's last command ended with exit status {last.returncode} and said\n"
                + said(last.stdout + last.stderr)
            )
        return json.loads(report.read_text())

    return read


FATAL = (
    "Fatal Python error"  # faulthandler's first line (pytest's, in the judge): the crashing thread comes next
)


def said(output: str, size: int = 3000) -> str:
    """What a failed kit command said, for a test's failure: its last `size` characters, and where the process
    crashed, faulthandler's report from its start, whose first thread is the one that crashed."""
    tail = output[-size:]
    at = output.find(FATAL)
    if at < 0 or at >= len(output) - size:
        return tail
    return output[at : at + 2 * size] + "\n[...]\n" + tail


def tpu_only_skip(outcome: dict) -> bool:
    """A test only the TPU compiler judges (a production size, a design XLA:CPU writes like another), skipped on
    a configuration that is not a compile-only TPU one: left out of `lab_outcomes`, as a test that does not run
    there."""
    config = configs.CONFIGS.get(outcome["config"])
    return (
        outcome["status"] == "skipped"
        and checks.TPU_ONLY_SKIP in str(outcome.get("message"))
        and not (config and config.compile_for)
    )


@pytest.fixture
def lab_outcomes(lab_report):
    """The last `lab` run's outcomes of lab N by configuration, then by test: lab_outcomes(3)["cpu-8"][name]."""

    def read(lab: int) -> dict[str, dict[str, dict]]:
        by: dict[str, dict[str, dict]] = {}
        for o in lab_report(lab)["outcomes"]:
            if not tpu_only_skip(o):
                by.setdefault(o["config"], {})[o["test"]] = o
        return by

    return read


@pytest.fixture
def variant(tmp_path):
    """A copy of a reference notebook with text replaced in its code cells: variant(3, old, new)."""

    def make(lab: int, *replacements: tuple[str, str], name: str = "variant") -> Path:
        nb = json.loads((ROOT / "reference" / f"lab-{lab}.ipynb").read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            for old, new in replacements:
                source = source.replace(old, new)
            cell["source"] = source
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps(nb))
        return path

    return make


@pytest.fixture(scope="module")
def outside_tmp():
    """Makes folders outside /tmp (under build/), as a grading output usually is: a run's own /tmp covers
    what lies under /tmp, which would hide a mistake in what else covers the runs' folders."""
    import shutil
    import tempfile

    made = []

    def make(name: str) -> Path:
        try:
            (ROOT / "build").mkdir(exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix=f"test-{name}-", dir=ROOT / "build"))
        except PermissionError:  # a user who may not write the checkout (test_as_another_user): under /tmp
            folder = Path(tempfile.mkdtemp(prefix=f"test-{name}-"))
        made.append(folder)
        return folder

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


# Running the suite in parallel (`make test` runs it in pytest-xdist workers): each test module stays
# whole in one worker, so its module fixtures (a lab's judge run, the sandbox battery) are made once;
# and the modules that start or stop a service of the whole machine (the kit's Docker engine, the
# one-node Slurm, a second user account) say so with `pytestmark = pytest.mark.machine_wide` and go
# to one worker together, which runs them one after another, so no two of them start, use and stop
# such a service under each other.
MACHINE_WIDE = "machine_wide"


# The fast tier (`make test-fast`, what a change runs first): the modules of unit and contract tests,
# which run no lab notebook through a kernel and start no service. Everything else is in `make test`
# only. A new module belongs here when it is quick; docs/development.md says which tier to run when.
FAST = "fast"
FAST_MODULES = frozenset(
    {
        "test_accelerators.py",
        "test_authoring.py",
        "test_checks.py",
        "test_class_at_a_glance.py",
        "test_configs.py",
        "test_deadlines.py",
        "test_failrates.py",
        "test_hints.py",
        "test_infra_schema.py",
        "test_layout.py",
        "test_make_targets.py",
        "test_leaderboard.py",
        "test_overrides.py",
        "test_plaindata.py",
        "test_policy.py",
        "test_public_jax.py",
        "test_roster.py",
        "test_scratch.py",
        "test_similarity.py",
        "test_stretch.py",
        "test_venv_modules.py",
        "test_verify.py",
        "test_lms.py",
        "test_tiers.py",
        "test_canvas.py",
        "test_records.py",
        "test_feedback.py",
        "test_lint.py",
        "test_envnames.py",
        "test_noxfile.py",
        "test_exitcodes.py",
        "test_kernel_client.py",
        "test_judge.py",
    }
)


@pytest.fixture(scope="session", autouse=True)
def one_compile_cache(tmp_path_factory) -> Path | None:
    """The student loop's runs of the session compile through one JAX cache folder per worker, so the many
    runs of each reference and of its variants compile each program once. One per worker: a worker's tests
    run one after another, as one student's `make lab-N` do (as root, each run's warm server hands the
    folder to a user of its own). A test of the cache itself grades (its cache is the grading run's own).
    Returns the folder made here; None where the caller named one (LABKIT_COMPILE_CACHE_DIR)."""
    from labkit import envnames

    if os.environ.get(envnames.COMPILE_CACHE_DIR):
        return None
    folder = tmp_path_factory.getbasetemp() / "jax-cache"
    os.environ[envnames.COMPILE_CACHE_DIR] = str(folder)
    return folder


# What one worker compiled, the others load: between two tests each worker gives the session's pool the
# entries its own cache folder gained (hard links: an entry is a whole file, named by its program, written
# once) and takes those it lacks. The workers' runs never share a folder, so none takes write access from
# another's; an entry is passed on only after the test whose runs wrote it has ended. About a quarter of a
# worker's programs are ones another worker compiles too.
POOL_SUBFOLDERS = ("", jaxcache.TPU_FACTS)  # JAX's entries; the TPU compiler's facts


def _link_missing(source: Path, target: Path) -> None:
    for sub in POOL_SUBFOLDERS:
        try:
            have = set(os.listdir(target / sub))
            offered = os.scandir(source / sub)
        except FileNotFoundError:
            continue
        with offered:
            for entry in offered:
                if (
                    entry.name in have
                    or entry.name.startswith(".")
                    or not entry.is_file(follow_symlinks=False)
                ):
                    continue
                try:
                    os.link(entry.path, target / sub / entry.name, follow_symlinks=False)
                except OSError:  # another worker gave it first; a file system without hard links
                    pass


@pytest.fixture(scope="session")
def compile_pool(one_compile_cache, tmp_path_factory) -> Path | None:
    """The session's pool of compiled programs, beside the workers' own folders (made with them); None
    without pytest-xdist or where the caller named the cache folder."""
    if one_compile_cache is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    pool = tmp_path_factory.getbasetemp().parent / "jax-cache-pool"
    for folder in (pool, one_compile_cache):
        for sub in POOL_SUBFOLDERS:
            (folder / sub).mkdir(parents=True, exist_ok=True)
    return pool


@pytest.fixture(autouse=True)
def compiles_shared_between_workers(request, one_compile_cache, compile_pool):
    """Under pytest-xdist, this worker's cache takes the pool's entries before each test and gives its own
    after it (the fast tier compiles nothing and is left out)."""
    if compile_pool is None or request.node.get_closest_marker(FAST):
        yield
        return
    _link_missing(compile_pool, one_compile_cache)
    yield
    _link_missing(one_compile_cache, compile_pool)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{MACHINE_WIDE}: the module starts, uses or stops a service of the "
        "whole machine (Docker engine, Slurm, user accounts); such modules run "
        "one after another in one worker",
    )
    config.addinivalue_line("markers", f"{FAST}: a unit or contract test of the fast tier (make test-fast)")
    config.stash[_CPU_GROUP] = _own_cpuacct_group()
    config.stash[_MACHINE_AT_START] = _machine_cpu()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in FAST_MODULES:
            item.add_marker(FAST)


@functools.cache
def _machine_wide(path: str) -> bool:
    """Whether the test module at `path` (relative to the root, as in a test's id) is marked machine_wide."""
    try:
        text = (ROOT / path).read_text()
    except OSError:
        return False
    return f"pytestmark = pytest.mark.{MACHINE_WIDE}" in text


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, there only where it is installed
def pytest_xdist_make_scheduler(config, log):
    """Whole modules to workers (xdist's loadfile), the machine-wide ones as one unit; with `--dist load`
    (one module's tests spread over the workers, as `make test-other-jax` runs its one module), xdist's own."""
    from xdist.scheduler import LoadFileScheduling

    if config.getoption("dist") != "loadfile":
        return None

    class ModulesAndMachineWide(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return MACHINE_WIDE if _machine_wide(path) else path

    return ModulesAndMachineWide(config, log)


CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_CPU_GROUP = pytest.StashKey[Path | None]()  # the worker's own cpuacct group, or None
_CPU_AT_START = pytest.StashKey[float]()  # a test's `_cpu_seconds` at its setup


def _own_cpuacct_group() -> Path | None:
    """A cgroup v1 cpuacct group of this worker's own, made and joined (as root, where that hierarchy is mounted),
    so that every process it starts counts, however it is reaped: the kit's runs detach their warm server, and
    bubblewrap's init reaps the notebook's kernel. The kit makes its cgroups in pids, memory and cpu alone, so its
    runs stay in this one. None where it cannot be made: then rusage's reaped children count."""
    own = proccgroup.v1_path("cpuacct")
    if os.geteuid() != 0 or own is None or not (CPUACCT / "cgroup.procs").exists():
        return None
    group = CPUACCT / own.lstrip("/") / f"labkit-tests-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    return group


def pytest_unconfigure(config):
    """This worker back in the cpuacct group it came from, and its own removed once nothing is left in it."""
    group = config.stash.get(_CPU_GROUP, None)
    if group is not None:
        try:
            (group.parent / "cgroup.procs").write_text(str(os.getpid()))
            group.rmdir()
        except OSError:
            pass  # a process it started still runs there: the group goes with the machine


def _cpu_seconds(config) -> float:
    """CPU seconds used so far by this worker and what it started: its cpuacct group's, where it has one; else its
    own and its reaped children's (the kit's runs, their kernels and verifiers, where they were waited for)."""
    group = config.stash.get(_CPU_GROUP, None)
    if group is not None:
        try:
            return int((group / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            pass
    import resource

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_START] = _cpu_seconds(item.config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds (setup, call and teardown, a module fixture's in its first test) as the property
    `cpu_seconds` of build/test-kit.xml: with more workers than cores, a test's wall time is mostly its wait for a
    core, and the CPU it used is what a shorter suite must cut. A service's own processes (dockerd, slurmd) and a
    child still running when the test ends are not counted."""
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        item.user_properties.append(
            ("cpu_seconds", f"{_cpu_seconds(item.config) - item.stash[_CPU_AT_START]:.1f}")
        )
    return (yield)


_CPU_BY_MODULE: dict[str, float] = {}
_MACHINE_AT_START = pytest.StashKey[tuple[float, float] | None]()  # the machine's (busy, idle) at the start


def _machine_cpu() -> tuple[float, float] | None:
    """The whole machine's CPU seconds so far, every core's, (busy, idle): Linux's /proc/stat; None elsewhere."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = fields
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, (idle + iowait) / tick


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == "cpu_seconds":
                module = report.nodeid.split("::", 1)[0]
                _CPU_BY_MODULE[module] = _CPU_BY_MODULE.get(module, 0.0) + float(value)


def pytest_terminal_summary(terminalreporter):
    """The modules that used the most CPU, what the suite's length on a machine of few cores follows."""
    if not _CPU_BY_MODULE:
        return
    total = sum(_CPU_BY_MODULE.values())
    terminalreporter.section(f"CPU seconds by test module (all: {total:.0f} s)")
    for module, seconds in sorted(_CPU_BY_MODULE.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.0f} s  {100 * seconds / max(total, 1e-9):4.1f}%  {module}")
    # Whether the run was bound by the processors: where they were busy all along, it lasts its CPU over its cores,
    # however the tests are spread, and only less work makes it shorter.
    start, now = terminalreporter.config.stash.get(_MACHINE_AT_START, None), _machine_cpu()
    if start is not None and now is not None and now[0] + now[1] > start[0] + start[1]:
        busy, idle = now[0] - start[0], now[1] - start[1]
        terminalreporter.write_line(
            f"the machine's {os.cpu_count()} CPUs were busy {100 * busy / (busy + idle):.1f}% of the run: "
            f"{busy:.0f} CPU-s, {total:.0f} of them counted by its tests (the rest: what ran beside it, services, "
            "pytest itself)"
        )
