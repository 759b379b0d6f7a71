"""Grading on GKE with one pod per unit (infra/k8s/grade-pods.yaml): plan, one pod per unit, a judge.

What the manifest claims about the pods that run student code is checked on the parsed YAML: GKE
Sandbox, no token and no Google identity, no Cloud Storage, a read-only root, only the unit's own
folders of the shared volume, no network (a deny-all policy selects them, no policy that allows egress
does), and the size and deadline of one notebook run. Each Job's command is parsed by the kit's own
CLI parser. The header must say what has and has not been run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labkit import cli
from labkit.course import configs
from labkit.grading import slurm
from labkit.run import execute
from labkit.run.allowance import DEFAULT_LIMITS, GiB

sys.path.insert(0, str(Path(__file__).parent))
from test_infra_k8s import (  # the shard manifest's helpers
    ROOT,
    assert_unprivileged_with_a_read_only_root,
    env_of,
    pod,
)

MANIFEST = ROOT / "infra/k8s/grade-pods.yaml"
SHARDS = ROOT / "infra/k8s/grade-job.yaml"
NAMESPACE = "labkit-pods"
FUSE = "gcsfuse.csi.storage.gke.io"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return _docs(MANIFEST)


@pytest.fixture(scope="module")
def k8s(docs) -> dict:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def unit(k8s) -> dict:
    return pod(k8s, "labkit-units")


def _selects(selector: dict, labels: dict) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions) selects a pod with `labels`."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        has, value = e["key"] in labels, labels.get(e["key"])
        if not {
            "In": has and value in e.get("values", []),
            "NotIn": not has or value not in e.get("values", []),
            "Exists": has,
            "DoesNotExist": not has,
        }[e["operator"]]:
            return False
    return True


def _policies_over(namespace: str) -> list[dict]:
    """Every NetworkPolicy in `namespace`, from both GKE manifests."""
    return [
        d
        for path in (MANIFEST, SHARDS)
        for d in _docs(path)
        if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == namespace
    ]


def _argv(shell: str, start: str) -> list[str]:
    """The words of the one command in a Job's shell line that begins with `start`, up to its `;` or `&&`."""
    found = re.search(re.escape(start) + r"[^;&]*", shell)
    assert found, f"no `{start}` in {shell!r}"
    return [word for word in shlex.split(found.group(0)) if word != "$@"]  # "$@": the inputs found


def _shell(k8s, job: str) -> str:
    return " ".join(pod(k8s, job)["containers"][0]["args"])


# ---- the namespace and its objects ---------------------------------------------------------


def test_every_object_lives_in_a_restricted_namespace_of_its_own(docs, k8s):
    namespace = k8s[("Namespace", NAMESPACE)]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == NAMESPACE, d["metadata"]["name"]


def test_the_shared_volume_is_a_read_write_many_filestore_claim(k8s):
    claim = k8s[("PersistentVolumeClaim", "labkit-work")]["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"] and claim["storageClassName"] == "standard-rwx"


@pytest.mark.parametrize("job", ["labkit-plan", "labkit-units", "labkit-judge"])
def test_every_pod_runs_unprivileged_under_gke_sandbox_with_a_read_only_root(k8s, job):
    spec = pod(k8s, job)
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False
    assert_unprivileged_with_a_read_only_root(spec)


@pytest.mark.parametrize("job", ["labkit-plan", "labkit-units", "labkit-judge"])
def test_every_pod_matches_the_course_image(k8s, job):
    """The folder, the user and the `python` each Job names are the course image's (Dockerfile)."""
    text = (ROOT / "Dockerfile").read_text()
    spec = pod(k8s, job)
    container = spec["containers"][0]
    kit = re.findall(r"^WORKDIR (\S+)", text, re.M)[-1]
    assert container["workingDir"] == kit
    assert f"USER {spec['securityContext']['runAsUser']}:" in text
    assert f"PATH={kit}/.venv/bin:" in text  # the image's python is the kit's environment
    assert re.search(
        r"(^|[ ;&])python -m labkit ", " ".join(container.get("command", []) + container.get("args", []))
    )


def test_no_role_binding_gives_the_pods_the_kubernetes_api(docs):
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]


# ---- a unit's pod: the sandbox --------------------------------------------------------------


def test_a_unit_pod_has_no_token_and_an_identity_no_bucket_grant_names(k8s, unit):
    account = unit["serviceAccountName"]
    assert account not in (
        pod(k8s, "labkit-plan")["serviceAccountName"],
        pod(k8s, "labkit-judge")["serviceAccountName"],
    )
    assert k8s[("ServiceAccount", account)]["automountServiceAccountToken"] is False
    assert unit["automountServiceAccountToken"] is False
    assert "iam.gke.io/gcp-service-account" not in k8s[("ServiceAccount", account)]["metadata"].get(
        "annotations", {}
    )
    grants = re.findall(r"add-iam-policy-binding \S+ --member \$K8S/([\w-]+)", MANIFEST.read_text())
    assert grants and account not in grants, "no Workload Identity binding for the units"


def test_a_unit_pod_mounts_no_cloud_storage(k8s, unit):
    assert not unit["volumes"] or all("csi" not in v for v in unit["volumes"])
    annotations = k8s[("Job", "labkit-units")]["spec"]["template"]["metadata"].get("annotations", {})
    assert "gke-gcsfuse/volumes" not in annotations, (
        "no FUSE sidecar (and its token) beside the student's code"
    )
    assert {v["name"]: next(k for k in v if k != "name") for v in unit["volumes"]} == {
        "work": "persistentVolumeClaim",
        "tmp": "emptyDir",
    }


def test_a_unit_pod_sees_only_its_own_plan_folder_read_only_and_its_own_output_folder(unit):
    volumes = {v["name"]: v for v in unit["volumes"]}
    assert volumes["work"]["persistentVolumeClaim"]["claimName"] == "labkit-work"
    mounts = {m["mountPath"]: m for m in unit["containers"][0]["volumeMounts"]}
    assert set(mounts) == {"/unit", "/out", "/tmp"}
    plan, out = mounts["/unit"], mounts["/out"]
    assert plan["name"] == out["name"] == "work" and "subPath" not in plan and "subPath" not in out
    assert plan["readOnly"] is True and re.fullmatch(
        r"plan/\$\(RUN\)/units/\$\(JOB_COMPLETION_INDEX\)", plan["subPathExpr"]
    )
    assert not out.get("readOnly") and re.fullmatch(
        r"runs/\$\(RUN\)/\$\(JOB_COMPLETION_INDEX\)", out["subPathExpr"]
    )
    assert parse_size(volumes["tmp"]["emptyDir"]["sizeLimit"]) == DEFAULT_LIMITS.disk


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)(Gi|Mi)", text)
    assert m, text
    return int(m.group(1)) * {"Gi": GiB, "Mi": 1 << 20}[m.group(2)]


def test_a_unit_pod_is_sized_and_timed_as_one_notebook_run(unit):
    limits = unit["containers"][0]["resources"]["limits"]
    assert limits["cpu"] == "1", "a CPU per notebook, as labkit/grading/slurm.py gives one"
    assert parse_size(limits["memory"]) == DEFAULT_LIMITS.memory + slurm.KIT_MEMORY
    deadline = unit["activeDeadlineSeconds"]
    assert execute.DEFAULT_TIMEOUT < deadline <= 10 * execute.DEFAULT_TIMEOUT, (
        "the run's timeout, plus the pod's start"
    )


def test_units_are_one_indexed_job_run_once_each(k8s, unit):
    spec = k8s[("Job", "labkit-units")]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] >= 1
    assert spec["backoffLimitPerIndex"] == 0, "the student's code gets one go"
    assert unit["restartPolicy"] == "Never"
    assert "set completions" in MANIFEST.read_text() and "units planned" in MANIFEST.read_text()


def test_a_unit_pod_runs_pods_run_with_the_pod_as_its_sandbox_by_name(unit):
    container = unit["containers"][0]
    assert "args" not in container
    argv = container["command"]
    assert argv[:3] == ["python", "-m", "labkit"]
    args = cli.parser().parse_args(argv[3:])
    assert (args.command, args.step, args.isolation) == ("pods", "run", "pod")
    assert (str(args.unit), str(args.out)) == ("/unit", "/out")


# ---- a unit's pod: no network ---------------------------------------------------------------


def _allows_egress(policy: dict) -> bool:
    return "Egress" in policy["spec"].get("policyTypes", []) and bool(policy["spec"].get("egress"))


def test_a_unit_pod_is_selected_by_a_policy_that_denies_all_ingress_and_egress(k8s):
    labels = k8s[("Job", "labkit-units")]["spec"]["template"]["metadata"]["labels"]
    deny = [
        p
        for p in _policies_over(NAMESPACE)
        if _selects(p["spec"]["podSelector"], labels)
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and p["spec"]["ingress"] == []
        and p["spec"]["egress"] == []
    ]
    assert any(p["spec"]["podSelector"] != {} for p in deny), "a policy of the units' own"


def test_no_policy_that_allows_egress_selects_a_unit_pod_not_even_for_dns(k8s):
    labels = k8s[("Job", "labkit-units")]["spec"]["template"]["metadata"]["labels"]
    allowing = [p for p in _policies_over(NAMESPACE) if _allows_egress(p)]
    assert allowing, "the plan and the judge need the buckets"
    assert not [p["metadata"]["name"] for p in allowing if _selects(p["spec"]["podSelector"], labels)]
    for job in ("labkit-plan", "labkit-judge"):  # ... which do reach the Google APIs
        others = k8s[("Job", job)]["spec"]["template"]["metadata"]["labels"]
        assert any(_selects(p["spec"]["podSelector"], others) for p in allowing), job


def test_no_policy_lets_anything_connect_to_the_pods():
    assert not any(p["spec"].get("ingress") for p in _policies_over(NAMESPACE))


# ---- the plan and the judge -----------------------------------------------------------------


def test_the_plan_pod_reads_the_class_and_writes_only_the_shared_volume(k8s):
    spec = pod(k8s, "labkit-plan")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["class"]["csi"]["driver"] == FUSE and volumes["class"]["csi"]["readOnly"] is True
    mounts = spec["containers"][0]["volumeMounts"]
    assert all(m.get("readOnly") is True for m in mounts if m["name"] == "class")
    assert {m["name"] for m in mounts if not m.get("readOnly")} == {"work", "tmp"}
    assert all("csi" not in volumes[m["name"]] for m in mounts if not m.get("readOnly"))


def test_the_plan_and_the_judge_name_the_same_one_process_configurations(k8s):
    plan = cli.parser().parse_args(_argv(_shell(k8s, "labkit-plan"), "python -m labkit pods plan")[3:])
    judge = cli.parser().parse_args(_argv(_shell(k8s, "labkit-judge"), "python -m labkit grade")[3:])
    assert (plan.command, plan.step) == ("pods", "plan")
    assert plan.configs and plan.configs == judge.configs and plan.labs == judge.labs
    assert all(configs.by_name(name).processes == 1 for name in plan.configs.split(",")), (
        "plan refuses cpu-2x4"
    )
    assert str(plan.submissions) == str(judge.submissions)
    assert str(judge.plan) == str(plan.out), "the judge reads the plan this RUN made"


def test_the_plan_makes_each_units_output_folder_under_the_same_run(k8s):
    shell = _shell(k8s, "labkit-plan")
    assert "mkdir /work/runs/$RUN/$i" in shell and "units.json" in shell
    runs = {
        env_of(pod(k8s, job)["containers"][0])["RUN"]
        for job in ("labkit-plan", "labkit-units", "labkit-judge")
    }
    assert len(runs) == 1, "the three Jobs name the same RUN"


def test_the_judge_runs_no_notebook_and_reads_the_units_outputs_as_a_pod_graded_class(k8s):
    shell = _shell(k8s, "labkit-judge")
    assert "pods run" not in shell and "nox" not in shell
    args = cli.parser().parse_args(_argv(shell, "python -m labkit grade")[3:])
    assert args.command == "grade" and args.isolation == "pod"
    assert str(args.runs_from) == "/work/runs/$RUN" and str(args.plan) == "/work/plan/$RUN"
    spec = pod(k8s, "labkit-judge")
    work = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "work"]
    assert work and all(m.get("readOnly") is True for m in work), "the judge never writes the units' outputs"
    assert {v["name"]: v for v in spec["volumes"]}["work"]["persistentVolumeClaim"]["readOnly"] is True


def test_the_judge_writes_the_results_bucket_once_per_run(k8s):
    shell = _shell(k8s, "labkit-judge")
    assert 'if [ -e "$board" ]' in shell and "new RUN" in shell
    grants = set(
        re.findall(r"gs://(\w+) --member \$K8S/labkit-judge --role (roles/[\w.]+)", MANIFEST.read_text())
    )
    assert grants == {
        ("CLASS_BUCKET", "roles/storage.objectViewer"),
        ("RESULTS_BUCKET", "roles/storage.objectCreator"),
        ("RESULTS_BUCKET", "roles/storage.legacyBucketReader"),
    }


def test_the_judge_gives_grade_every_course_input_the_class_bucket_holds_on_every_run(k8s, tmp_path):
    # The judge's own shell line, run with a stand-in `python` that records its arguments, the class
    # bucket's course/ folder holding three of the five inputs.
    spec = pod(k8s, "labkit-judge")
    mounted = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounted["/class/course"]["subPath"] == "course" and mounted["/class/course"]["readOnly"] is True
    course, bin_ = tmp_path / "course", tmp_path / "bin"
    course.mkdir(), bin_.mkdir()
    for name in ("roster.csv", "policy.toml", "overrides.csv", ".keep", "notes.txt"):
        (course / name).write_text("x\n")
    (bin_ / "python").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGV"\n')
    (bin_ / "python").chmod(0o755)
    line = (
        _shell(k8s, "labkit-judge")
        .replace("/class/course", str(course))
        .replace("/results", str(tmp_path / "results"))
        .replace("/scratch/out", str(tmp_path / "out"))
    )
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "RUN": "run-1", "ARGV": str(tmp_path / "argv")}
    done = subprocess.run(
        ["bash", "-c", line], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:3] == ["-m", "labkit", "grade"]
    args = cli.parser().parse_args(argv[2:])
    assert (args.roster, args.policy, args.overrides) == tuple(
        course / n for n in ("roster.csv", "policy.toml", "overrides.csv")
    )
    assert args.extensions is None and args.adjustments is None and args.isolation == "pod"
    assert (tmp_path / "results" / "run-1" / "scoreboard" / "exit-status").read_text().strip() == "0"


def test_the_header_says_wait_for_the_units_before_the_judge():
    text = MANIFEST.read_text()
    units = text.index("wait --for=condition=complete job/labkit-units")
    assert units < text.index("-l app.kubernetes.io/component=judge")


# ---- what the header says has and has not been run -------------------------------------------


def test_the_header_states_what_was_run_and_what_was_not():
    header = MANIFEST.read_text().split("\napiVersion:")[0]
    for fact in (
        "tests/kit/test_pods.py",
        "runsc",
        "never been applied to a cluster",
        "Filestore",
        "GKE Sandbox",
        "has not been verified",
        "cpu-2x4",
        "refused by `pods plan`",
    ):
        assert fact in header, fact
    assert "grade-job.yaml" in header


def test_the_shard_manifest_and_the_grading_page_point_to_this_one():
    assert "grade-pods.yaml" in SHARDS.read_text().split("\napiVersion:")[0]
    assert "infra/k8s/grade-pods.yaml" in (ROOT / "docs/grading.md").read_text()
