"""Workshop infrastructure (infra/): the Terraform and the scripts, checked without a cloud account.

The Terraform is checked by `terraform fmt`, by parsing it with python-hcl2 (the VMs' service account,
scopes, access, firewall, labels), by real `terraform plan` runs on the variable files alone (validation
needs no provider), and by checkov (the kit's pinned one and a current one, each in a tool environment of its own); the scripts by shellcheck.
Elsewhere: test_infra_schema.py (every argument against the providers' schema), test_infra_startup.py
(startup.sh run locally), test_infra_workshop.py (workshop.sh against recording stand-ins) and
test_infra_k8s.py and test_infra_k8s_pods.py (the GKE grading Jobs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import hcl2
import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
VENV_BIN = Path(sys.executable).parent
SCRIPTS = sorted(INFRA.rglob("*.sh"))


# ----------------------------------------------------------------------------------------
# Reading HCL with python-hcl2 (8.x: strings keep their quotes, attributes are plain values). checkov's
# bc-python-hcl2 installs a module of the same name, so checkov never shares .venv with it (below).
# ----------------------------------------------------------------------------------------


def _unquote(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] == '"' else s


def _plain(x):
    if isinstance(x, dict):
        return {_unquote(k): _plain(v) for k, v in x.items() if not k.startswith("__")}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, str):
        s = _unquote(x)
        if s.startswith("${") and s.endswith("}") and s.count("${") == 1:
            s = s[2:-1]
        return s
    return x


def hcl(path: Path) -> dict:
    with open(path) as f:
        return _plain(hcl2.load(f))


def attr(block: dict, name: str):
    """An attribute's value (a nested block, which python-hcl2 gives as a one-element list, unwrapped)."""
    value = block[name]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        return value[0]
    return value


def named(blocks: list[dict]) -> dict:
    """[{name: body}, ...] -> {name: body}, for variable, output and module blocks."""
    return {k: v for b in blocks for k, v in b.items()}


def resources(path: Path) -> dict:
    """{(type, name): body} of every resource in a file."""
    out = {}
    for block in hcl(path).get("resource", []):
        for rtype, by_name in block.items():
            for name, body in by_name.items():
                out[(rtype, name)] = body
    return out


def variables(folder: Path) -> dict:
    return named(hcl(folder / "variables.tf")["variable"])


def outputs(folder: Path) -> dict:
    return named(hcl(folder / "outputs.tf")["output"])


def run(cmd, *, env=None, timeout=120, cwd=ROOT, input=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout, input=input)


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.skip(f"{tool} is not installed on this machine")
    return path


# ----------------------------------------------------------------------------------------
# Terraform
# ----------------------------------------------------------------------------------------


def test_terraform_files_are_formatted():
    terraform = need("terraform")
    result = run([terraform, "fmt", "-check", "-recursive", "-diff", str(INFRA)])
    assert result.returncode == 0, f"run `terraform fmt -recursive infra`:\n{result.stdout}{result.stderr}"


def test_tpu_module_creates_google_tpu_v2_vms_with_the_beta_provider():
    vm = resources(INFRA / "modules/tpu_vm/main.tf")[("google_tpu_v2_vm", "vm")]
    assert attr(vm, "provider") == "google-beta"
    assert attr(vm, "for_each") == "var.vms" and attr(vm, "name") == "each.key"
    for field in ("project", "zone", "accelerator_type", "runtime_version"):
        assert attr(vm, field) == f"var.{field}"
    network = attr(vm, "network_config")
    assert attr(network, "network") == "var.network"
    scheduling = attr(vm, "scheduling_config")
    assert attr(scheduling, "spot") == "var.spot"
    assert attr(scheduling, "preemptible") == "var.preemptible"


def test_cpu_module_creates_compute_instances_that_install_the_kit():
    vm = resources(INFRA / "modules/cpu_vm/main.tf")[("google_compute_instance", "vm")]
    assert attr(vm, "for_each") == "var.vms" and attr(vm, "name") == "each.key"
    assert attr(vm, "machine_type") == "var.machine_type"
    metadata = attr(vm, "metadata")
    assert attr(metadata, "startup-script") == "var.startup_script"
    assert attr(metadata, "labkit-mode") == "cpu"
    assert attr(attr(vm, "network_interface"), "network") == "var.network"


def test_tpu_vms_run_the_startup_script_in_tpu_mode():
    metadata = attr(resources(INFRA / "modules/tpu_vm/main.tf")[("google_tpu_v2_vm", "vm")], "metadata")
    assert attr(metadata, "startup-script") == "var.startup_script"
    assert attr(metadata, "labkit-mode") == "tpu"
    assert attr(metadata, "labkit-repo") == "var.kit_repo"


def test_tpu_module_has_the_variables_a_workshop_sets():
    v = variables(INFRA / "modules/tpu_vm")
    for name in (
        "project",
        "zone",
        "accelerator_type",
        "runtime_version",
        "vms",
        "spot",
        "preemptible",
        "network",
        "labels",
        "workshop",
        "service_account",
        "scopes",
    ):
        assert name in v, f"variable {name} missing"
        assert attr(v[name], "description"), f"variable {name} has no description"
        assert "type" in v[name], f"variable {name} has no type"
    assert "default" not in v["project"], "the project must be chosen, never defaulted"


def test_default_accelerator_is_eight_devices_on_one_host():
    for folder in (INFRA, INFRA / "modules/tpu_vm"):
        v = variables(folder)
        assert attr(v["accelerator_type"], "default") == "v5litepod-8"
        assert attr(v["runtime_version"], "default") == "v2-alpha-tpuv5-lite"
    row = next(
        line.split("\t")
        for line in (INFRA / "prices.tsv").read_text().splitlines()
        if line.startswith("v5litepod-8\t")
    )
    assert row[2] == "1", "v5litepod-8 must be a single-host slice"
    assert "8 chips" in row[3]


@pytest.mark.parametrize("folder", ["", "modules/tpu_vm", "modules/cpu_vm"])
def test_variables_that_take_free_text_are_validated(folder):
    v = variables(INFRA / folder)
    validated = {name for name, body in v.items() if "validation" in body}
    assert {"project", "zone", "workshop", "labels"} <= validated
    for name in validated:
        for rule in v[name]["validation"]:
            assert f"var.{name}" in attr(rule, "condition")
            assert len(attr(rule, "error_message")) > 20, f"{name}: say what a good value looks like"


@pytest.mark.parametrize("folder", ["", "modules/tpu_vm", "modules/cpu_vm"])
def test_every_variable_used_is_declared_and_every_declared_one_is_used(folder):
    # What `terraform validate` would say, which cannot run here without the google providers.
    text = "".join(p.read_text() for p in (INFRA / folder).glob("*.tf") if p.name != "variables.tf")
    used = set(re.findall(r"\bvar\.(\w+)", text))
    declared = set(variables(INFRA / folder))
    assert used - declared == set(), "used but not declared"
    validations = (INFRA / folder / "variables.tf").read_text()
    assert declared - used - set(re.findall(r"\bvar\.(\w+)", validations)) == set(), "declared but never used"


def test_root_passes_each_module_its_required_variables_and_reads_only_its_outputs():
    modules = named(hcl(INFRA / "main.tf")["module"])
    root_outputs = (INFRA / "outputs.tf").read_text()
    for name, body in modules.items():
        folder = INFRA / attr(body, "source")
        declared = variables(folder)
        passed = {k for k in body if k not in ("source", "providers", "depends_on")}
        assert passed <= set(declared), f"module {name} takes no {passed - set(declared)}"
        required = {k for k, v in declared.items() if "default" not in v}
        assert required <= passed, f"module {name} needs {required - passed}"
        read = set(re.findall(rf"\bmodule\.{name}\.(\w+)", root_outputs))
        assert read <= set(outputs(folder)), f"module {name} has no output {read - set(outputs(folder))}"


def _plan(tmp_path: Path, variables_tf: Path, **values) -> subprocess.CompletedProcess:
    """`terraform plan` on a copy of a variables.tf alone: it needs no provider, and checks every validation."""
    terraform = need("terraform")
    work = tmp_path / "vars"
    if not work.exists():
        work.mkdir()
        shutil.copy(variables_tf, work / "variables.tf")
        init = run([terraform, "init", "-input=false", "-no-color"], cwd=work)
        assert init.returncode == 0, init.stdout + init.stderr
    args = []
    for k, value in values.items():
        args += ["-var", f"{k}={str(value).lower() if isinstance(value, bool) else value}"]
    env = dict(os.environ, TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1")
    return run([terraform, "plan", "-input=false", "-no-color", "-lock=false", *args], cwd=work, env=env)


GOOD = {
    "project": "my-course-project",
    "workshop": "spmd-2026",
    "kit_repo": "https://example.org/course/labkit.git",
}


def test_the_example_settings_pass_validation(tmp_path):
    result = _plan(tmp_path, INFRA / "variables.tf", **GOOD, tpu_count=10, cpu_count=2)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"accelerator_type": "tpu-8"}, "Cloud TPU type"),
        ({"project": "My_Project"}, "project ID"),
        ({"zone": "uscentral1"}, "us-central1-a"),
        ({"workshop": "Spring Workshop"}, "lowercase"),
        ({"tpu_count": 2.5}, "whole number"),
        ({"spot": True, "preemptible": True}, "not both"),
        ({"kit_repo": "labkit"}, "git URL"),
        ({"kit_repo": "git@github.com:course/labkit.git"}, "no ssh key"),
        ({"kit_repo": "ssh://git@example.org/labkit.git"}, "no ssh key"),
        ({"idle_minutes": 5}, "idle_minutes must be 0"),
        ({"billing_account": "my-billing"}, "012345-6789AB-CDEF01"),
        ({"queued_resources": True, "preemptible": True}, "not preemptible ones"),
    ],
)
def test_validation_rejects_bad_settings(tmp_path, bad, message):
    result = _plan(tmp_path, INFRA / "variables.tf", **{**GOOD, **bad})
    assert result.returncode != 0
    assert message in re.sub(r"\s+", " ", result.stderr), result.stderr


def test_module_variables_validate_the_same_way(tmp_path):
    tpu = {
        "project": "my-course-project",
        "workshop": "w",
        "startup_script": "#!/bin/sh",
        "kit_repo": "https://x/y.git",
        "service_account": "w-labkit-vm@my-course-project.iam.gserviceaccount.com",
        "network_tag": "w-labkit",
    }
    assert _plan(tmp_path, INFRA / "modules/tpu_vm/variables.tf", **tpu).returncode == 0
    bad = _plan(tmp_path, INFRA / "modules/tpu_vm/variables.tf", **tpu, accelerator_type="a100-8")
    assert bad.returncode != 0 and "Cloud TPU type" in bad.stderr


def test_an_ai_zone_passes_validation(tmp_path):
    result = _plan(tmp_path, INFRA / "variables.tf", **GOOD, zone="us-central1-ai1a")
    assert result.returncode == 0, result.stdout + result.stderr


def _roster(tmp_path: Path, text: str) -> str:
    path = tmp_path / "roster.csv"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_roster_of_students_and_accounts_passes_validation(tmp_path):
    roster = _roster(
        tmp_path,
        """\
        student,account,kind
        ada,ada@example.org,tpu
        cy,cy@example.org,cpu
        """,
    )
    result = _plan(tmp_path, INFRA / "variables.tf", **GOOD, roster=roster)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "row", ["Ada Lovelace,ada@example.org,tpu", "ada,not-an-email,tpu", "ada,ada@example.org,gpu"]
)
def test_validation_rejects_a_bad_roster_row(tmp_path, row):
    roster = _roster(tmp_path, f"student,account,kind\n{row}\n")
    result = _plan(tmp_path, INFRA / "variables.tf", **GOOD, roster=roster)
    assert result.returncode != 0
    assert "every roster row needs a student id" in re.sub(r"\s+", " ", result.stderr), result.stderr


def _roster_plan(tmp_path: Path, **values) -> dict:
    """infra/roster.tf planned with variables.tf alone: its locals, as one output."""
    terraform = need("terraform")
    work = tmp_path / "roster-plan"
    work.mkdir()
    shutil.copy(INFRA / "variables.tf", work)
    shutil.copy(INFRA / "roster.tf", work)
    (work / "show.tf").write_text(
        'output "o" {\n  value = { tpu = local.tpu_vms, cpu = local.cpu_vms, '
        "access = local.cpu_access, grants = keys(local.tpu_grants), "
        "regions = local.regions }\n}\n"
    )
    assert run([terraform, "init", "-input=false", "-no-color"], cwd=work).returncode == 0
    args = [a for k, v in {**GOOD, **values}.items() for a in ("-var", f"{k}={v}")]
    env = dict(os.environ, TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1")
    plan = run(
        [terraform, "plan", "-input=false", "-no-color", "-lock=false", "-out=plan", *args], cwd=work, env=env
    )
    assert plan.returncode == 0, plan.stdout + plan.stderr
    shown = run([terraform, "show", "-json", "plan"], cwd=work)
    return json.loads(shown.stdout)["planned_values"]["outputs"]["o"]["value"]


def test_a_roster_makes_one_vm_per_student_and_grants_only_theirs(tmp_path):
    roster = _roster(
        tmp_path,
        """\
        student,account,kind
        ada,ada@example.org,tpu
        bo,bo@example.org,
        cy,cy@example.org,cpu
        """,
    )
    o = _roster_plan(tmp_path, roster=roster, zone="us-central1-ai1a", tpu_count=7)
    assert o["tpu"] == {"spmd-2026-ada": "ada", "spmd-2026-bo": "bo"}, (
        "an empty kind is tpu; counts are ignored"
    )
    assert o["cpu"] == {"spmd-2026-cy": "cy"}
    assert o["access"] == {"spmd-2026-cy": "cy@example.org"}
    assert sorted(o["grants"]) == sorted(
        f"spmd-2026-{s} roles/{r}"
        for s in ("ada", "bo")
        for r in ("tpu.viewer", "compute.osLogin", "iap.tunnelResourceAccessor")
    )
    assert o["regions"] == ["us-central1"], "an AI zone's region"


def test_without_a_roster_seats_are_numbered_and_no_one_is_granted_anything(tmp_path):
    o = _roster_plan(tmp_path, tpu_count=2, cpu_count=1)
    assert o["tpu"] == {"spmd-2026-tpu-00": "tpu-00", "spmd-2026-tpu-01": "tpu-01"}
    assert o["cpu"] == {"spmd-2026-cpu-00": "cpu-00"}
    assert o["access"] == {} and o["grants"] == []


# ---- who the VMs are: a service account of their own, no project role, minimal scopes ------------

ROOT_TF = sorted(p for p in INFRA.glob("*.tf"))


def all_resources() -> dict:
    out = {}
    for path in [*ROOT_TF, *INFRA.glob("modules/*/*.tf")]:
        out.update({(path.parent.name, *key): body for key, body in resources(path).items()})
    return out


def test_every_vm_runs_as_the_workshops_own_account_with_the_storage_scope_only():
    tpu = attr(resources(INFRA / "modules/tpu_vm/main.tf")[("google_tpu_v2_vm", "vm")], "service_account")
    assert attr(tpu, "email") == "var.service_account" and attr(tpu, "scope") == "var.scopes"
    cpu = attr(
        resources(INFRA / "modules/cpu_vm/main.tf")[("google_compute_instance", "vm")], "service_account"
    )
    assert attr(cpu, "email") == "var.service_account" and attr(cpu, "scopes") == "var.scopes"
    for module in ("tpu_vm", "cpu_vm"):
        scopes = variables(INFRA / "modules" / module)["scopes"]
        assert attr(scopes, "default") == ["https://www.googleapis.com/auth/devstorage.read_write"]
    modules = named(hcl(INFRA / "main.tf")["module"])
    for name in ("tpu", "cpu"):
        assert attr(modules[name], "service_account") == "google_service_account.vm.email"
        assert "scopes" not in modules[name], "the modules' minimal default scopes are the ones used"


def test_the_vms_account_is_granted_nothing_on_the_project():
    iam = {k: v for k, v in all_resources().items() if "_iam_" in k[1]}
    assert iam, "expected the bucket grant and the students' grants"
    for (_folder, rtype, name), body in iam.items():
        if "google_service_account.vm" in str(attr(body, "member")):
            assert rtype == "google_storage_bucket_iam_member", f"{rtype}.{name} grants the VMs' account more"
            assert attr(body, "bucket") == "google_storage_bucket.labs.name"
            assert attr(body, "role") == "roles/storage.objectUser"
    project_level = [k for k in iam if k[1].startswith("google_project_iam")]
    for key in project_level:
        body = iam[key]
        assert attr(body, "member").startswith("user:"), "project grants go to students only"
        assert "condition" in body, "a student's project grant is narrowed to their own node"
    for rtype in ("google_project_iam_binding", "google_project_iam_policy"):
        assert not [k for k in iam if k[1] == rtype], f"{rtype} would replace the project's other grants"


def test_the_service_account_variable_refuses_the_default_compute_account(tmp_path):
    tpu = {
        "project": "my-course-project",
        "workshop": "w",
        "startup_script": "#!/bin/sh",
        "kit_repo": "https://x/y.git",
        "network_tag": "w-labkit",
    }
    bad = _plan(
        tmp_path,
        INFRA / "modules/tpu_vm/variables.tf",
        **tpu,
        service_account="123456789-compute@developer.gserviceaccount.com",
    )
    assert bad.returncode != 0 and "never the default compute one" in re.sub(r"\s+", " ", bad.stderr)
    wide = _plan(
        tmp_path,
        INFRA / "modules/tpu_vm/variables.tf",
        **tpu,
        service_account="w-labkit-vm@my-course-project.iam.gserviceaccount.com",
        scopes='["https://www.googleapis.com/auth/cloud-platform"]',
    )
    assert wide.returncode != 0 and "must not include cloud-platform" in re.sub(r"\s+", " ", wide.stderr)


# ---- reaching the VMs: private, through IAP, each student only their own ----------------------------


def test_vms_have_no_external_address_by_default():
    for folder in (INFRA, INFRA / "modules/tpu_vm", INFRA / "modules/cpu_vm"):
        assert attr(variables(folder)["external_ips"], "default") is False


def test_ssh_is_open_only_to_iaps_range_and_only_to_the_workshops_vms():
    firewalls = {k: v for k, v in all_resources().items() if k[1] == "google_compute_firewall"}
    assert len(firewalls) == 1
    rule = next(iter(firewalls.values()))
    assert attr(rule, "source_ranges") == ["35.235.240.0/20"]
    assert attr(rule, "direction") == "INGRESS" and attr(rule, "target_tags") == ["local.tag"]
    allow = attr(rule, "allow")
    assert attr(allow, "protocol") == "tcp" and attr(allow, "ports") == ["22"]
    modules = named(hcl(INFRA / "main.tf")["module"])
    assert attr(modules["tpu"], "network_tag") == attr(modules["cpu"], "network_tag") == "local.tag"
    for module, rtype in (("tpu_vm", "google_tpu_v2_vm"), ("cpu_vm", "google_compute_instance")):
        assert attr(resources(INFRA / f"modules/{module}/main.tf")[(rtype, "vm")], "tags") == [
            "var.network_tag"
        ]


def test_each_cpu_vm_gives_its_student_login_and_tunnel_on_that_instance_only():
    access = resources(INFRA / "access.tf")
    login = access[("google_compute_instance_iam_member", "os_login")]
    tunnel = access[("google_iap_tunnel_instance_iam_member", "tunnel")]
    assert attr(login, "role") == "roles/compute.osLogin", "not osAdminLogin: no sudo for students"
    assert attr(login, "instance_name") == "each.key" and attr(tunnel, "instance") == "each.key"
    assert attr(tunnel, "role") == "roles/iap.tunnelResourceAccessor"
    assert attr(login, "member") == attr(tunnel, "member") == "user:${each.value}"


def test_the_vms_never_accept_keys_from_project_metadata():
    for module, rtype in (("tpu_vm", "google_tpu_v2_vm"), ("cpu_vm", "google_compute_instance")):
        metadata = attr(resources(INFRA / f"modules/{module}/main.tf")[(rtype, "vm")], "metadata")
        assert str(attr(metadata, "enable-oslogin")).upper() == "TRUE"
        assert str(attr(metadata, "block-project-ssh-keys")).upper() == "TRUE"
        assert attr(metadata, "labkit-student") == "each.value"


def test_terraform_enables_the_apis_the_workshop_needs():
    api = resources(INFRA / "main.tf")[("google_project_service", "api")]
    assert "tpu.googleapis.com" in attr(api, "for_each") and "iap.googleapis.com" in attr(api, "for_each")
    assert "compute.googleapis.com" in attr(api, "for_each")
    assert attr(api, "disable_on_destroy") is False


def test_everything_created_carries_the_cost_tracking_labels():
    for module, rtype in (("tpu_vm", "google_tpu_v2_vm"), ("cpu_vm", "google_compute_instance")):
        text = hcl(INFRA / f"modules/{module}/main.tf")
        labels = attr(text["locals"][0], "labels")
        for key in ("workshop", "kit", "role"):
            assert key in labels, f"{module}: label {key} missing"
        assert "var.workshop" in labels and "var.labels" in labels
        vm = resources(INFRA / f"modules/{module}/main.tf")[(rtype, "vm")]
        labels = re.sub(r"[\s'${}]", "", attr(vm, "labels"))
        assert labels in ("merge(local.labels,student=each.value)", "merge(local.labels,student:each.value)")
    disk = attr(
        attr(resources(INFRA / "modules/cpu_vm/main.tf")[("google_compute_instance", "vm")], "boot_disk"),
        "initialize_params",
    )
    assert attr(disk, "labels") == "local.labels", "boot disks are billed too: label them"


def test_outputs_give_names_and_ssh_commands():
    tpu = outputs(INFRA / "modules/tpu_vm")
    assert "google_tpu_v2_vm.vm" in attr(tpu["names"], "value")
    assert "gcloud compute tpus tpu-vm ssh" in attr(tpu["ssh_commands"], "value")
    cpu = outputs(INFRA / "modules/cpu_vm")
    assert "gcloud compute ssh" in attr(cpu["ssh_commands"], "value")
    root = outputs(INFRA)
    for name in ("tpu_names", "cpu_names", "ssh_commands", "project", "workshop", "tpu_zone"):
        assert name in root, f"workshop.sh reads output {name}"


def test_root_configuration_wires_both_modules_and_the_startup_script():
    config = hcl(INFRA / "main.tf")
    modules = named(config["module"])
    assert attr(modules["tpu"], "source") == "./modules/tpu_vm"
    assert attr(modules["cpu"], "source") == "./modules/cpu_vm"
    assert attr(modules["tpu"], "vms") == "var.queued_resources ? {} : local.tpu_vms"
    assert attr(modules["cpu"], "vms") == "local.cpu_vms"
    assert "startup.sh" in attr(config["locals"][0], "startup_script")
    providers = hcl(INFRA / "versions.tf")["terraform"][0]["required_providers"]
    assert "hashicorp/google-beta" in json.dumps(providers)


# checkov runs in tool environments of its own (`uv tool run`), never in .venv: it brings bc-python-hcl2,
# which installs a module `hcl2` over python-hcl2's (the one these tests read HCL with), and pins of its
# own (packaging, pytest, ...) that stay out of the kit's lock. The kit's checkov is 3.1.47, its
# dependencies pinned by tools/checkov-3.1.47.txt; a current one (newer checks, CKV2_GCP_32 "Ensure TPU
# v2 is private" among them) is checked too.
KIT_CHECKOV = "3.1.47"
CURRENT_CHECKOV = "3.3.30"


def checkov_report(version: str) -> dict[str, dict]:
    """One run of checkov VERSION over infra/ (Terraform and Kubernetes): {check_type: report}."""
    uv = shutil.which("uv") or ROOT / ".tools/bin/uv"
    if not Path(uv).exists():
        pytest.skip("uv not found (run `make setup` first)")
    pins = ROOT / "tools" / f"checkov-{version}.txt"
    # The example settings make count > 0, so that checkov sees the VMs (with count = 0 it checks nothing).
    result = run(
        [
            str(uv),
            "tool",
            "run",
            "--python",
            sys.executable,
            "--from",
            f"checkov=={version}",
            *(["--constraints", str(pins)] if pins.exists() else []),
            "checkov",
            "--skip-download",
            "--compact",
            "-o",
            "json",
            "-d",
            str(INFRA),
            "--framework",
            "terraform",
            "kubernetes",
            "--var-file",
            str(INFRA / "workshop.tfvars.example"),
        ],
        env=dict(os.environ, BC_SKIP_MAPPING="TRUE", UV_PYTHON_DOWNLOADS="never"),
        timeout=600,
    )
    if not result.stdout.strip().startswith(("[", "{")):
        pytest.skip(f"checkov {version} could not be installed here: {result.stderr[-300:]}")
    data = json.loads(result.stdout)
    return {r["check_type"]: r for r in (data if isinstance(data, list) else [data])}


@pytest.fixture(scope="module")
def checkov_reports() -> dict[str, dict]:
    return checkov_report(KIT_CHECKOV)


@pytest.mark.parametrize("check_type, at_least", [("terraform", 10), ("kubernetes", 50)])
def test_checkov_passes(checkov_reports, check_type, at_least):
    report = checkov_reports[check_type]
    failed = report["results"]["failed_checks"]
    assert not failed, "\n".join(f"{c['check_id']} {c['check_name']} ({c['resource']})" for c in failed)
    assert report["summary"]["passed"] >= at_least, "checkov checked (almost) nothing"
    assert report["summary"]["checkov_version"] == KIT_CHECKOV


@pytest.fixture(scope="module")
def current_checkov_report() -> dict[str, dict]:
    return checkov_report(CURRENT_CHECKOV)


def test_a_current_checkov_passes_with_tpu_vms_private(current_checkov_report):
    for _check_type, report in current_checkov_report.items():
        failed = report["results"]["failed_checks"]
        assert not failed, "\n".join(f"{c['check_id']} {c['check_name']} ({c['resource']})" for c in failed)
        assert report["summary"]["checkov_version"] == CURRENT_CHECKOV
    passed = {
        (c["check_id"], c["resource"])
        for c in current_checkov_report["terraform"]["results"]["passed_checks"]
    }
    assert ("CKV2_GCP_32", "module.tpu.google_tpu_v2_vm.vm") in passed


def test_every_skipped_check_is_justified():
    skips = []
    for path in INFRA.rglob("*"):
        if path.suffix in (".tf", ".yaml"):
            for line in path.read_text().splitlines():
                m = re.search(r"#checkov:skip=(CKV\w+):(.*)|checkov\.io/skip\d+: (CKV\w+)=(.*)", line)
                if m:
                    skips.append((path.name, m.group(1) or m.group(3), (m.group(2) or m.group(4)).strip()))
    assert skips, "expected the known skips (CSEK disks, public IP, image digest)"
    for name, check, reason in skips:
        assert len(reason.split()) >= 6, f"{name}: {check} is skipped without a reason that explains it"


# ----------------------------------------------------------------------------------------
# Scripts
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_shellcheck_passes(script):
    shellcheck = need("shellcheck")
    result = run([shellcheck, "--severity=style", str(script)])
    assert result.returncode == 0, result.stdout


def test_there_are_scripts_to_check():
    assert {p.name for p in SCRIPTS} >= {"startup.sh", "workshop.sh"}
