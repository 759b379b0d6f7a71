"""A Gradescope autograder for one lab: the zip Gradescope takes, and what runs inside it.

`build(lab)` writes build/gradescope/lab-N.zip (`make gradescope LAB=N`)::

    setup.sh            Gradescope runs it once on its Ubuntu image: a Python the kit supports (uv
                        installs one where the image's is older), the kit's locked environment
    run_autograder      runs on every submission, copied to /autograder and run from there:
                        `python -m labkit gradescope-run N`; a results.json whatever happens
    labkit/ pyproject.toml README.md uv.lock   the kit
    labs/lab-N.ipynb    the student version (names the lab; no solution is shipped)
    tests/public/lab_N/ tests/hidden/lab_N/ tests/policy.toml

`run(root, lab)` is what run_autograder does: it takes the notebook in ROOT/submission/, runs
it on cpu-1 and cpu-8 (and cpu-2x4 where it can run), judges it with the public and hidden
tests, and writes ROOT/results/results.json: one case per test with its `max_score` (its
points; none for a test that runs on none of those, such as one at a production size), scored by
the course policy's rule over the configurations; public tests `visible`, hidden ones
`after_published`; each case's `output` says how it did on each configuration, with
the multi-device messages. For a lab with a class leaderboard (labkit/grading/classwide/leaderboard.py), a
submission that passes every test on the leaderboard's configuration reports its modelled step
time in results.json's `leaderboard` (Gradescope ranks the submissions, lower first), and the
output says it beside the reference's. ROOT is /autograder, or AUTOGRADER_ROOT where that names another
folder laid out the same way. The file is checked against RESULTS_SCHEMA before it is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from labkit.course import catalog, configs
from labkit.exitcodes import ExitCode
from labkit.grading.classwide import leaderboard
from labkit.grading.state import policy
from labkit.grading.state.files import write_atomic
from labkit.run.modes import LIMITS_ONLY

CONFIGS = ("cpu-1", "cpu-8", "cpu-2x4")  # cpu-2x4 only where it can run
POLICY = "tests/policy.toml"  # the policy the autograder grades with: the kit's, or the course's (`build`)
SHIPPED = ("labkit", "pyproject.toml", "README.md", "uv.lock", POLICY, "tests/__init__.py")
MINIMUM_PYTHON = "3.11"  # Gradescope's Ubuntu 22.04 image has 3.10: setup.sh has uv install this one

# The part of Gradescope's results.json the kit writes (their "Autograder Specifications").
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["score", "tests", "output", "visibility", "stdout_visibility"],
    "additionalProperties": False,
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "number", "minimum": 0},
        "output": {"type": "string"},
        "visibility": {"enum": ["visible", "hidden", "after_due_date", "after_published"]},
        "stdout_visibility": {"enum": ["visible", "hidden", "after_due_date", "after_published"]},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "score", "max_score", "status", "visibility", "output"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "number": {"type": "string"},
                    "score": {"type": "number", "minimum": 0},
                    "max_score": {"type": "number", "minimum": 0},
                    "status": {"enum": ["passed", "failed"]},
                    "visibility": {"enum": ["visible", "hidden", "after_due_date", "after_published"]},
                    "output": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        # Gradescope's leaderboard: each submission's own values; `order` "asc" ranks lower values first.
        "leaderboard": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "value"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "value": {"type": ["number", "string"]},
                    "order": {"enum": ["asc", "desc"]},
                },
            },
        },
    },
}

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, on its Ubuntu image (22.04: python3 is 3.10), with the zip unpacked
# in /autograder/source and the internet open. AUTOGRADER_ROOT names another folder laid out the same way.
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
cd "$ROOT/source"
if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip' 2>/dev/null; then
  apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
fi
python3 -m venv "$ROOT/uv-tool"
# The uv the kit's Makefile pins (UV_VERSION): the one the kit is tested with.
"$ROOT/uv-tool/bin/pip" install -q uv=={uv}
UV="$ROOT/uv-tool/bin/uv"
# The course's JAX (0.12) needs Python 3.12 or newer: the image's python3 where it is one, else a 3.13
# that uv installs; where uv can install none, the image's python3 if it is {minimum} or newer (JAX 0.10.2).
if python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then PY="$(command -v python3)"
elif "$UV" python install --quiet 3.13 2>/dev/null; then PY="$("$UV" python find 3.13)"
elif python3 -c 'import sys; sys.exit(sys.version_info < ({major}, {minor}))'; then PY="$(command -v python3)"
else "$UV" python install --quiet {minimum} && PY="$("$UV" python find {minimum})"; fi
echo "setup: Python $("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])') ($PY)"
# The kit's locked environment (uv.lock), without the course's development groups, in source/.venv, compiled
# to bytecode now: each run sees it read-only in the sandbox, so without this every kernel compiles JAX from its
# sources again (twice as long to start, four kernels a submission), which can take a run past its time limit.
"$UV" sync --frozen --no-default-groups --compile-bytecode --python "$PY"
"$ROOT/source/.venv/bin/python" -m labkit isolation || echo "setup: no sandbox here; see run_autograder's results"
"""

# Gradescope copies run_autograder to /autograder/run_autograder and runs it from /autograder for every
# submission: everything is found from ROOT, never from where the script lies. Whatever fails, a
# results.json is written (score 0 and the reason): Gradescope shows nothing useful without one.
RUN_AUTOGRADER = r"""#!/usr/bin/env bash
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
PY="$SOURCE/.venv/bin/python"
RESULTS="$ROOT/results/results.json"
LOG="$ROOT/results/autograder.log"
mkdir -p "$ROOT/results"
rm -f "$RESULTS"
fail() {  # a results.json saying why ($1), with score 0
  if command -v python3 >/dev/null; then
    python3 - "$1" "$RESULTS" <<'WRITE'
import json, sys
json.dump({"score": 0, "output": sys.argv[1][-3000:], "visibility": "visible", "stdout_visibility": "hidden",
           "tests": []}, open(sys.argv[2], "w"))
WRITE
  else
    printf '%s\n' '{"score": 0, "output": "The autograder could not start, and this image has no python3 to say why: nothing was graded.", "visibility": "visible", "stdout_visibility": "hidden", "tests": []}' > "$RESULTS"
  fi
}
if [ ! -x "$PY" ]; then
  fail "The autograder could not start: $PY does not exist, so setup.sh did not finish (see the autograder's build log on Gradescope). Nothing was graded."
  exit 0
fi
cd "$SOURCE" || exit 0
"$PY" -m labkit gradescope-run @LAB@ --root "$ROOT" @ISOLATION@> "$LOG" 2>&1
code=$?
cat "$LOG"
if [ ! -s "$RESULTS" ]; then
  if [ "$code" -eq 137 ]; then
    code="137: killed by SIGKILL, which in Gradescope's container is its memory limit: it ran out of memory. Instructor: give the autograder more memory (at least 2 GB, 1 CPU; see the kit's docs/grading.md, 'Gradescope')"
  fi
  fail "The autograder stopped (exit status $code) before it wrote any results; nothing was graded. The end of its log:
$(tail -n 30 "$LOG")"
fi
exit 0
"""


# Said in results.json, and in every case's output, by an autograder built ISOLATION=limits-only.
NOT_SANDBOXED = (
    "Not sandboxed: this autograder was built with ISOLATION=limits-only, so the notebook ran with "
    "resource limits only, not in the kit's sandbox."
)


class GradescopeError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------
# The zip.
# ----------------------------------------------------------------------------------------


def _add(z: zipfile.ZipFile, path: Path, arcname: str) -> None:
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc"):
                _add(z, p, f"{arcname}/{p.relative_to(path).as_posix()}")
        return
    info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))  # the same kit gives the same zip
    info.external_attr = (0o100755 if os.access(path, os.X_OK) else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, path.read_bytes())


def _text(z: zipfile.ZipFile, arcname: str, text: str) -> None:
    info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = 0o100755 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, text)


def uv_version(root: Path = catalog.ROOT) -> str:
    """The uv version the kit's Makefile pins (UV_VERSION): setup.sh installs that one."""
    found = re.search(r"^UV_VERSION\s*:?=\s*(\S+)\s*$", (root / "Makefile").read_text(), re.MULTILINE)
    if not found:
        raise GradescopeError(f"{root / 'Makefile'} pins no UV_VERSION")
    return found.group(1)


def build(
    number: int | str,
    out: Path | None = None,
    root: Path = catalog.ROOT,
    isolation: str = "",
    course_policy: Path | None = None,
) -> Path:
    """Write the autograder zip of lab `number`; its path.

    `isolation`: "" (every submission in the kit's sandbox, or none graded) or "limits-only" (asked for
    by name: where Gradescope refuses the sandbox, resource limits only, said in every result).
    `course_policy`: the course's own policy, checked here and shipped as the zip's tests/policy.toml (the
    one the autograder reads) in place of the kit's."""
    lab = catalog.lab(number, root)
    shipped_policy = _course_policy(course_policy, root) if course_policy is not None else None
    out = Path(out or root / "build" / "gradescope" / f"{lab.name}.zip")
    if not lab.test_dirs(hidden=True):
        raise GradescopeError(f"{lab.name} has no tests under tests/public or tests/hidden")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        if isolation not in ("", LIMITS_ONLY):
            raise GradescopeError(
                f"isolation is the sandbox (the default) or {LIMITS_ONLY}, not {isolation!r}"
            )
        major, minor = MINIMUM_PYTHON.split(".")
        _text(
            z,
            "setup.sh",
            SETUP_SH.format(minimum=MINIMUM_PYTHON, major=major, minor=minor, uv=uv_version(root)),
        )
        _text(
            z,
            "run_autograder",
            RUN_AUTOGRADER.replace("@LAB@", str(lab.number)).replace(
                "@ISOLATION@", f"--isolation {isolation} " if isolation else ""
            ),
        )
        for part in SHIPPED:
            if part == POLICY and shipped_policy is not None:
                _text(z, part, shipped_policy)
            elif (root / part).exists():
                _add(z, root / part, part)
        for folder in lab.test_dirs(hidden=True):
            _add(z, folder, folder.relative_to(root).as_posix())
        notebook = lab.student if lab.student.exists() else None
        if notebook is None:
            raise GradescopeError(f"{lab.student} does not exist: run `make student-notebooks` first")
        _add(z, notebook, f"labs/{lab.name}.ipynb")
    os.replace(tmp, out)
    return out


# ----------------------------------------------------------------------------------------
# In the autograder: one submission to results.json.
# ----------------------------------------------------------------------------------------


def _course_policy(path: Path, root: Path) -> str:
    """The text of the course's policy, checked as grading checks it (GradescopeError naming the file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GradescopeError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        policy.parse(text, path, [lab.number for lab in catalog.labs(root)])
    except policy.PolicyError as e:
        raise GradescopeError(f"{e}: no autograder built") from None
    return text


def find_notebook(submission: Path, lab: catalog.Lab) -> tuple[Path | None, str]:
    """The notebook to grade: lab-N.ipynb, or the only .ipynb handed in; else None and why."""
    found = sorted(p for p in submission.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    exact = [p for p in found if p.name == f"{lab.name}.ipynb"]
    if exact:
        return exact[0], ""
    if len(found) == 1:
        return found[0], ""
    if not found:
        return None, f"no notebook was handed in: upload {lab.name}.ipynb"
    return None, (
        f"{len(found)} notebooks were handed in ({', '.join(p.name for p in found)}) and none is named "
        f"{lab.name}.ipynb: upload only {lab.name}.ipynb"
    )


def chosen_configs() -> list:
    out = []
    for name in CONFIGS:
        config = configs.CONFIGS[name]
        if name == "cpu-2x4" and not config.availability()[0]:
            continue
        out.append(config)
    return out


def results_json(
    outcomes: list[dict], config_names: list[str], grading: policy.Policy, notes: list[str]
) -> dict:
    """Gradescope's results from the judge's outcomes (dicts of judge.Outcome) on each configuration."""
    by_test: dict[str, dict] = {}
    for o in outcomes:
        entry = by_test.setdefault(o["test"], {"hidden": o["hidden"], "points": o.get("points", 1), "by": {}})
        entry["by"][o["config"]] = o
    cases, score = [], 0.0
    for name, entry in by_test.items():
        ran = {c: o for c, o in entry["by"].items() if o["status"] != "skipped"}
        tests = {name: {"points": entry["points"], "hidden": entry["hidden"], "configs": list(ran)}}
        rows = {c: {"tests": [o]} for c, o in ran.items()}
        # a test that ran on none of the configurations (one at a production size, which only the compile-only
        # TPU configurations run) is worth nothing here, as in the kit's own scoreboard
        earned, possible = policy.lab_points(grading, tests, rows)
        lines = []
        for c in config_names:
            o = entry["by"].get(c)
            if o is None:
                continue
            say = o["status"]
            if o["message"] and o["status"] != "passed" and not entry["hidden"]:
                say += f": {o['message']}"
            lines.append(f"{c}: {say}")
        cases.append(
            {
                "name": name.removeprefix("test_").replace("_", " ")
                + (" (hidden)" if entry["hidden"] else ""),
                "score": earned,
                "max_score": possible,
                "status": "passed" if earned == possible else "failed",
                "visibility": "after_published" if entry["hidden"] else "visible",
                "output": "\n".join(lines),
            }
        )
        score += earned
    output = [f"Graded on {', '.join(config_names)}: {policy.COMBINE[grading.combine]}."] + notes
    return {
        "score": round(score, 4),
        "output": "\n".join(output),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": cases,
    }


def with_leaderboard(
    results: dict, spec: catalog.Leaderboard, seconds: float | None, reference: float | None
) -> dict:
    """`results` with the lab's leaderboard: the submission's modelled step time (None: its run on the
    leaderboard's configuration does not pass, so it is not ranked), and a line of output beside the reference's."""
    results["leaderboard"] = leaderboard.gradescope(seconds, spec)
    results["output"] += "\n" + leaderboard.words(spec, seconds, reference)
    return results


def leaderboard_time(lab: catalog.Lab, spec, judgement) -> float | None:
    """The modelled step time of a judged submission for its lab's leaderboard as ranked here (`spec`, as
    `leaderboard.ranked_on` gives it); None where its run there fails."""
    from labkit import cost
    from labkit.grading.running.rows import make_row

    record = judgement.records.get(spec.config)
    mine = [o for o in judgement.outcomes if o.run == spec.config]
    if record is None or make_row("", lab.number, spec.config, record, mine)["status"] != "ok":
        return None
    found = cost.cards(judgement.calls, {spec.config: record.results})
    return leaderboard.step_time(cost.to_json(found), spec)


def validate(results: dict) -> None:
    import jsonschema

    try:
        jsonschema.validate(results, RESULTS_SCHEMA)
    except jsonschema.ValidationError as e:
        raise GradescopeError(f"results.json does not follow the schema: {e.message}") from None


def _nothing_graded(why: str) -> dict:
    return {"score": 0, "output": why, "visibility": "visible", "stdout_visibility": "hidden", "tests": []}


def _cgroup_file(controller: str, v1: str, v2: str) -> Path | None:
    """This process's memory cgroup file (`v1` under cgroup v1, `v2` under v2), or None where there is none."""
    from labkit.run import proccgroup

    for joined in proccgroup.memberships():
        path = joined.path
        if controller in joined.controllers:
            base, name = Path("/sys/fs/cgroup") / controller, v1
        elif joined.unified:
            base, name = Path("/sys/fs/cgroup"), v2
        else:
            continue
        for folder in (base / path.lstrip("/"), base):  # a container sees its own cgroup as the root
            if (folder / name).is_file():
                return folder / name
    return None


def container_memory() -> tuple[int | None, int | None]:
    """(the memory limit of this process's cgroup in bytes, the processes its OOM killer has killed so far),
    each None where it cannot be read (Gradescope's container: its size's memory)."""
    limit = kills = None
    found = _cgroup_file("memory", "memory.limit_in_bytes", "memory.max")
    if found is not None:
        text = found.read_text().strip()
        limit = int(text) if text.isdigit() and int(text) < 1 << 60 else None
    found = _cgroup_file("memory", "memory.oom_control", "memory.events")
    if found is not None:
        for line in found.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                kills = int(value)
    return limit, kills


def memory_notes(
    records: dict, limit: int | None, kills_before: int | None, kills_after: int | None
) -> list[str]:
    """What results.json says where a run died of memory: the kernel's OOM killer counted a kill while grading,
    or a run's kernel was killed by SIGKILL (which is how the OOM killer ends a process)."""
    killed = [label for label, rec in records.items() if "killed by signal 9" in (rec.message or "")]
    counted = (
        (kills_after or 0) - (kills_before or 0)
        if kills_before is not None and kills_after is not None
        else 0
    )
    if not killed and counted <= 0:
        return []
    size = f" ({limit / (1 << 20):.0f} MiB)" if limit else ""
    runs = f"the run on {', '.join(killed)}" if killed else "a run"
    certain = (
        f"the container's memory limit{size} was reached and the kernel killed {counted} process"
        f"{'es' if counted > 1 else ''}"
        if counted > 0
        else f"killed by SIGKILL, which in Gradescope's container is its memory limit{size} being reached"
    )
    return [
        (
            f"Out of memory: {runs} died of memory ({certain}); those tests failed for that, not for the "
            f"submission. Instructor: give the autograder more memory (Configure Autograder, container size: "
            f"at least 2 GB and 1 CPU, as the kit's docs/grading.md says), then regrade."
        )
    ]


def run(root: Path, number: int | str, isolation: str = "") -> dict:
    """Grade ROOT/submission into ROOT/results/results.json; the results.

    Every run is in the kit's sandbox, or nothing is graded and the results say why and what the
    instructor can do; `isolation="limits-only"` (built into the zip by name) grades without it and
    says so in every result. The configurations run one after another: Gradescope's default
    container (768 MB, half a CPU) holds one kernel at a time, not four."""
    began = time.monotonic()
    root = Path(root)
    lab = catalog.lab(number)
    grading, chosen = policy.load(), chosen_configs()
    notebook, why = find_notebook(root / "submission", lab)
    unsandboxed = NOT_SANDBOXED if isolation == LIMITS_ONLY else ""
    if notebook is not None and not unsandboxed:
        notebook, why = _sandboxed_or_why(notebook, why)
    if notebook is None:
        results = _nothing_graded(why)
    else:
        results = _graded(lab, notebook, chosen, grading, _limits_of(isolation), unsandboxed)
    for case in results["tests"] if unsandboxed else ():
        case["output"] = f"{unsandboxed}\n{case['output']}"
    results["execution_time"] = round(time.monotonic() - began, 2)
    validate(results)
    write_atomic(root / "results" / "results.json", json.dumps(results, indent=1) + "\n")
    return results


def _sandboxed_or_why(notebook: Path, why: str):
    """The notebook, where the kit's sandbox can be had here; else none, and why, with what to do."""
    from labkit.run import modes

    try:
        modes.require_sandbox("this submission was not graded")
    except modes.SandboxUnavailable as e:
        return None, (
            f"{e}\n\nOn Gradescope: ask for a container that allows user namespaces, or "
            "build the autograder with `make gradescope LAB=N ISOLATION=limits-only`, which "
            "grades without the sandbox and says so in every result."
        )
    return notebook, why


def _limits_of(isolation: str):
    """The runs' limits: the kit's defaults, in its sandbox unless `isolation` names another mode."""
    from labkit.run import allowance, modes

    return allowance.Limits(isolation=isolation or modes.SANDBOX)


def _graded(lab, notebook: Path, chosen: list, grading, limits, unsandboxed: str) -> dict:
    """The results of `notebook` judged on the `chosen` configurations, one after another, with the notes on
    runs that did not end well and on memory, and the leaderboard's time where the lab has one."""
    from labkit.judge import judge

    names = [c.name for c in chosen]
    limit, kills_before = container_memory()
    work = Path(tempfile.mkdtemp(prefix="labkit-gradescope-"))
    try:
        runs = [judge.RunSpec(c.name, notebook, c, work / c.name) for c in chosen]
        judgement = judge.judge(
            lab.test_dirs(hidden=True), runs, hidden_dirs=[lab.hidden_tests], jobs=1, limits=limits
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    notes = [
        f"{label}: the run ended with {rec.status}: {rec.message}"
        for label, rec in judgement.records.items()
        if rec.status not in ("ok", "skipped")
    ]
    notes += memory_notes(judgement.records, limit, kills_before, container_memory()[1])
    results = results_json(
        [o.to_json() for o in judgement.outcomes],
        names,
        grading,
        [unsandboxed, *notes] if unsandboxed else notes,
    )
    spec = lab.leaderboard and leaderboard.ranked_on(
        lab.leaderboard, {"configs": [{"name": n} for n in names]}
    )
    if spec is not None and spec.config in names:
        from labkit import cost

        reference = cost.to_json(cost.read_reference(lab.public_tests))
        with_leaderboard(
            results, spec, leaderboard_time(lab, spec, judgement), leaderboard.step_time(reference, spec)
        )
    return results


def main_run(args) -> int:
    try:
        results = run(args.root, args.lab, getattr(args, "isolation", "") or "")
    except (GradescopeError, catalog.UnknownLab) as e:
        print(f"error: {e}", file=sys.stderr)
        results = _nothing_graded(f"The autograder could not grade this submission: {e}")
        write_atomic(Path(args.root) / "results" / "results.json", json.dumps(results, indent=1) + "\n")
        return ExitCode.REFUSED
    print(
        f"score {results['score']} of {sum(t['max_score'] for t in results['tests'])}; "
        f"{Path(args.root) / 'results' / 'results.json'}"
    )
    return ExitCode.OK
