"""Feedback without leaving Jupyter: run one exercise's public tests in the student's own kernel.

A lab notebook starts with ``check = Checker(3)`` and, after each exercise, has a cell
``check("shard_map_double")``. It calls the function on the public tests' inputs on the
devices this kernel has, and prints what passed. It is a convenience for the student, not
a verdict: `make lab-N` (and grading) judge in another process, on every configuration.
Inside those runs the check cells only say so, to keep runs fast.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from labkit import catalog

# Set in the environment of every run the kit makes; the check cells then stay quiet.
RUN_MARKER = "LABKIT_RUN"
MARKS = {"passed": "✓", "failed": "✗", "todo": "…", "error": "!", "timeout": "!"}


def _tests_of(lab: catalog.Lab, exercise: str) -> list:
    found = []
    for path in sorted(lab.public_tests.glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"_labkit_check_{lab.number}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, fn in vars(module).items():
            calls = getattr(fn, "__labkit_calls__", None)
            if name.startswith("test_") and calls and any(c.function == exercise for c in calls.values()):
                found.append(fn)
    return found


class Checker:
    def __init__(self, lab: int):
        self.lab = catalog.Lab(int(lab))

    def __call__(self, exercise: str, namespace: dict | None = None) -> bool | None:
        if os.environ.get(RUN_MARKER):
            print(f"(`make {self.lab.name}` checks {exercise} on every device configuration)")
            return None
        # Imported here, not above: a kit run (quiet check cells) never pays for pytest and nbformat.
        from labkit import harness
        from labkit.checks import LabRun
        from labkit.configs import DeviceConfig
        from labkit.execute import RunRecord
        from labkit.judge import classify

        namespace = namespace if namespace is not None else sys._getframe(1).f_globals
        tests = _tests_of(self.lab, exercise)
        if not tests:
            print(f"no public tests of {exercise!r} in {self.lab.public_tests}")
            return None
        env = harness.environment()
        results = {}
        for test in tests:
            for c in test.__labkit_calls__.values():
                if c.id not in results:
                    results[c.id] = harness.call_one(namespace, {"id": c.id, **c.encoded()})
        record = RunRecord("this kernel", "ok", environment=env, results=results)
        devices = int(env.get("device_count") or 1)
        run = LabRun("this kernel", DeviceConfig("this kernel", "", env.get("backend", "cpu"), devices=devices), record)
        lines, passed = [], 0
        for test in tests:
            try:
                test(run)
                status, message = "passed", ""
            except BaseException as e:  # noqa: BLE001 - report whatever the check raised
                status, message = classify(type("Info", (), {"value": e})())
            passed += status == "passed"
            label = test.__name__.removeprefix("test_").replace("_", " ")
            lines.append(f"  {MARKS.get(status, '?')} {label}" + (f": {message}" if message else ""))
        plural = "s" if devices != 1 else ""
        print(f"{exercise} on this kernel's {devices} device{plural}: {passed}/{len(tests)} public tests passed")
        print("\n".join(lines))
        print(f"(`make {self.lab.name}` runs them on every device configuration, and grading adds hidden tests)")
        return passed == len(tests)
