"""The Gradescope autograder: the zip `make gradescope LAB=N` builds, results.json, and one run as Gradescope runs it.

results.json is tested on outcomes written by hand; the zip is unpacked into a folder laid out
as Gradescope lays out /autograder and its run_autograder is run there once (AUTOGRADER_ROOT),
with this checkout's environment standing in for what setup.sh installs on Gradescope's image.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import doc_commands
import jsonschema
import pytest
from notebook_variants import LAB_3_TESTS

from labkit.grading.publish import gradescope
from labkit.grading.state import policy

ROOT = Path(__file__).resolve().parents[2]
PY = ROOT / ".venv" / "bin" / "python"
ONE_DEVICE_MESH = (
    'Mesh(np.array(jax.devices()), ("data",))\n    double',
    'Mesh(np.array(jax.devices()[:1]), ("data",))\n    double',
)


def o(test, config, status, message="", hidden=False, points=1):
    return {
        "test": f"test_{test}",
        "exercise": "f",
        "run": config,
        "config": config,
        "status": status,
        "message": message,
        "hidden": hidden,
        "file": "t.py",
        "points": points,
    }


OUTCOMES = [
    o("doubles", "cpu-1", "passed", points=2),
    o("doubles", "cpu-8", "passed", points=2),
    o("split", "cpu-1", "passed"),
    o("split", "cpu-8", "failed", "lives on 1 of 8 devices"),
    o("block", "cpu-1", "passed", hidden=True),
    o("block", "cpu-8", "failed", "SECRET", hidden=True),
]


@pytest.fixture
def results():
    return gradescope.results_json(OUTCOMES, ["cpu-1", "cpu-8"], policy.Policy(), [])


def case(results, name):
    return next(t for t in results["tests"] if t["name"] == name)


def test_each_test_is_a_case_worth_its_points(results):
    assert [(t["name"], t["max_score"]) for t in results["tests"]] == [
        ("doubles", 2),
        ("split", 1),
        ("block (hidden)", 1),
    ]


def test_a_case_scores_by_the_policy_rule_over_the_configurations(results):
    assert (case(results, "doubles")["score"], case(results, "split")["score"]) == (2, 0)
    assert results["score"] == 2
    anyone = gradescope.results_json(OUTCOMES, ["cpu-1", "cpu-8"], policy.Policy(combine="any"), [])
    assert anyone["score"] == 4


def test_a_test_that_runs_on_no_configuration_graded_is_worth_nothing_and_says_why():
    # a test at a production size runs on the compile-only TPU configurations alone: Gradescope grades on CPU
    why = "at a production size, judged by the TPU compiler alone: it runs on the compile-only TPU configurations"
    at_size = [o("fits", c, "skipped", why, points=3) for c in ("cpu-1", "cpu-8")]
    results = gradescope.results_json(OUTCOMES[:2] + at_size, ["cpu-1", "cpu-8"], policy.Policy(), [])
    assert case(results, "fits") | {"output": ""} == case(results, "fits") | {
        "score": 0,
        "max_score": 0,
        "status": "passed",
        "output": "",
    }
    assert case(results, "fits")["output"] == f"cpu-1: skipped: {why}\ncpu-8: skipped: {why}"
    assert results["score"] == sum(t["max_score"] for t in results["tests"]) == 2
    gradescope.validate(results)


def test_public_cases_are_visible_and_hidden_ones_after_published(results):
    assert case(results, "split")["visibility"] == "visible"
    assert case(results, "block (hidden)")["visibility"] == "after_published"


def test_the_multi_device_message_is_in_the_cases_output_and_a_hidden_message_is_not(results):
    assert case(results, "split")["output"] == "cpu-1: passed\ncpu-8: failed: lives on 1 of 8 devices"
    assert "SECRET" not in json.dumps(results)
    assert case(results, "block (hidden)")["output"] == "cpu-1: passed\ncpu-8: failed"


def test_results_follow_the_schema_and_the_schema_can_refuse(results):
    gradescope.validate(results)
    jsonschema.Draft202012Validator.check_schema(gradescope.RESULTS_SCHEMA)
    broken = json.loads(json.dumps(results))
    del broken["tests"][0]["max_score"]
    with pytest.raises(gradescope.GradescopeError, match="max_score"):
        gradescope.validate(broken)
    broken = json.loads(json.dumps(results))
    broken["tests"][0]["visibility"] = "sometimes"
    with pytest.raises(gradescope.GradescopeError):
        gradescope.validate(broken)


def test_a_submission_is_found_by_its_name_or_as_the_only_notebook(tmp_path):
    from labkit.course import catalog

    lab = catalog.lab(3)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.ipynb").write_text("{}")
    assert gradescope.find_notebook(tmp_path / "a", lab)[0].name == "mine.ipynb"
    (tmp_path / "a" / "other.ipynb").write_text("{}")
    assert "2 notebooks were handed in" in gradescope.find_notebook(tmp_path / "a", lab)[1]
    (tmp_path / "a" / "lab-3.ipynb").write_text("{}")
    assert gradescope.find_notebook(tmp_path / "a", lab)[0].name == "lab-3.ipynb"
    (tmp_path / "b").mkdir()
    assert "no notebook was handed in" in gradescope.find_notebook(tmp_path / "b", lab)[1]


# ----------------------------------------------------------------------------------------
# The zip, and one run of it laid out as on Gradescope.
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return gradescope.build(3, tmp_path_factory.mktemp("gs") / "lab-3.zip")


def test_the_zip_has_setup_run_autograder_the_kit_and_the_hidden_tests_but_no_solution(built):
    with zipfile.ZipFile(built) as z:
        names = z.namelist()
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert {
        "setup.sh",
        "run_autograder",
        "pyproject.toml",
        "uv.lock",
        "labkit/grading/grade.py",
        "tests/policy.toml",
        "labs/lab-3.ipynb",
    } <= set(names)
    assert any(n.startswith("tests/hidden/lab_3/") for n in names)
    assert any(n.startswith("tests/public/lab_3/") for n in names)
    assert not any(n.startswith("reference/") or "lab_4" in n for n in names)
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR


def test_setup_sh_installs_the_uv_the_makefile_pins(built):
    pinned = next(
        line.split(":=")[1].strip()
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line.startswith("UV_VERSION :=")
    )
    with zipfile.ZipFile(built) as z:
        setup = z.read("setup.sh").decode()
    assert f'pip" install -q uv=={pinned}\n' in setup, setup


def test_the_same_kit_builds_the_same_zip(built, tmp_path):
    assert gradescope.build(3, tmp_path / "again.zip").read_bytes() == built.read_bytes()


def test_make_gradescope_writes_the_zip_under_build_gradescope():
    target = ROOT / "build" / "gradescope" / "lab-3.zip"
    target.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "-c", doc_commands.typed("make gradescope LAB=3")],
        cwd=ROOT,
        env=doc_commands.user_environment(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(target) as z:
        assert "run_autograder" in z.namelist()


def test_make_gradescope_without_a_lab_says_how():
    done = subprocess.run(
        ["make", "-s", "gradescope"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0 and "make gradescope LAB=N" in done.stderr


def _one_device_notebook() -> str:
    """The reference with its mesh on one device: right on cpu-1, wrong on eight devices."""
    nb = json.loads((ROOT / "reference" / "lab-3.ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["source"] = "".join(cell["source"]).replace(*ONE_DEVICE_MESH)
    return json.dumps(nb)


def user_environment(root: Path) -> dict[str, str]:
    """What Gradescope's container gives the scripts: no variable of the kit's; only the root moved (a test
    cannot write /autograder), which the scripts read as Gradescope's own layout otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_") and k not in ("VIRTUAL_ENV",)}
    return env | {"AUTOGRADER_ROOT": str(root)}


def unpacked(zip_path: Path, root: Path) -> Path:
    """ROOT laid out as Gradescope lays out /autograder: the zip in source/, submission/ and results/."""
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            z.extract(info, root / "source")
            (root / "source" / info.filename).chmod(info.external_attr >> 16 & 0o777)
    (root / "submission").mkdir(parents=True)
    (root / "results").mkdir()
    return root


@pytest.fixture(scope="module")
def autograder(built, tmp_path_factory) -> Path:
    """An autograder set up by its own setup.sh, as Gradescope does once (the kit's environment from the lock;
    Python 3.11 or newer is on this machine, so uv installs none)."""
    root = unpacked(built, tmp_path_factory.mktemp("gradescope") / "autograder")
    done = subprocess.run(
        ["bash", str(root / "source" / "setup.sh")],
        cwd=root / "source",
        env=user_environment(root),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return root


def run_as_gradescope(root: Path) -> subprocess.CompletedProcess:
    """Gradescope copies run_autograder to the root and runs it from there."""
    (root / "results" / "results.json").unlink(missing_ok=True)
    script = root / "run_autograder"
    script.write_bytes((root / "source" / "run_autograder").read_bytes())
    script.chmod(0o755)
    return subprocess.run(
        [str(script)],
        cwd=root,
        env=user_environment(root),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_setup_sh_makes_the_environment_in_source(autograder):
    assert (autograder / "source" / ".venv" / "bin" / "python").exists()


def test_setup_sh_compiles_the_environment_so_no_run_compiles_jax_from_its_sources(autograder):
    # Runs see the environment read-only (the sandbox): bytecode not written at set-up is never written, and every
    # kernel of every configuration compiled JAX from its sources again, which on a fresh, busy machine took the
    # runs past their time limit (the case outputs then read "cpu-8: error" or a timeout, not "cpu-8: failed").
    (jax,) = (autograder / "source" / ".venv" / "lib").glob("python3.*/site-packages/jax")
    compiled = {p.name.split(".")[0] for p in (jax / "__pycache__").glob("*.pyc")}
    assert {"__init__", "numpy"} <= compiled | {
        p.name for p in jax.iterdir() if (p / "__pycache__").is_dir()
    }, "setup.sh left JAX without bytecode"


def _python(at_least: tuple[int, int], below: tuple[int, int] = (4, 0)) -> str | None:
    for p in (
        shutil.which("python3.13"),
        shutil.which("python3.12"),
        shutil.which("python3.11"),
        sys.executable,
    ):
        check = f"import sys; sys.exit(not {at_least} <= sys.version_info[:2] < {below})"
        if p and subprocess.run([p, "-c", check], capture_output=True, check=False).returncode == 0:
            return p
    return None


def _choose_python(built, tmp_path, python3: str, uv_installs: str | None) -> tuple[str, list[str]]:
    """Run setup.sh's choice of Python with `python3` as the image's, and uv's `python install` standing in
    for the download (which cannot be reached from here): it records its arguments, and installs
    `uv_installs` (an interpreter here) or fails as uv does with no network. (what it printed, uv's calls)"""
    root = unpacked(built, tmp_path / "autograder")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python3)
    calls = tmp_path / "uv-calls"
    stub = tmp_path / "uv"
    stub.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$1 $2" in
  "python install") {"exit 0" if uv_installs else 'echo "error: no network" >&2; exit 1'} ;;
  "python find") echo {uv_installs or "/nowhere"} ;;
esac
""")
    stub.chmod(0o755)
    script = (root / "source" / "setup.sh").read_text()
    choice = script[script.index("# The course") : script.index('"$UV" sync')]
    env = user_environment(root) | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euc", f"UV={stub}\n" + choice + 'echo "chosen=$PY"'],
        cwd=root / "source",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, calls.read_text().splitlines() if calls.exists() else []


def test_setup_sh_takes_the_images_python3_when_it_gets_jax_0_12(built, tmp_path):
    newer = _python((3, 12))
    if newer is None:
        pytest.skip("no Python 3.12 or newer here")
    printed, calls = _choose_python(built, tmp_path, newer, uv_installs=None)
    assert f"chosen={tmp_path / 'bin' / 'python3'}" in printed and "setup: Python 3.1" in printed, printed
    assert calls == [], "nothing downloaded"


def test_setup_sh_has_uv_install_python_3_13_where_the_images_python3_is_older(built, tmp_path):
    older, newer = _python((3, 11), (3, 12)), _python((3, 12))
    if older is None or newer is None:
        pytest.skip("needs Python 3.11 and 3.12 or newer here")
    printed, calls = _choose_python(built, tmp_path, older, uv_installs=newer)
    assert calls[0] == "python install --quiet 3.13", calls
    assert f"chosen={newer}" in printed, printed


def test_setup_sh_falls_back_to_the_images_python_3_11_where_uv_can_install_none(built, tmp_path):
    older = _python((3, 11), (3, 12))
    if older is None:
        pytest.skip("no Python 3.11 here")
    printed, calls = _choose_python(built, tmp_path, older, uv_installs=None)
    assert calls == ["python install --quiet 3.13"], calls
    assert f"chosen={tmp_path / 'bin' / 'python3'}" in printed and "setup: Python 3.11." in printed, printed


def test_run_autograder_copied_to_the_root_grades_on_one_device_and_on_eight(autograder):
    for old in (autograder / "submission").iterdir():
        old.unlink()
    (autograder / "submission" / "lab-3.ipynb").write_text(_one_device_notebook())
    done = run_as_gradescope(autograder)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((autograder / "results" / "results.json").read_text())
    gradescope.validate(results)
    cases = {t["name"]: t for t in results["tests"]}
    assert len(cases) == LAB_3_TESTS and sum(t["max_score"] for t in cases.values()) == LAB_3_TESTS, results[
        "output"
    ]
    assert any(t["visibility"] == "after_published" for t in cases.values())
    failed = [t for t in cases.values() if t["status"] == "failed" and t["visibility"] == "visible"]
    said = results["output"] + "\n" + "\n".join(f"{t['name']}: {t['output']}" for t in failed)
    assert failed and all("cpu-1: passed" in t["output"] for t in failed), said
    assert any("cpu-8: failed" in t["output"] and "jax.devices()[:1]" in t["output"] for t in failed), said
    # JAX 0.10 (the autograder's environment where its Python is 3.11) ends process 1 of cpu-2x4 by a
    # segfault when it calls a jitted program over a mesh that holds none of its devices; JAX 0.12 raises.
    # The run is then an error row for every test, and the kit says the kernel died: no test passes there.
    crashed = all("cpu-2x4: error" in t["output"] and "killed by signal 11" in t["output"] for t in failed)
    if not crashed:
        assert all("cpu-8: failed" in t["output"] for t in failed), said
        assert results["score"] > 0
    assert results["score"] < LAB_3_TESTS
    assert "Graded on cpu-1, cpu-8" in results["output"]


def test_without_its_environment_the_autograder_still_writes_results_saying_why(built, tmp_path):
    root = unpacked(built, tmp_path / "autograder")  # setup.sh never ran (or failed)
    (root / "submission" / "lab-3.ipynb").write_text(_one_device_notebook())
    done = run_as_gradescope(root)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    gradescope.validate(results)
    assert results["score"] == 0 and "setup.sh did not finish" in results["output"]


def test_a_kit_that_crashes_still_leaves_results_with_the_end_of_its_log(autograder):
    policy_file = autograder / "source" / "tests" / "policy.toml"
    kept = policy_file.read_text()
    policy_file.write_text("this is [not toml")
    try:
        done = run_as_gradescope(autograder)
    finally:
        policy_file.write_text(kept)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((autograder / "results" / "results.json").read_text())
    gradescope.validate(results)
    assert results["score"] == 0 and "before it wrote any results" in results["output"], results["output"]
    assert "policy.toml" in results["output"]


def test_where_no_sandbox_can_be_made_nothing_is_graded_and_the_results_say_why(autograder, tmp_path):
    # LABKIT_BWRAP naming a program that is not there stands for Gradescope's container refusing bwrap.
    (autograder / "submission" / "lab-3.ipynb").write_text(_one_device_notebook())
    env = user_environment(autograder) | {"LABKIT_BWRAP": str(tmp_path / "no-bwrap")}
    (autograder / "results" / "results.json").unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "gradescope-run", "3", "--root", str(autograder)],
        cwd=autograder / "source",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    results = json.loads((autograder / "results" / "results.json").read_text())
    gradescope.validate(results)
    assert results["score"] == 0 and results["tests"] == [], done.stdout + done.stderr
    assert "no sandbox can be made" in results["output"] and "ISOLATION=limits-only" in results["output"]


def test_an_autograder_built_limits_only_by_name_says_so_in_its_results(tmp_path):
    zipped = gradescope.build(3, tmp_path / "lab-3.zip", isolation="limits-only")
    with zipfile.ZipFile(zipped) as z:
        assert "--isolation limits-only" in z.read("run_autograder").decode()
    with pytest.raises(gradescope.GradescopeError):
        gradescope.build(3, tmp_path / "other.zip", isolation="none")


NO_PERMISSIONS = (
    "bwrap: No permissions to create new namespace, likely because the kernel does not allow "
    "non-privileged user namespaces."
)  # what bwrap says in a container without user namespaces


def refusing_bwrap(folder: Path) -> Path:
    """A bwrap that starts and is then refused its namespaces, as in Gradescope's container (LABKIT_BWRAP)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bwrap"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "bubblewrap 0.11.0"; exit 0; fi\n'
        f"printf '%s\\n' {json.dumps(NO_PERMISSIONS)} >&2\nexit 1\n"
    )
    path.chmod(0o755)
    return path


def run_with(root: Path, script: bytes, **env) -> dict:
    """run_autograder (`script`) copied to the root and run there as Gradescope does; its results.json."""
    (root / "results" / "results.json").unlink(missing_ok=True)
    copied = root / "run_autograder"
    copied.write_bytes(script)
    copied.chmod(0o755)
    done = subprocess.run(
        [str(copied)],
        cwd=root,
        env=user_environment(root) | env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    gradescope.validate(results)
    return results


def test_run_autograder_where_the_container_refuses_bwrap_grades_nothing_and_says_why(autograder, tmp_path):
    for old in (autograder / "submission").iterdir():
        old.unlink()
    (autograder / "submission" / "lab-3.ipynb").write_text(_one_device_notebook())
    results = run_with(
        autograder,
        (autograder / "source" / "run_autograder").read_bytes(),
        LABKIT_BWRAP=str(refusing_bwrap(tmp_path)),
    )
    assert results["score"] == 0 and results["tests"] == [], results["output"]
    assert "No permissions to create new namespace" in results["output"]
    assert "ISOLATION=limits-only" in results["output"]


def test_an_autograder_built_limits_only_grades_there_and_every_result_says_it_was_not_sandboxed(
    autograder, tmp_path
):
    with zipfile.ZipFile(gradescope.build(3, tmp_path / "lab-3.zip", isolation="limits-only")) as z:
        script = z.read("run_autograder")
    for old in (autograder / "submission").iterdir():
        old.unlink()
    (autograder / "submission" / "lab-3.ipynb").write_text(_one_device_notebook())
    results = run_with(autograder, script, LABKIT_BWRAP=str(refusing_bwrap(tmp_path)))
    assert len(results["tests"]) == LAB_3_TESTS, results["output"]
    assert any("cpu-1: passed" in t["output"] for t in results["tests"]), results["output"]
    assert gradescope.NOT_SANDBOXED in results["output"]
    assert all(t["output"].startswith(gradescope.NOT_SANDBOXED) for t in results["tests"])


def test_a_run_killed_by_the_memory_limit_is_said_to_have_died_of_memory():
    from labkit.run.execute import RunRecord

    killed = RunRecord(
        "cpu-8",
        "error",
        "the Python kernel died while running the notebook (killed by signal 9: a crash, or out of memory)",
    )
    records = {"cpu-1": RunRecord("cpu-1", "ok"), "cpu-8": killed}
    counted = gradescope.memory_notes(records, 768 << 20, 0, 1)
    assert len(counted) == 1 and counted[0].startswith("Out of memory: the run on cpu-8 died of memory")
    assert "the container's memory limit (768 MiB) was reached" in counted[0] and "2 GB" in counted[0]
    assert "Out of memory" in gradescope.memory_notes(records, None, None, None)[0]
    assert (
        gradescope.memory_notes({"cpu-1": RunRecord("cpu-1", "error", "a cell raised")}, 768 << 20, 0, 0)
        == []
    )


def test_the_container_memory_is_read_from_this_process_cgroup():
    limit, kills = gradescope.container_memory()
    assert limit is None or limit > 0
    assert kills is None or kills >= 0


def test_the_courses_own_policy_is_checked_and_shipped_in_place_of_the_kits(tmp_path):
    mine = tmp_path / "policy.toml"
    mine.write_text('[grading]\ncombine = "any"\n\n[labs.3]\nweight = 3\n')
    zipped = gradescope.build(3, tmp_path / "lab-3.zip", course_policy=mine)
    with zipfile.ZipFile(zipped) as z:
        assert z.read("tests/policy.toml").decode() == mine.read_text()
    mine.write_text("[labs.3]\nweight = -1\n")
    with pytest.raises(gradescope.GradescopeError, match="policy.toml.*weight must not be negative"):
        gradescope.build(3, tmp_path / "bad.zip", course_policy=mine)
    assert not (tmp_path / "bad.zip").exists()


def test_make_gradescope_passes_the_courses_policy():
    done = subprocess.run(
        [
            "bash",
            "-c",
            doc_commands.typed("make gradescope LAB=3 POLICY=course/policy.toml").replace(
                "make", "make -n", 1
            ),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "labkit gradescope 3 --policy course/policy.toml" in done.stdout
