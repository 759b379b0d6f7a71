"""infra/workshop.sh, the organiser's front door, against recording stand-ins for gcloud, terraform and nox.

The stand-ins record every call and answer from a canned file: terraform's outputs, the state of each
TPU VM, each slice's host count, what a list finds left after a destroy, and a folder standing in for
the VMs' disks and the backup bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import cloud_standins
import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"


def run(cmd, *, env=None, timeout=120, cwd=ROOT, input=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout, input=input)


class Workshop:
    """Runs infra/workshop.sh with fake gcloud, terraform and nox first on the PATH."""

    def __init__(self, tmp_path: Path, tfvars: str, outputs: dict, **canned):
        self.tmp = tmp_path
        self.log = tmp_path / "calls.jsonl"
        self.remote = tmp_path / "remote"
        self.logs = tmp_path / "logs"
        bin_dir = tmp_path / "bin"
        cloud_standins.install(
            bin_dir, ("gcloud", "terraform", "nox"), self.log, tmp_path / "canned.json", self.remote
        )
        (tmp_path / "canned.json").write_text(json.dumps({"outputs": outputs, **canned}))
        (tmp_path / "workshop.tfvars").write_text(textwrap.dedent(tfvars))
        self.env = dict(
            os.environ,
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            WORKSHOP_TFVARS=str(tmp_path / "workshop.tfvars"),
            WORKSHOP_LOGS=str(self.logs),
            LABKIT_NOX=str(bin_dir / "nox"),
        )

    def __call__(self, *args: str, input: str = "") -> subprocess.CompletedProcess:
        return run(["bash", str(INFRA / "workshop.sh"), *args], env=self.env, input=input)

    def calls(self, tool: str | None = None) -> list[list[str]]:
        if not self.log.exists():
            return []
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c[1:] for c in calls if tool is None or c[0] == tool]

    def collected(self) -> None:
        self.logs.mkdir(exist_ok=True)
        (self.logs / "spmd.collected").write_text("2026-11-23T10:00:00Z results\n")


SETTINGS = """\
    project          = "my-course-project"
    workshop         = "spmd"
    kit_repo         = "https://example.org/course/labkit.git"
    zone             = "us-central1-a"
    tpu_count        = 3
    accelerator_type = "v5litepod-8" # 8 chips, one host
    runtime_version  = "v2-alpha-tpuv5-lite"
    cpu_count        = 2
    machine_type     = "e2-standard-4"
    """
NAMES = {
    "tpu_names": ["spmd-tpu-00", "spmd-tpu-01", "spmd-tpu-02"],
    "cpu_names": ["spmd-cpu-00", "spmd-cpu-01"],
    "students": {
        "spmd-tpu-00": "tpu-00",
        "spmd-tpu-01": "tpu-01",
        "spmd-tpu-02": "tpu-02",
        "spmd-cpu-00": "cpu-00",
        "spmd-cpu-01": "cpu-01",
    },
    "accounts": {},
    "backup_bucket": "my-course-project-spmd-labs",
}
ROSTER_NAMES = {
    "tpu_names": ["spmd-ada"],
    "cpu_names": ["spmd-cy"],
    "students": {"spmd-ada": "ada", "spmd-cy": "cy"},
    "accounts": {"spmd-ada": "ada@example.org", "spmd-cy": "cy@example.org"},
    "backup_bucket": "my-course-project-spmd-labs",
}


@pytest.fixture
def workshop(tmp_path):
    return Workshop(tmp_path, SETTINGS, NAMES)


# ---- up: validation, cost, apply ------------------------------------------------------------------


def test_up_prints_the_cost_per_hour_and_for_the_day_before_it_applies(workshop):
    result = workshop("up", "--yes")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "3 x v5litepod-8" in out and "$28.80/h" in out  # 3 x $9.60
    assert "2 x e2-standard-4" in out and "$0.27/h" in out  # 2 x $0.134
    assert "Estimated cost: $29.07 per hour while they run, $232.56 for the planned 8 hours" in out
    assert "estimate" in out.lower() and "2026-11-22" in out, "say it is an estimate, and of when"
    assert out.index("Estimated cost") < out.index("terraform apply"), "the cost comes before anything starts"
    tf = workshop.calls("terraform")
    assert tf[0] == [f"-chdir={INFRA}", "init", "-input=false"]
    assert tf[1] == [
        f"-chdir={INFRA}",
        "apply",
        "-input=false",
        "-auto-approve",
        f"-var-file={workshop.tmp / 'workshop.tfvars'}",
    ]
    assert "make workshop-links" in out


def test_the_planned_hours_come_from_the_settings(tmp_path):
    w = Workshop(tmp_path, SETTINGS + "    hours = 3\n", NAMES)
    assert "$87.21 for the planned 3 hours" in w("cost").stdout


def test_a_relative_settings_path_still_reaches_terraform(workshop):
    workshop.env["WORKSHOP_TFVARS"] = "workshop.tfvars"
    result = run(["bash", str(INFRA / "workshop.sh"), "up", "--yes"], env=workshop.env, cwd=workshop.tmp)
    assert result.returncode == 0, result.stderr
    apply = next(c for c in workshop.calls("terraform") if "apply" in c)
    assert apply[-1] == f"-var-file={workshop.tmp / 'workshop.tfvars'}", "terraform runs in infra/, not here"


def test_up_without_a_yes_starts_nothing(workshop):
    result = workshop("up", input="n\n")
    assert result.returncode != 0
    assert "Estimated cost" in result.stdout
    assert not any("apply" in c for c in workshop.calls("terraform"))


def test_up_on_spot_prints_the_on_demand_price_as_an_upper_bound(tmp_path):
    w = Workshop(tmp_path, SETTINGS + "    spot = true\n", NAMES)
    result = w("cost")
    assert result.returncode == 0, result.stderr
    assert "spot/preemptible" in result.stdout and "at most $29.07 per hour" in result.stdout
    assert w.calls() == [], "`cost` only prints"


def test_up_refuses_an_accelerator_it_has_no_price_for(tmp_path):
    w = Workshop(tmp_path, SETTINGS.replace("v5litepod-8", "v5litepod-256"), NAMES)
    result = w("up", "--yes")
    assert result.returncode == 2
    assert "no price known for v5litepod-256" in result.stderr and "usd_per_hour" in result.stderr
    assert "$0.00" not in result.stdout
    assert w.calls("terraform") == []


def test_a_price_given_in_the_settings_prices_an_unlisted_type(tmp_path):
    w = Workshop(
        tmp_path, SETTINGS.replace("v5litepod-8", "v5litepod-32") + "    usd_per_hour = 38.4\n", NAMES
    )
    result = w("cost")
    assert result.returncode == 0, result.stderr
    assert "as given by usd_per_hour" in result.stdout and "$115.20/h" in result.stdout


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            (("v5litepod-8", "v6e-8"), ("v2-alpha-tpuv5-lite", "v2-alpha-tpuv6e")),
            "zone us-central1-a does not offer v6e",
        ),
        (
            (('"v2-alpha-tpuv5-lite"', '"tpu-ubuntu2204-base"'),),
            "runtime_version tpu-ubuntu2204-base does not run v5litepod",
        ),
        (
            (("v5litepod-8", "v5p-8"),),
            "runtime_version v2-alpha-tpuv5-lite does not run v5p; use v2-alpha-tpuv5",
        ),
        ((("v5litepod-8", "v7x-8"),), "the generation v7x is not in"),
        ((('"us-central1-a"', '"us-central2-b"'),), "zone us-central2-b does not offer v5litepod"),
    ],
)
def test_up_checks_type_runtime_and_zone_together_against_the_table(tmp_path, changes, message):
    settings = SETTINGS
    for change in changes:
        settings = settings.replace(*change)
    w = Workshop(tmp_path, settings, NAMES)
    result = w("up", "--yes")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert w.calls() == []


@pytest.mark.parametrize(
    "settings",
    [
        'accelerator_type = "v4-8"\n runtime_version = "tpu-ubuntu2204-base"\n zone = "us-central2-b"',
        'accelerator_type = "v5p-8"\n runtime_version = "v2-alpha-tpuv5"\n zone = "us-east5-a"',
        'accelerator_type = "v6e-8"\n runtime_version = "v2-alpha-tpuv6e"\n zone = "us-central1-ai1a"',
    ],
)
def test_the_tables_pairs_from_cloud_tpus_documentation_pass(tmp_path, settings):
    w = Workshop(tmp_path, SETTINGS + textwrap.indent(settings.replace("\n ", "\n"), "    ") + "\n", NAMES)
    result = w("cost")
    assert result.returncode == 0, result.stderr


def test_the_type_table_names_its_source():
    header = (INFRA / "tpu-types.tsv").read_text()
    assert "https://cloud.google.com/tpu/docs/regions-zones" in header
    assert "gcloud compute tpus accelerator-types list" in header


def test_a_roster_sets_how_many_vms_of_each_kind(tmp_path):
    (tmp_path / "roster.csv").write_text(
        "student,account,kind\nada,ada@example.org,tpu\nbo,bo@example.org,\ncy,cy@example.org,cpu\n"
    )
    w = Workshop(tmp_path, SETTINGS + f'    roster = "{tmp_path / "roster.csv"}"\n', ROSTER_NAMES)
    result = w("cost")
    assert result.returncode == 0, result.stderr
    assert "2 x v5litepod-8" in result.stdout and "1 x e2-standard-4" in result.stdout


def test_a_failed_apply_says_what_exists_and_exits_non_zero(tmp_path):
    w = Workshop(
        tmp_path, SETTINGS, NAMES, fail=["apply"], left={"tpus": "spmd-tpu-00", "instances": "spmd-cpu-00"}
    )
    result = w("up", "--yes")
    assert result.returncode == 1
    assert "terraform apply (or a queued resource) FAILED" in result.stderr
    assert "tpu vm: spmd-tpu-00" in result.stderr and "instance: spmd-cpu-00" in result.stderr
    assert "workshop.sh up` again" in result.stderr


def test_up_deletes_preempted_tpu_vms_so_that_apply_makes_them_again(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES, states={"spmd-tpu-00": "READY", "spmd-tpu-01": "PREEMPTED"})
    result = w("up", "--yes")
    assert result.returncode == 0, result.stderr
    gcloud = w.calls("gcloud")
    deletes = [c for c in gcloud if "delete" in c]
    assert deletes == [
        [
            "compute",
            "tpus",
            "tpu-vm",
            "delete",
            "spmd-tpu-01",
            "--project",
            "my-course-project",
            "--zone",
            "us-central1-a",
            "--quiet",
        ]
    ]
    raw = [json.loads(line) for line in w.log.read_text().splitlines()]
    first_delete = next(i for i, c in enumerate(raw) if "delete" in c)
    assert [c[0] for c in raw].index("terraform") > first_delete, "deleted before terraform makes it again"


def test_up_starts_cpu_vms_that_stopped(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES, left={"instances": "spmd-cpu-01"})
    result = w("up", "--yes")
    assert result.returncode == 0, result.stderr
    stopped = next(c for c in w.calls("gcloud") if c[:3] == ["compute", "instances", "list"])
    assert "labels.workshop=spmd AND status=TERMINATED" in stopped
    assert [
        "compute",
        "instances",
        "start",
        "spmd-cpu-01",
        "--project",
        "my-course-project",
        "--zone",
        "us-central1-a",
    ] in w.calls("gcloud")


def test_without_settings_the_script_says_what_to_copy(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES)
    w.env["WORKSHOP_TFVARS"] = str(tmp_path / "missing.tfvars")
    result = w("up", "--yes")
    assert result.returncode == 2
    assert "workshop.tfvars.example" in result.stderr
    assert w.calls() == []


# ---- links and status -------------------------------------------------------------------------------


def test_links_give_each_student_the_tunnel_to_their_own_jupyterlab(tmp_path):
    w = Workshop(tmp_path, SETTINGS, ROSTER_NAMES)
    result = w("links")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert (
        "ada (ada@example.org):\n    gcloud compute tpus tpu-vm ssh spmd-ada --project my-course-project "
        "--zone us-central1-a --tunnel-through-iap -- -N -L 8888:localhost:8888"
    ) in out
    assert (
        "cy (cy@example.org):\n    gcloud compute ssh spmd-cy --project my-course-project --zone us-central1-a "
        "--tunnel-through-iap -- -N -L 8888:localhost:8888"
    ) in out
    assert "http://localhost:8888/lab" in out
    rows = [line.split("\t") for line in (w.logs / "spmd.links.tsv").read_text().splitlines()]
    assert rows[0] == ["student", "account", "vm", "command", "url"]
    assert [r[:3] for r in rows[1:]] == [
        ["ada", "ada@example.org", "spmd-ada"],
        ["cy", "cy@example.org", "spmd-cy"],
    ]
    assert w.calls("gcloud") == [], "links only reads terraform's outputs"


def test_status_lists_the_labelled_vms_and_each_kits_status_through_iap(workshop):
    result = workshop("status")
    assert result.returncode == 0, result.stderr
    gcloud = workshop.calls("gcloud")
    lists = [c for c in gcloud if "list" in c]
    assert any(c[:4] == ["compute", "tpus", "tpu-vm", "list"] and "labels.workshop=spmd" in c for c in lists)
    assert any(c[:3] == ["compute", "instances", "list"] and "labels.workshop=spmd" in c for c in lists)
    ssh = [c for c in gcloud if "ssh" in c]
    assert len(ssh) == 5
    assert all("cat /var/lib/labkit/status" in c[-1] and "--tunnel-through-iap" in c for c in ssh)


def test_status_shows_preempted_vms_and_how_to_bring_them_back(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES, states={"spmd-tpu-00": "READY", "spmd-tpu-01": "PREEMPTED"})
    result = w("status")
    assert result.returncode == 0, result.stderr
    assert "spmd-tpu-01" in result.stdout and "PREEMPTED" in result.stdout
    assert "1 preempted TPU VM(s): spmd-tpu-01; run `make workshop-up` to make them again" in result.stdout
    ssh = [c[4] for c in w.calls("gcloud") if "ssh" in c]
    assert "spmd-tpu-01" not in ssh, "a preempted VM is not asked"


# ---- run -------------------------------------------------------------------------------------------


def test_run_lab_runs_on_every_worker_of_every_tpu_vm_as_the_student(workshop):
    result = workshop("run", "lab", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    gcloud = workshop.calls("gcloud")
    for name in NAMES["tpu_names"]:
        assert [
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            name,
            "--project",
            "my-course-project",
            "--zone",
            "us-central1-a",
            "--tunnel-through-iap",
            "--worker=all",
            "--command",
            "cd /opt/labkit && sudo -u student make lab-3 CONFIGS=tpu EXTRAS=tpu DEP_GROUPS=notebook "
            "LABKIT_TPU_HOSTS=1",
        ] in gcloud
    for name in NAMES["cpu_names"]:
        assert [
            "compute",
            "ssh",
            name,
            "--project",
            "my-course-project",
            "--zone",
            "us-central1-a",
            "--tunnel-through-iap",
            "--command",
            "cd /opt/labkit && sudo -u student make lab-3 CONFIGS=cpu-1,cpu-8 DEP_GROUPS=notebook",
        ] in gcloud
    assert (workshop.logs / "spmd-tpu-01.log").exists(), "one log per VM"


def test_run_lab_takes_the_configurations_to_run(workshop):
    workshop("run", "lab", "5", "--configs", "cpu-8")
    calls = [c for c in workshop.calls("gcloud") if "ssh" in c]
    tpu = [c[-1] for c in calls if c[:2] == ["compute", "tpus"]]
    cpu = [c[-1] for c in calls if c[:2] != ["compute", "tpus"]]
    assert tpu and all("make lab-5 CONFIGS=cpu-8 " in c for c in tpu)
    assert cpu and all(c.endswith("make lab-5 CONFIGS=cpu-8 DEP_GROUPS=notebook") for c in cpu)


def test_on_a_multi_host_slice_every_worker_runs_the_students_own_notebook(tmp_path):
    w = Workshop(
        tmp_path,
        SETTINGS.replace("v5litepod-8", "v5litepod-16"),
        NAMES,
        hosts={"spmd-tpu-00": 4, "spmd-tpu-01": 4, "spmd-tpu-02": 4},
    )
    # Not in prices.tsv's host column: the count comes from the TPU API.
    (w.remote / "spmd-tpu-01/opt/labkit/labs").mkdir(parents=True)
    (w.remote / "spmd-tpu-01/opt/labkit/labs/lab-11.ipynb").write_text('{"cells": ["edited by tpu-01"]}')
    result = w("run", "lab", "11")
    gcloud = w.calls("gcloud")
    describe = [c for c in gcloud if "describe" in c]
    assert len(describe) == 3 and all("value(networkEndpoints.len())" in c for c in describe)
    scp = [c for c in gcloud if "scp" in c and "spmd-tpu-01" in " ".join(c)]
    assert "--worker=0" in scp[0] and scp[0][-2] == "spmd-tpu-01:/opt/labkit/labs/lab-11.ipynb"
    assert "--worker=all" in scp[1] and scp[1][-1] == "spmd-tpu-01:/tmp/labkit-lab-11.ipynb"
    ssh = next(c for c in gcloud if "ssh" in c and c[4] == "spmd-tpu-01")
    assert "--worker=all" in ssh
    assert ssh[-1].startswith(
        "sudo install -o student -m 0644 /tmp/labkit-lab-11.ipynb /opt/labkit/labs/lab-11.ipynb && "
    )
    assert ssh[-1].endswith("LABKIT_TPU_HOSTS=4")
    # The two VMs whose worker 0 had no notebook to copy are reported, not run half-way.
    assert result.returncode == 1
    assert "spmd-tpu-00: could not copy lab-11.ipynb from worker 0 to every worker" in result.stdout
    assert not [c for c in gcloud if "ssh" in c and c[4] == "spmd-tpu-00"]


def test_run_grade_is_refused_since_the_vms_hold_no_reference(workshop):
    result = workshop("run", "grade", "--labs", "3")
    assert result.returncode == 2 and "workshop.sh grade" in result.stderr and "tests/hidden" in result.stderr
    assert workshop.calls("gcloud") == []


def test_grade_collects_by_student_and_grades_here_with_the_hidden_tests(tmp_path):
    w = Workshop(tmp_path, SETTINGS, ROSTER_NAMES)
    _remote_vm(w.remote, "spmd-ada", graded=False)
    _remote_vm(w.remote, "spmd-cy", graded=False)
    out = tmp_path / "results"
    w.env["WORKSHOP_RESULTS"] = str(out)
    result = w("grade", "--labs", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "submissions/ada/lab-3.ipynb").exists() and (out / "submissions/cy/lab-3.ipynb").exists()
    assert w.calls("nox") == [
        [
            "-f",
            str(ROOT / "noxfile.py"),
            "-s",
            "grade",
            "--",
            "--submissions",
            str(out / "submissions"),
            "--out",
            str(out / "graded"),
            "--labs",
            "3",
        ]
    ]


def test_run_rejects_an_unknown_request(workshop):
    result = workshop("run", "lab", "three")
    assert result.returncode == 2 and "usage" in result.stderr
    assert workshop.calls("gcloud") == []


# ---- collect ---------------------------------------------------------------------------------------


def _remote_vm(remote: Path, name: str, *, graded: bool) -> None:
    labs = remote / name / "opt/labkit/labs"
    labs.mkdir(parents=True)
    (labs / "lab-3.ipynb").write_text('{"cells": []}')
    if graded:
        board = remote / name / "opt/labkit/scoreboard"
        board.mkdir(parents=True)
        (board / "scoreboard.csv").write_text("student,lab,config,passed,total,status\n")


def test_collect_brings_notebooks_back_by_student_and_merges_the_scoreboards(tmp_path):
    w = Workshop(
        tmp_path,
        SETTINGS,
        {**NAMES, "tpu_names": ["spmd-tpu-00", "spmd-tpu-01"], "cpu_names": ["spmd-cpu-00"]},
    )
    _remote_vm(w.remote, "spmd-tpu-00", graded=True)
    _remote_vm(w.remote, "spmd-tpu-01", graded=False)
    _remote_vm(w.remote, "spmd-cpu-00", graded=True)
    out = tmp_path / "results"
    result = w("collect", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    for student in ("tpu-00", "tpu-01", "cpu-00"):
        assert (out / "submissions" / student / "lab-3.ipynb").exists(), f"{student}'s notebook not collected"
    scp = [c for c in w.calls("gcloud") if "scp" in c]
    assert all("--worker=0" in c for c in scp if "tpus" in c)
    assert all("--tunnel-through-iap" in c for c in scp)
    assert "spmd-tpu-01: no results there" in result.stdout
    assert w.calls("nox") == [
        [
            "-f",
            str(ROOT / "noxfile.py"),
            "-s",
            "scoreboard",
            "--",
            "merge",
            str(out / "vms/spmd-tpu-00/scoreboard"),
            str(out / "vms/spmd-cpu-00/scoreboard"),
            "--out",
            str(out / "scoreboard"),
        ]
    ]
    assert (w.logs / "spmd.collected").exists(), "down may now run"


def test_collect_takes_an_unreachable_vms_work_from_its_last_backup(tmp_path):
    w = Workshop(tmp_path, SETTINGS, {**NAMES, "tpu_names": ["spmd-tpu-00"], "cpu_names": []})
    saved = w.remote / "bucket/my-course-project-spmd-labs/labs/tpu-00"
    saved.mkdir(parents=True)
    (saved / "lab-3.ipynb").write_text('{"cells": ["saved before preemption"]}')
    out = tmp_path / "results"
    result = w("collect", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "unreachable; its last backup came from gs://my-course-project-spmd-labs/labs/tpu-00" in result.stdout
    )
    assert "saved before preemption" in (out / "submissions/tpu-00/lab-3.ipynb").read_text()


# ---- idle ------------------------------------------------------------------------------------------


def test_idle_deletes_only_the_tpu_vms_that_saved_their_work_and_went_idle(tmp_path):
    w = Workshop(
        tmp_path, SETTINGS, NAMES, ssh={"spmd-tpu-01": "idle: 60 minutes without use, labs/ saved 14:05"}
    )
    result = w("idle", "--yes")
    assert result.returncode == 0, result.stderr
    deletes = [c for c in w.calls("gcloud") if "delete" in c]
    assert [c[4] for c in deletes] == ["spmd-tpu-01"]


# ---- down ------------------------------------------------------------------------------------------


def test_down_refuses_before_the_work_is_collected(workshop):
    result = workshop("down", "--yes")
    assert result.returncode == 2 and "make workshop-collect" in result.stderr and "--force" in result.stderr
    assert workshop.calls("terraform") == []


def test_down_destroys_everything_and_finds_nothing_left(workshop):
    workshop.collected()
    result = workshop("down", "--yes")
    assert result.returncode == 0, result.stderr
    tf = workshop.calls("terraform")
    assert [
        f"-chdir={INFRA}",
        "destroy",
        "-input=false",
        "-auto-approve",
        f"-var-file={workshop.tmp / 'workshop.tfvars'}",
    ] in tf
    checked = {(c[1], c[2]) for c in workshop.calls("gcloud") if "list" in c}
    assert checked == {
        ("tpus", "tpu-vm"),
        ("tpus", "queued-resources"),
        ("instances", "list"),
        ("disks", "list"),
        ("buckets", "list"),
    }
    assert "nothing labelled workshop=spmd is left" in result.stdout
    assert not (workshop.logs / "spmd.collected").exists(), "the next workshop starts uncollected"


def test_down_with_force_destroys_uncollected_work(workshop):
    result = workshop("down", "--yes", "--force")
    assert result.returncode == 0, result.stderr
    assert any("destroy" in c for c in workshop.calls("terraform"))


def test_down_fails_loudly_when_something_labelled_survives(tmp_path):
    w = Workshop(
        tmp_path,
        SETTINGS,
        NAMES,
        left={
            "tpus": "spmd-tpu-02",
            "queued": "spmd-tpu-03\nother-course-qr",
            "buckets": "my-course-project-spmd-labs",
        },
    )
    w.collected()
    result = w("down", "--yes")
    assert result.returncode == 1
    assert "STILL THERE" in result.stderr
    for left in (
        "tpu vm: spmd-tpu-02",
        "queued resource: spmd-tpu-03",
        "bucket: my-course-project-spmd-labs",
    ):
        assert left in result.stderr
    assert "other-course-qr" not in result.stderr, "another workshop's queued resource is not ours"


def test_a_failed_destroy_still_lists_what_is_left_and_exits_non_zero(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES, fail=["destroy"], left={"instances": "spmd-cpu-01"})
    w.collected()
    result = w("down", "--yes")
    assert result.returncode == 1
    assert "terraform destroy FAILED" in result.stderr and "instance: spmd-cpu-01" in result.stderr
    assert any("list" in c for c in w.calls("gcloud")), "the check runs after the failure"


def test_a_failed_destroy_with_nothing_labelled_left_is_still_a_failure(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES, fail=["destroy"])
    w.collected()
    result = w("down", "--yes")
    assert result.returncode == 1 and "run `workshop.sh down` again" in result.stderr


def test_down_without_a_yes_destroys_nothing(workshop):
    workshop.collected()
    result = workshop("down", input="\n")
    assert result.returncode != 0
    assert workshop.calls("terraform") == []


# ---- queued resources ------------------------------------------------------------------------------

QUEUED_ARGS = [
    "--node-id",
    "NAME",
    "--project",
    "my-course-project",
    "--zone",
    "us-central1-a",
    "--accelerator-type",
    "v5litepod-8",
    "--runtime-version",
    "v2-alpha-tpuv5-lite",
    "--service-account",
    "spmd-labkit-vm@my-course-project.iam.gserviceaccount.com",
    "--scopes",
    "https://www.googleapis.com/auth/devstorage.read_write",
    "--internal-ips",
    "--spot",
    "--metadata",
    "labkit-student=STUDENT,labkit-repo=https://example.org/course/labkit.git",
]
QUEUED_NAMES = {
    **NAMES,
    "queued_create": {
        name: [a.replace("NAME", name).replace("STUDENT", NAMES["students"][name]) for a in QUEUED_ARGS]
        for name in NAMES["tpu_names"]
    },
}


def test_with_queued_resources_up_asks_for_each_tpu_vm_that_is_not_there_yet(tmp_path):
    w = Workshop(
        tmp_path,
        SETTINGS + "    spot = true\n    queued_resources = true\n",
        QUEUED_NAMES,
        states={"spmd-tpu-00": "READY"},
        queued_states={"spmd-tpu-01": "WAITING_FOR_RESOURCES"},
    )
    result = w("up", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    creates = [c for c in w.calls("gcloud") if c[:4] == ["compute", "tpus", "queued-resources", "create"]]
    assert len(creates) == 1, "spmd-tpu-00 exists and spmd-tpu-01 is queued already"
    assert creates[0] == [
        "compute",
        "tpus",
        "queued-resources",
        "create",
        "spmd-tpu-02",
        *QUEUED_NAMES["queued_create"]["spmd-tpu-02"],
        "--metadata-from-file",
        f"startup-script={INFRA / 'startup.sh'}",
    ]
    assert "spmd-tpu-01: WAITING_FOR_RESOURCES" in result.stdout


def test_a_suspended_queued_resource_is_deleted_and_asked_for_again(tmp_path):
    w = Workshop(
        tmp_path,
        SETTINGS + "    spot = true\n    queued_resources = true\n",
        QUEUED_NAMES,
        queued_states={"spmd-tpu-01": "SUSPENDED"},
    )
    result = w("up", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    gcloud = w.calls("gcloud")
    deletes = [c for c in gcloud if c[:4] == ["compute", "tpus", "queued-resources", "delete"]]
    assert deletes and deletes[0][4] == "spmd-tpu-01" and "--force" in deletes[0]


def test_down_deletes_the_workshops_queued_resources_before_terraform_destroys(tmp_path):
    w = Workshop(
        tmp_path,
        SETTINGS + "    queued_resources = true\n",
        QUEUED_NAMES,
        queued_states={"spmd-tpu-00": "ACTIVE", "another-course-qr": "ACTIVE"},
    )
    w.collected()
    result = w("down", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    raw = [json.loads(line) for line in w.log.read_text().splitlines()]
    deletes = [i for i, c in enumerate(raw) if c[1:5] == ["compute", "tpus", "queued-resources", "delete"]]
    assert [raw[i][5] for i in deletes] == ["spmd-tpu-00"], "only this workshop's"
    destroy = next(i for i, c in enumerate(raw) if c[0] == "terraform" and "destroy" in c)
    assert deletes[0] < destroy


# ---- make targets ----------------------------------------------------------------------------------


def test_make_targets_go_through_the_front_door(workshop):
    up = run(["make", "-s", "workshop-up", "YES=1"], env=workshop.env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "Estimated cost" in up.stdout
    links = run(["make", "-s", "workshop-links"], env=workshop.env)
    assert links.returncode == 0 and "--tunnel-through-iap -- -N -L 8888:localhost:8888" in links.stdout
    lab = run(["make", "-s", "workshop-run", "RUN=lab 4 --configs tpu"], env=workshop.env)
    assert lab.returncode == 0, lab.stdout + lab.stderr
    refused = run(["make", "-s", "workshop-down", "YES=1"], env=workshop.env)
    assert refused.returncode != 0, "not before collect"
    graded = run(
        ["make", "-s", "workshop-grade", "LABS=4", f"RESULTS={workshop.tmp / 'results'}"], env=workshop.env
    )
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert workshop.calls("nox")[-1][-2:] == ["--labs", "4"]
    down = run(["make", "-s", "workshop-down", "YES=1"], env=workshop.env)
    assert down.returncode == 0, down.stdout + down.stderr
    actions = [c[1] for c in workshop.calls("terraform") if c[1] in ("apply", "destroy")]
    assert actions == ["apply", "destroy"]
    assert any(
        c[-1].endswith("make lab-4 CONFIGS=tpu EXTRAS=tpu DEP_GROUPS=notebook LABKIT_TPU_HOSTS=1")
        for c in workshop.calls("gcloud")
    )
