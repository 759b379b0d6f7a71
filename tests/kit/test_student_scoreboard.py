"""`make scoreboard` says what was run: the configurations that ran and those skipped (with why), that only
the public tests ran, the compile-only TPU results the student ran (from an earlier run too), and no points
"on every configuration graded" where a configuration was skipped."""

from __future__ import annotations

import pytest
from notebook_variants import LAB_3_PUBLIC_TESTS

from labkit.course import catalog

N = LAB_3_PUBLIC_TESTS


def test_the_scoreboard_names_a_skipped_configuration_with_why_and_never_grades_on_it(kit, build):
    ran = kit("lab", "3", "--notebook", str(catalog.lab(3).reference), "--configs", "cpu-1,tpu")
    assert ran.returncode == 0 and "tpu skipped (no TPU" in ran.stdout, ran.stdout + ran.stderr
    done = kit("scoreboard")
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout
    assert "Ran: cpu-1." in said, said
    skip = next(line for line in said.splitlines() if line.startswith("skipped¹ tpu (lab 3): "))
    assert "no TPU" in skip, said
    assert "Tests: public only. Grading adds hidden tests, which these runs did not run." in said
    assert "No compile-only TPU configuration ran" in said and "CONFIGS=cpu-8,v5e-8" in said
    assert f"Points: {N}/{N} over the configurations that ran; not a grade" in said
    page = (build / "scoreboard" / "you.md").read_text()
    assert "graded (cpu-1, tpu)" not in page and "graded (cpu-1)" in page, page
    assert (
        "NOT A GRADE" in page and "hidden tests grading adds were not run" in page and "tpu skipped" in page
    )


def test_the_scoreboard_keeps_compile_only_tpu_results_from_an_earlier_run_and_says_when(kit, build):
    pytest.importorskip("libtpu")
    reference = str(catalog.lab(3).reference)
    first = kit("lab", "3", "--notebook", reference, "--configs", "cpu-8,v5e-8")
    assert first.returncode == 0, first.stdout + first.stderr
    again = kit("lab", "3", "--notebook", reference, "--configs", "cpu-1,cpu-8")  # a plain run, after it
    assert again.returncode == 0 and "v5e-8" not in again.stdout.split("PASS")[0], again.stdout
    said = kit("scoreboard").stdout
    header = next(line for line in said.splitlines() if "lab" in line and "cpu-1" in line)
    assert "v5e-8" in header, said
    assert "Ran: cpu-1, cpu-8, v5e-8." in said
    assert "Compile-only TPU results included: v5e-8" in said
    assert "lab 3 on v5e-8: from an earlier run (" in said and "not your last `make lab-3`" in said
    row = next(line for line in said.splitlines() if "Lab 3" in line)
    assert f"{N}/{N}*" in row, said
