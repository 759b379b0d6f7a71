"""What a run may write to disk (`--disk`): a notebook that fills the disk is stopped, named, and leaves nothing.

The scratch folder, which the kit reads after the run (the results, the kernel's sockets), is measured
while the run goes on (`scratch.usage`); the sandbox's own /tmp and /dev/shm are tmpfs capped at the
same size where the bwrap in use can cap one.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
from notebook_variants import with_cell

from labkit import cli
from labkit.course import catalog
from labkit.course.configs import CONFIGS
from labkit.judge.judge import RunSpec, judge
from labkit.run import allowance, bwrap, execute, kernel, modes, sandbox

LAB = catalog.Lab(3)
DISK = 64 * allowance.MiB
SMALL_DISK = allowance.Limits(disk=DISK, output=2 * allowance.MiB)
# three files of 40 MiB: each is within what one file may be, all three are not
FILL = """\
for i in range(3):
    with open(f"filler-{i}", "wb") as f:
        for _ in range(40):
            f.write(b"\\1" * (1 << 20))
"""


def test_a_notebook_that_fills_the_disk_is_stopped_named_and_leaves_no_file_while_grading_goes_on(tmp_path):
    filler = with_cell(FILL, tmp_path / "filler.ipynb")
    runs = [
        RunSpec("filler", filler, CONFIGS["cpu-1"], tmp_path / "filler"),
        RunSpec("honest", LAB.reference, CONFIGS["cpu-1"], tmp_path / "honest"),
    ]
    judgement = judge(
        LAB.test_dirs(hidden=True),
        runs,
        hidden_dirs=[LAB.hidden_tests],
        jobs=2,
        timeout=150,
        limits=SMALL_DISK,
    )

    record = judgement.records["filler"]
    assert record.status == "error"
    assert "wrote more than 64 MiB to disk" in record.message, record.message
    assert not (tmp_path / "filler" / "scratch").exists()  # no file stays
    assert (tmp_path / "filler" / "executed.ipynb").is_file()  # the kit's own files do
    filler_rows = [o for o in judgement.outcomes if o.run == "filler"]
    assert filler_rows and all(o.status != "passed" for o in filler_rows)
    assert any("wrote more than 64 MiB to disk" in o.message for o in filler_rows)
    honest = [o for o in judgement.outcomes if o.run == "honest"]
    assert honest and all(o.status == "passed" for o in honest), [(o.test, o.message) for o in honest]


HIDE = """\
import os, time
held = []
for i in range(3):
    f = open(f"hidden-{i}", "wb")
    os.unlink(f"hidden-{i}")  # no name left to find: only the open file holds the disk
    for _ in range(40):
        f.write(b"\\1" * (1 << 20))
    f.flush()
    held.append(f)
time.sleep(5)
"""


def test_files_removed_but_held_open_count_against_the_disk(tmp_path):
    hider = with_cell(HIDE, tmp_path / "hider.ipynb")
    record = execute.run_notebook(hider, CONFIGS["cpu-1"], [], tmp_path / "run", limits=SMALL_DISK)
    assert record.status == "error"
    assert "wrote more than 64 MiB to disk" in record.message, record.message


def test_each_process_of_a_multi_process_run_is_held_to_the_allowance_and_the_run_says_so(tmp_path):
    config = CONFIGS["cpu-2x4"]
    available, why = config.availability()
    if not available:
        pytest.skip(why)
    filler = with_cell(FILL, tmp_path / "filler.ipynb")
    record = execute.run_notebook(filler, config, [], tmp_path / "run", limits=SMALL_DISK)
    assert record.status == "error"
    assert "stopped early" in record.message and "wrote more than 64 MiB to disk" in record.message, (
        record.message
    )
    assert not list((tmp_path / "run").glob("process-*/scratch"))


def test_a_multi_process_run_stopped_for_the_disk_says_so_though_a_peer_is_seen_to_die_first(
    tmp_path, monkeypatch
):
    # the process stopped for the disk is 0; its peer, which loses it, aborts (signal 6) and its end is seen first
    stopped = "the notebook wrote more than 64 MiB to disk, so the run was stopped"

    def kernel_run(input_path, output_path, folders, env, limits, key, timeout, network=None, kernels=None):
        if network is None:  # process 0
            time.sleep(1)
            return kernel.KernelRun(died=True, returncode=-9, disk=stopped)
        return kernel.KernelRun(died=True, returncode=-6)

    available, why = CONFIGS["cpu-2x4"].availability()
    if not available:
        pytest.skip(why)
    monkeypatch.setattr(kernel, "papermill_run", kernel_run)
    filler = with_cell(FILL, tmp_path / "filler.ipynb")
    record = execute.run_notebook(filler, CONFIGS["cpu-2x4"], [], tmp_path / "run", limits=SMALL_DISK)
    assert record.status == "error"
    assert record.message == f"process 0 of 2 stopped early, so the others were ended too: {stopped}", (
        record.message
    )


def test_the_scratch_folder_is_kept_when_asked_even_after_the_disk_stopped_the_run(tmp_path):
    filler = with_cell(FILL, tmp_path / "filler.ipynb")
    record = execute.run_notebook(
        filler, CONFIGS["cpu-1"], [], tmp_path / "run", limits=SMALL_DISK, keep_scratch=True
    )
    assert "wrote more than 64 MiB to disk" in record.message, record.message
    assert (tmp_path / "run" / "scratch" / "filler-0").is_file()  # to look at, as the TA asked


def _in_sandbox(source: str, tmp_path: Path, limits: allowance.Limits) -> tuple[int, str]:
    """(exit status, output) of `python -c source` launched as a run's process is."""
    log = io.BytesIO()
    run = sandbox.launch(
        [sys.executable, "-c", source], sandbox.RunContext(tmp_path / "work", {}, log, limits)
    )
    return run.wait(timeout=60), log.getvalue().decode(errors="replace")


def writer(folder: str, files: int, mib: int) -> str:
    """Code that writes `files` files of `mib` MiB into `folder` and says how far it got, and what stopped it."""
    return f"""\
import errno, os
written = 0
try:
    for i in range({files}):
        with open(os.path.join({folder!r}, f"big-{{i}}"), "wb") as f:
            for _ in range({mib}):
                f.write(b"\\1" * (1 << 20))
                f.flush()
                written += 1 << 20
except OSError as e:
    print("refused", errno.errorcode[e.errno], written >> 20)
else:
    print("wrote", written >> 20)
"""


@pytest.mark.skipif(modes.isolation()[0] != modes.BUBBLEWRAP, reason="bubblewrap cannot make a sandbox here")
def test_the_sandboxs_tmp_holds_no_more_than_the_disk_allowance(tmp_path):
    if not bwrap.sizes_tmpfs(modes.finding().version):
        pytest.skip(f"{modes.finding().version} cannot cap a tmpfs (bubblewrap 0.10 and later can)")
    code, said = _in_sandbox(writer("/tmp", 3, 40), tmp_path, replace_disk(DISK))
    assert code == 0, said
    assert "refused ENOSPC" in said, said  # the tmpfs is full at 64 MiB
    assert 40 <= int(said.split()[-1]) <= 64


def test_no_single_file_is_larger_than_the_disk_allowance(tmp_path):
    _, said = _in_sandbox(writer(".", 1, 100), tmp_path, replace_disk(32 * allowance.MiB))
    assert "refused EFBIG 32" in said, said  # RLIMIT_FSIZE: the file stops at the allowance


def test_a_bwrap_caps_a_tmpfs_from_version_0_10_on():
    assert [bwrap.sizes_tmpfs(f"bubblewrap {v}") for v in ("0.6.1", "0.9.0", "0.10.0", "0.11.0", "1.0")] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert not bwrap.sizes_tmpfs("")


@pytest.mark.skipif(modes.isolation()[0] != modes.BUBBLEWRAP, reason="bubblewrap cannot make a sandbox here")
def test_the_isolation_command_says_whether_tmp_is_capped():
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "isolation"],
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    capped = bwrap.sizes_tmpfs(modes.finding().version)
    assert ("/tmp and /dev/shm: tmpfs of the run's --disk each" in done.stdout) == capped, done.stdout
    assert ("/tmp and /dev/shm: tmpfs without a size" in done.stdout) == (not capped), done.stdout


def replace_disk(disk: int) -> allowance.Limits:
    return allowance.Limits(disk=disk, isolation=modes.AUTO)


def test_the_disk_allowance_is_a_flag_of_lab_and_grade_with_a_default():
    for command in (["lab", "3"], ["grade"]):
        args = cli.parser().parse_args([*command, "--disk", "512M"])
        assert allowance.limits_from_args(args).disk == 512 * allowance.MiB
        assert (
            allowance.limits_from_args(cli.parser().parse_args(command)).disk == allowance.DEFAULT_LIMITS.disk
        )
