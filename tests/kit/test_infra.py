"""Workshop infrastructure (infra/): what can be checked without a cloud account.

The Terraform is checked by `terraform fmt`, by parsing it with python-hcl2, by real `terraform plan`
runs on the variable files alone (validation needs no provider), and by checkov; the scripts by
shellcheck; the startup script runs for real in a temporary folder in CPU mode; the front door
(workshop.sh) runs against recording stand-ins for `gcloud`, `terraform` and `nox`; the GKE grading
Job is parsed and its sharded grading is run locally, two shards merged against one whole run.
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
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
VENV_BIN = Path(sys.executable).parent
SCRIPTS = sorted(INFRA.rglob("*.sh"))


# ----------------------------------------------------------------------------------------
# Reading HCL. Two distributions install the module `hcl2`: python-hcl2 (8.x: strings keep their
# quotes, attributes are plain values) and checkov's bc-python-hcl2 (every attribute wrapped in a
# one-element list); whichever was installed last is imported. These helpers read both the same way.
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
    """An attribute's value (unwrapped from bc-python-hcl2's one-element list)."""
    value = block[name]
    if isinstance(value, list) and len(value) == 1:
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
    for name in ("project", "zone", "accelerator_type", "runtime_version", "vms", "spot", "preemptible",
                 "network", "labels", "workshop", "service_account", "scopes"):
        assert name in v, f"variable {name} missing"
        assert attr(v[name], "description"), f"variable {name} has no description"
        assert "type" in v[name], f"variable {name} has no type"
    assert "default" not in v["project"], "the project must be chosen, never defaulted"


def test_default_accelerator_is_eight_devices_on_one_host():
    for folder in (INFRA, INFRA / "modules/tpu_vm"):
        v = variables(folder)
        assert attr(v["accelerator_type"], "default") == "v5litepod-8"
        assert attr(v["runtime_version"], "default") == "v2-alpha-tpuv5-lite"
    row = [line.split("\t") for line in (INFRA / "prices.tsv").read_text().splitlines()
           if line.startswith("v5litepod-8\t")][0]
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


GOOD = {"project": "my-course-project", "workshop": "spmd-2026", "kit_repo": "https://example.org/course/labkit.git"}


def test_the_example_settings_pass_validation(tmp_path):
    result = _plan(tmp_path, INFRA / "variables.tf", **GOOD, tpu_count=10, cpu_count=2)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("bad, message", [
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
])
def test_validation_rejects_bad_settings(tmp_path, bad, message):
    result = _plan(tmp_path, INFRA / "variables.tf", **{**GOOD, **bad})
    assert result.returncode != 0
    assert message in re.sub(r"\s+", " ", result.stderr), result.stderr


def test_module_variables_validate_the_same_way(tmp_path):
    tpu = dict(project="my-course-project", workshop="w", startup_script="#!/bin/sh", kit_repo="https://x/y.git",
               service_account="w-labkit-vm@my-course-project.iam.gserviceaccount.com", network_tag="w-labkit")
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
    roster = _roster(tmp_path, """\
        student,account,kind
        ada,ada@example.org,tpu
        cy,cy@example.org,cpu
        """)
    result = _plan(tmp_path, INFRA / "variables.tf", **GOOD, roster=roster)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("row", ["Ada Lovelace,ada@example.org,tpu", "ada,not-an-email,tpu", "ada,ada@example.org,gpu"])
def test_validation_rejects_a_bad_roster_row(tmp_path, row):
    roster = _roster(tmp_path, f"student,account,kind\n{row}\n")
    result = _plan(tmp_path, INFRA / "variables.tf", **GOOD, roster=roster)
    assert result.returncode != 0
    assert "every roster row needs a student id" in re.sub(r"\s+", " ", result.stderr), result.stderr


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
    cpu = attr(resources(INFRA / "modules/cpu_vm/main.tf")[("google_compute_instance", "vm")], "service_account")
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
    for (folder, rtype, name), body in iam.items():
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
    tpu = dict(project="my-course-project", workshop="w", startup_script="#!/bin/sh", kit_repo="https://x/y.git",
               network_tag="w-labkit")
    bad = _plan(tmp_path, INFRA / "modules/tpu_vm/variables.tf", **tpu,
                service_account="123456789-compute@developer.gserviceaccount.com")
    assert bad.returncode != 0 and "never the default compute one" in re.sub(r"\s+", " ", bad.stderr)
    wide = _plan(tmp_path, INFRA / "modules/tpu_vm/variables.tf", **tpu,
                 service_account="w-labkit-vm@my-course-project.iam.gserviceaccount.com",
                 scopes='["https://www.googleapis.com/auth/cloud-platform"]')
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
        assert attr(resources(INFRA / f"modules/{module}/main.tf")[(rtype, "vm")], "tags") == ["var.network_tag"]


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
    disk = attr(attr(resources(INFRA / "modules/cpu_vm/main.tf")[("google_compute_instance", "vm")], "boot_disk"),
                "initialize_params")
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
    assert attr(modules["tpu"], "vms") == "local.tpu_vms"
    assert attr(modules["cpu"], "vms") == "local.cpu_vms"
    assert "startup.sh" in attr(config["locals"][0], "startup_script")
    providers = hcl(INFRA / "versions.tf")["terraform"][0]["required_providers"]
    assert "hashicorp/google-beta" in json.dumps(providers)


@pytest.fixture(scope="module")
def checkov_reports() -> dict[str, dict]:
    """One checkov run over infra/ (Terraform and Kubernetes): {check_type: report}."""
    checkov = VENV_BIN / "checkov"
    if not checkov.exists():
        pytest.skip("checkov is not installed (uv sync with the infra group)")
    # The example settings make count > 0, so that checkov sees the VMs (with count = 0 it checks nothing).
    result = run([str(checkov), "--skip-download", "--compact", "--quiet", "-o", "json", "-d", str(INFRA),
                  "--framework", "terraform", "kubernetes", "--var-file", str(INFRA / "workshop.tfvars.example")],
                 env=dict(os.environ, BC_SKIP_MAPPING="TRUE"), timeout=300)
    data = json.loads(result.stdout)
    return {r["check_type"]: r for r in (data if isinstance(data, list) else [data])}


@pytest.mark.parametrize("check_type, at_least", [("terraform", 10), ("kubernetes", 50)])
def test_checkov_passes(checkov_reports, check_type, at_least):
    report = checkov_reports[check_type]
    failed = report["results"]["failed_checks"]
    assert not failed, "\n".join(f"{c['check_id']} {c['check_name']} ({c['resource']})" for c in failed)
    assert report["summary"]["passed"] >= at_least, "checkov checked (almost) nothing"


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


# ----------------------------------------------------------------------------------------
# The front door, against recording stand-ins for gcloud, terraform and nox
# ----------------------------------------------------------------------------------------

FAKE = r'''
import json, os, shutil, sys
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([tool, *args]) + "\n")
canned = json.load(open(os.environ["FAKE_CANNED"]))
if tool == "terraform":
    if "output" in args:
        print(json.dumps(canned["outputs"][args[-1]]))
    else:
        print("terraform " + " ".join(a for a in args if not a.startswith("-chdir")) + ": done")
elif tool == "gcloud":
    if "list" in args:
        kind = "tpus" if "tpus" in args else args[1]
        print(canned.get("left", {}).get(kind, ""))
    elif "scp" in args:
        sources = [a for a in args if ":" in a and not a.startswith("-")]
        missing = 0
        for src in sources:
            vm, path = src.split(":", 1)
            there = os.path.join(os.environ["FAKE_REMOTE"], vm, path.lstrip("/"))
            if os.path.isdir(there):
                shutil.copytree(there, os.path.join(args[-1], os.path.basename(path)), dirs_exist_ok=True)
            else:
                print(f"scp: {path}: No such file or directory", file=sys.stderr)
                missing += 1
        sys.exit(1 if missing else 0)
    elif "ssh" in args:
        sys.stdin.read()  # as ssh does: whatever the script left on standard input is gone
        print(canned.get("ssh", "ready"))
elif tool == "nox":
    print("nox " + " ".join(args))
'''


class Workshop:
    """Runs infra/workshop.sh with fake gcloud, terraform and nox first on the PATH."""

    def __init__(self, tmp_path: Path, tfvars: str, outputs: dict, left: dict | None = None):
        self.tmp = tmp_path
        self.log = tmp_path / "calls.jsonl"
        self.remote = tmp_path / "remote"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for tool in ("gcloud", "terraform", "nox"):
            (bin_dir / tool).write_text(f"#!{sys.executable}\n{FAKE}")
            (bin_dir / tool).chmod(0o755)
        (tmp_path / "canned.json").write_text(json.dumps({"outputs": outputs, "left": left or {}}))
        (tmp_path / "workshop.tfvars").write_text(textwrap.dedent(tfvars))
        self.env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(self.log),
                        FAKE_CANNED=str(tmp_path / "canned.json"), FAKE_REMOTE=str(self.remote),
                        WORKSHOP_TFVARS=str(tmp_path / "workshop.tfvars"), WORKSHOP_LOGS=str(tmp_path / "logs"),
                        LABKIT_NOX=str(bin_dir / "nox"))

    def __call__(self, *args: str, input: str = "") -> subprocess.CompletedProcess:
        return run(["bash", str(INFRA / "workshop.sh"), *args], env=self.env, input=input)

    def calls(self, tool: str | None = None) -> list[list[str]]:
        if not self.log.exists():
            return []
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c[1:] for c in calls if tool is None or c[0] == tool]


SETTINGS = """\
    project          = "my-course-project"
    workshop         = "spmd"
    kit_repo         = "https://example.org/course/labkit.git"
    zone             = "us-central1-a"
    tpu_count        = 3
    accelerator_type = "v5litepod-8" # 8 chips, one host
    cpu_count        = 2
    machine_type     = "e2-standard-4"
    """
NAMES = {"tpu_names": ["spmd-tpu-00", "spmd-tpu-01", "spmd-tpu-02"], "cpu_names": ["spmd-cpu-00", "spmd-cpu-01"],
         "ssh_commands": ["gcloud compute tpus tpu-vm ssh spmd-tpu-00 --zone us-central1-a"]}


@pytest.fixture
def workshop(tmp_path):
    return Workshop(tmp_path, SETTINGS, NAMES)


def test_up_prints_the_cost_per_hour_before_it_applies(workshop):
    result = workshop("up", "--yes")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "3 x v5litepod-8" in out and "$28.80/h" in out  # 3 x $9.60
    assert "2 x e2-standard-4" in out and "$0.27/h" in out  # 2 x $0.134
    assert "Estimated cost: $29.07 per hour" in out
    assert "estimate" in out.lower() and "2026-11-22" in out, "say it is an estimate, and of when"
    assert out.index("Estimated cost") < out.index("terraform apply"), "the cost comes before anything starts"
    tf = workshop.calls("terraform")
    assert tf[0] == [f"-chdir={INFRA}", "init", "-input=false"]
    assert tf[1] == [f"-chdir={INFRA}", "apply", "-input=false", "-auto-approve",
                     f"-var-file={workshop.tmp / 'workshop.tfvars'}"]
    assert "gcloud compute tpus tpu-vm ssh spmd-tpu-00" in out, "hand out the ssh commands"


def test_a_relative_settings_path_still_reaches_terraform(workshop):
    workshop.env["WORKSHOP_TFVARS"] = "workshop.tfvars"
    result = run(["bash", str(INFRA / "workshop.sh"), "up", "--yes"], env=workshop.env, cwd=workshop.tmp)
    assert result.returncode == 0, result.stderr
    apply = [c for c in workshop.calls("terraform") if "apply" in c][0]
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


def test_up_names_an_accelerator_it_has_no_price_for(tmp_path):
    w = Workshop(tmp_path, SETTINGS.replace("v5litepod-8", "v5litepod-256"), NAMES)
    result = w("cost")
    assert "no price known for this type" in result.stdout


def test_without_settings_the_script_says_what_to_copy(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES)
    w.env["WORKSHOP_TFVARS"] = str(tmp_path / "missing.tfvars")
    result = w("up", "--yes")
    assert result.returncode == 2
    assert "workshop.tfvars.example" in result.stderr
    assert w.calls() == []


def test_status_lists_the_labelled_vms_and_each_kits_status(workshop):
    result = workshop("status")
    assert result.returncode == 0, result.stderr
    gcloud = workshop.calls("gcloud")
    lists = [c for c in gcloud if "list" in c]
    assert any(c[:4] == ["compute", "tpus", "tpu-vm", "list"] and "labels.workshop=spmd" in c for c in lists)
    assert any(c[:3] == ["compute", "instances", "list"] and "labels.workshop=spmd" in c for c in lists)
    ssh = [c for c in gcloud if "ssh" in c]
    assert len(ssh) == 5
    assert all("cat /var/lib/labkit/status" in c[-1] for c in ssh)


def test_run_lab_runs_on_every_worker_of_every_tpu_vm(workshop):
    result = workshop("run", "lab", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    gcloud = workshop.calls("gcloud")
    for name in NAMES["tpu_names"]:
        assert ["compute", "tpus", "tpu-vm", "ssh", name, "--project", "my-course-project", "--zone", "us-central1-a",
                "--worker=all", "--command", "cd /opt/labkit && LABKIT_TPU_HOSTS=1 make lab-3 CONFIGS=tpu"] in gcloud
    for name in NAMES["cpu_names"]:
        assert ["compute", "ssh", name, "--project", "my-course-project", "--zone", "us-central1-a",
                "--command", "cd /opt/labkit && make lab-3 CONFIGS=cpu-1,cpu-8"] in gcloud
    assert (workshop.tmp / "logs" / "spmd-tpu-01.log").exists(), "one log per VM"


def test_a_workshop_without_cpu_vms_reaches_only_its_tpu_vms(tmp_path):
    w = Workshop(tmp_path, SETTINGS, {"tpu_names": ["spmd-tpu-00"], "cpu_names": []})
    result = w("run", "lab", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    ssh = [c for c in w.calls("gcloud") if "ssh" in c]
    assert len(ssh) == 1 and ssh[0][4] == "spmd-tpu-00"
    assert "on 1 VM(s)" in result.stdout


def test_run_lab_takes_the_configurations_to_run(workshop):
    workshop("run", "lab", "5", "--configs", "cpu-8")
    calls = workshop.calls("gcloud")
    tpu = [c[-1] for c in calls if c[:2] == ["compute", "tpus"]]
    cpu = [c[-1] for c in calls if c[:2] != ["compute", "tpus"]]
    assert tpu and all(c == "cd /opt/labkit && LABKIT_TPU_HOSTS=1 make lab-5 CONFIGS=cpu-8" for c in tpu)
    assert cpu and all(c == "cd /opt/labkit && make lab-5 CONFIGS=cpu-8" for c in cpu)


def test_run_grade_grades_each_vms_own_notebooks_there(workshop):
    result = workshop("run", "grade", "--labs", "3")
    assert result.returncode == 0, result.stderr
    tpu = [c for c in workshop.calls("gcloud") if c[:4] == ["compute", "tpus", "tpu-vm", "ssh"]]
    assert len(tpu) == 3 and all("--worker=all" in c for c in tpu)
    command = tpu[0][-1]
    assert "cp labs/lab-*.ipynb submissions/$(hostname -s)/" in command
    assert command.endswith(".venv/bin/nox -s grade -- --submissions submissions --out scoreboard --labs 3")


def test_run_rejects_an_unknown_request(workshop):
    result = workshop("run", "lab", "three")
    assert result.returncode == 2 and "usage" in result.stderr
    assert workshop.calls("gcloud") == []


def _remote_vm(remote: Path, name: str, *, graded: bool) -> None:
    labs = remote / name / "opt/labkit/labs"
    labs.mkdir(parents=True)
    (labs / "lab-3.ipynb").write_text('{"cells": []}')
    if graded:
        board = remote / name / "opt/labkit/scoreboard"
        board.mkdir(parents=True)
        (board / "scoreboard.csv").write_text("student,lab,config,passed,total,status\n")


def test_collect_brings_notebooks_back_and_merges_the_scoreboards(tmp_path):
    w = Workshop(tmp_path, SETTINGS, {"tpu_names": ["spmd-tpu-00", "spmd-tpu-01"], "cpu_names": ["spmd-cpu-00"]})
    _remote_vm(w.remote, "spmd-tpu-00", graded=True)
    _remote_vm(w.remote, "spmd-tpu-01", graded=False)
    _remote_vm(w.remote, "spmd-cpu-00", graded=True)
    out = tmp_path / "results"
    result = w("collect", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("spmd-tpu-00", "spmd-tpu-01", "spmd-cpu-00"):
        assert (out / "submissions" / name / "lab-3.ipynb").exists(), f"{name}'s notebook not collected"
    scp = [c for c in w.calls("gcloud") if "scp" in c]
    assert all("--worker=0" in c for c in scp if "tpus" in c)
    assert "spmd-tpu-01: no results there" in result.stdout
    nox = w.calls("nox")
    assert nox == [["-f", str(ROOT / "noxfile.py"), "-s", "scoreboard", "--", "merge",
                    str(out / "vms/spmd-cpu-00/scoreboard"), str(out / "vms/spmd-tpu-00/scoreboard"),
                    "--out", str(out / "scoreboard")]]


def test_down_destroys_everything_and_finds_nothing_left(workshop):
    result = workshop("down", "--yes")
    assert result.returncode == 0, result.stderr
    tf = workshop.calls("terraform")
    assert [f"-chdir={INFRA}", "destroy", "-input=false", "-auto-approve",
            f"-var-file={workshop.tmp / 'workshop.tfvars'}"] in tf
    gcloud = workshop.calls("gcloud")
    checked = {c[1] for c in gcloud if "list" in c and "labels.workshop=spmd" in c}
    assert checked == {"tpus", "instances", "disks"}
    assert "nothing labelled workshop=spmd is left" in result.stdout


def test_down_fails_loudly_when_something_labelled_survives(tmp_path):
    w = Workshop(tmp_path, SETTINGS, NAMES, left={"tpus": "spmd-tpu-02"})
    result = w("down", "--yes")
    assert result.returncode == 1
    assert "STILL THERE" in result.stderr and "spmd-tpu-02" in result.stderr


def test_down_without_a_yes_destroys_nothing(workshop):
    result = workshop("down", input="\n")
    assert result.returncode != 0
    assert workshop.calls("terraform") == []


def test_make_targets_go_through_the_front_door(workshop):
    up = run(["make", "-s", "workshop-up", "YES=1"], env=workshop.env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "Estimated cost" in up.stdout
    lab = run(["make", "-s", "workshop-run", "RUN=lab 4 --configs tpu"], env=workshop.env)
    assert lab.returncode == 0, lab.stdout + lab.stderr
    down = run(["make", "-s", "workshop-down", "YES=1"], env=workshop.env)
    assert down.returncode == 0, down.stdout + down.stderr
    actions = [c[1] for c in workshop.calls("terraform") if c[1] in ("apply", "destroy")]
    assert actions == ["apply", "destroy"]
    assert any(c[-1] == "cd /opt/labkit && make lab-4 CONFIGS=tpu" for c in workshop.calls("gcloud"))


def test_on_a_slice_of_several_hosts_every_worker_is_told_how_many_join(tmp_path):
    slice_settings = SETTINGS.replace('"v5litepod-8" # 8 chips, one host', '"v5litepod-16" # 16 chips, 4 hosts')
    workshop = Workshop(tmp_path, slice_settings, NAMES)
    assert workshop("run", "lab", "11").returncode == 0
    tpu = [c for c in workshop.calls("gcloud") if c[:4] == ["compute", "tpus", "tpu-vm", "ssh"]]
    assert tpu and all("--worker=all" in c and c[-1] == "cd /opt/labkit && LABKIT_TPU_HOSTS=4 make lab-11 CONFIGS=tpu"
                       for c in tpu)
