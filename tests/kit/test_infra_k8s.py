"""Grading on GKE (infra/k8s/grade-job.yaml): an Indexed Job of shards, then a merge.

What a manifest can promise is checked on the parsed YAML: the sandboxed runtime, read-only class
data, one writable place for results, no egress but the Google APIs the storage driver needs, and
identities that mount no token. The Jobs' own shell commands then run locally over folders standing
in for the buckets: two shards and a merge give the scoreboard of one whole run, a re-run under the
same RUN refuses, and a failed shard makes the merge fail at once, naming it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "infra/k8s/grade-job.yaml"
VENV_BIN = Path(sys.executable).parent


def run(cmd, *, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


@pytest.fixture(scope="module")
def k8s(docs) -> dict:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod(k8s, job: str) -> dict:
    return k8s[("Job", job)]["spec"]["template"]["spec"]


def env_of(container: dict) -> dict:
    return {e["name"]: e["value"] for e in container["env"]}


def _shard_count(command: str) -> int:
    m = re.search(r"--shard \$\(\(JOB_COMPLETION_INDEX\+1\)\)/(\d+)", command)
    assert m, f"no `--shard $((JOB_COMPLETION_INDEX+1))/N` in {command!r}"
    return int(m.group(1))


# ---- what runs where ----------------------------------------------------------------------


def test_every_object_lives_in_the_labkit_namespace_which_the_file_creates(docs, k8s):
    namespace = k8s[("Namespace", "labkit")]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "labkit", d["metadata"]["name"]


@pytest.mark.parametrize("job", ["labkit-grade", "labkit-merge"])
def test_pods_run_under_gke_sandbox(k8s, job):
    assert pod(k8s, job)["runtimeClassName"] == "gvisor"


def test_grading_never_asks_for_less_than_the_kits_sandbox(k8s):
    command = " ".join(pod(k8s, "labkit-grade")["containers"][0]["args"])
    assert "nox -s grade" in command
    assert "--isolation" not in command, "the Job grades only where the kit can make its sandbox"


@pytest.mark.parametrize("job", ["labkit-grade", "labkit-merge"])
def test_containers_are_unprivileged_with_a_read_only_root(k8s, job):
    assert_unprivileged_with_a_read_only_root(pod(k8s, job))


def assert_unprivileged_with_a_read_only_root(spec: dict) -> None:
    """A pod that runs as non-root, with the runtime's seccomp profile, no capability and a read-only root."""
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for container in spec["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]


def test_grade_job_is_indexed_with_one_pod_per_shard(k8s):
    job = k8s[("Job", "labkit-grade")]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    command = " ".join(spec["template"]["spec"]["containers"][0]["args"])
    assert spec["completions"] == spec["parallelism"] == _shard_count(command)
    assert spec["backoffLimitPerIndex"] == 0, "a failed shard reports once, so the merge learns of it"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


# ---- data: read-only class, one writable place for results ---------------------------------


def test_the_class_bucket_is_mounted_read_only_everywhere(k8s):
    spec = pod(k8s, "labkit-grade")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["class"]["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
    assert volumes["class"]["csi"]["readOnly"] is True, "the driver mounts the bucket read-only"
    mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "class"]
    assert {m["subPath"] for m in mounts} == {"submissions", "kit/reference", "kit/tests/hidden"}
    assert all(m.get("readOnly") is True for m in mounts)


def test_the_only_writable_mounts_are_results_and_scratch(k8s):
    for job in ("labkit-grade", "labkit-merge"):
        spec = pod(k8s, job)
        volumes = {v["name"]: v for v in spec["volumes"]}
        writable = {m["name"] for m in spec["containers"][0]["volumeMounts"] if not m.get("readOnly")}
        assert writable == {"results", "scratch", "tmp"}, job
        assert volumes["scratch"] == {"name": "scratch", "emptyDir": {}}
        assert (
            volumes["results"]["csi"]["volumeAttributes"]["bucketName"]
            != volumes.get("class", {"csi": {"volumeAttributes": {"bucketName": None}}})["csi"][
                "volumeAttributes"
            ]["bucketName"]
        )


def test_grade_job_brings_the_reference_and_hidden_tests_the_course_image_leaves_out(k8s):
    container = pod(k8s, "labkit-grade")["containers"][0]
    kit = container["workingDir"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for folder in ("reference", "tests/hidden"):
        mount = mounts[f"{kit}/{folder}"]
        assert mount["name"] == "class" and mount["subPath"] == f"kit/{folder}" and mount["readOnly"] is True


def test_grade_job_runs_the_kits_image_with_builds_in_scratch(k8s):
    container = pod(k8s, "labkit-grade")["containers"][0]
    assert re.fullmatch(r"[a-z0-9.-]+/[a-z0-9/._-]+/labkit:[\w.-]+", container["image"])
    assert not container["image"].endswith(":latest")
    assert env_of(container)["LABKIT_BUILD"].startswith("/scratch/")


def test_grade_job_matches_the_course_image(k8s):
    dockerfile = ROOT / "Dockerfile"
    if not dockerfile.exists():
        pytest.skip("no Dockerfile in the kit")
    text = dockerfile.read_text()
    spec = pod(k8s, "labkit-grade")
    assert spec["containers"][0]["workingDir"] == re.findall(r"^WORKDIR (\S+)", text, re.M)[-1]
    assert f"USER {spec['securityContext']['runAsUser']}:" in text


# ---- identity ------------------------------------------------------------------------------


def test_each_job_has_its_own_service_account_which_mounts_no_token(k8s):
    accounts = {name for kind, name in k8s if kind == "ServiceAccount"}
    assert accounts == {"labkit-grader", "labkit-merger"}
    for name in accounts:
        assert k8s[("ServiceAccount", name)]["automountServiceAccountToken"] is False
    assert pod(k8s, "labkit-grade")["serviceAccountName"] == "labkit-grader"
    assert pod(k8s, "labkit-merge")["serviceAccountName"] == "labkit-merger"
    for job in ("labkit-grade", "labkit-merge"):
        assert pod(k8s, job)["automountServiceAccountToken"] is False


def test_no_role_binding_gives_the_pods_the_kubernetes_api(docs):
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]


def test_the_header_grants_the_grader_read_on_the_class_and_create_only_on_results():
    header = MANIFEST.read_text()
    grants = re.findall(
        r"add-iam-policy-binding gs://(\w+) --member \$K8S/([\w-]+) --role (roles/[\w.]+)", header
    )
    grader = {(bucket, role) for bucket, who, role in grants if who == "labkit-grader"}
    assert grader == {
        ("CLASS_BUCKET", "roles/storage.objectViewer"),
        ("RESULTS_BUCKET", "roles/storage.objectCreator"),
        ("RESULTS_BUCKET", "roles/storage.legacyBucketReader"),
    }
    assert not any(
        role in ("roles/storage.objectAdmin", "roles/storage.admin", "roles/editor") for *_, role in grants
    )
    assert all(bucket in ("CLASS_BUCKET", "RESULTS_BUCKET") for bucket, *_ in grants), "no project-wide role"


# ---- network ---------------------------------------------------------------------------------


def test_a_network_policy_denies_all_ingress_and_egress_in_the_namespace(k8s):
    deny = k8s[("NetworkPolicy", "labkit-deny-all")]["spec"]
    assert deny["podSelector"] == {}
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert deny["ingress"] == [] and deny["egress"] == []


def test_the_only_egress_allowed_is_dns_the_metadata_server_and_the_restricted_google_apis(k8s):
    policies = [d for (kind, _), d in k8s.items() if kind == "NetworkPolicy"]
    assert not any(p["spec"].get("ingress") for p in policies), "nothing may connect to the pods"
    allowed = set()
    for policy in policies:
        for rule in policy["spec"].get("egress", []):
            assert rule.get("to"), "an egress rule without `to` opens everything"
            for peer in rule["to"]:
                where = (
                    peer["ipBlock"]["cidr"]
                    if "ipBlock" in peer
                    else peer["podSelector"]["matchLabels"]["k8s-app"]
                )
                assert "except" not in peer.get("ipBlock", {})
                allowed |= {(where, p["port"]) for p in rule["ports"]}
    assert allowed == {
        ("kube-dns", 53),
        ("169.254.169.252/32", 988),
        ("169.254.169.254/32", 80),
        ("199.36.153.4/30", 443),
    }


def test_the_comments_no_longer_claim_open_egress():
    text = MANIFEST.read_text()
    assert "Egress stays open" not in text
    assert "runtimeClassName: gvisor" in text and "has not been" in text, "say what is not verified"


# ---- the Jobs' commands, run locally -----------------------------------------------------------


def test_merge_job_reads_the_same_run_and_shard_count_as_the_grade_job(k8s):
    grade = pod(k8s, "labkit-grade")["containers"][0]
    merge = pod(k8s, "labkit-merge")["containers"][0]
    assert merge["image"] == grade["image"]
    assert env_of(merge)["RUN"] == env_of(grade)["RUN"]
    assert int(env_of(merge)["SHARDS"]) == k8s[("Job", "labkit-grade")]["spec"]["completions"]
    command = " ".join(merge["args"])
    assert "nox -s scoreboard -- merge" in command and "exit-status" in command


def _grading_cli() -> bool:
    help_text = run([sys.executable, "-m", "labkit", "grade", "--help"]).stdout
    board = run([sys.executable, "-m", "labkit", "scoreboard", "merge", "--help"]).stdout
    return "--shard" in help_text and "--out" in board


def _job_command(doc: dict, tmp: Path, narrow: str = "", shards: int | None = None) -> str:
    """A Job's shell command for a local run: buckets and scratch are folders; grading is narrowed."""
    command = " ".join(doc["spec"]["template"]["spec"]["containers"][0]["args"])
    for mount in ("/class/", "/results/", "/scratch/"):
        command = command.replace(mount, f"{tmp}{mount}")
    command = command.replace(
        f"--submissions {tmp}/class/submissions", f"--submissions {tmp}/class/submissions {narrow}"
    )
    if shards:
        command = re.sub(r"(--shard \S+)/\d+", rf"\1/{shards}", command)
    return command


def _fake_nox(tmp: Path, exit_for_shard: dict[int, int]) -> Path:
    """A `nox` that writes a one-row scoreboard per shard, or fails for the shards named."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nox"
    script.write_text(f"""#!{sys.executable}
import sys, pathlib
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--out") + 1])
if "grade" in args:
    shard = int(args[args.index("--shard") + 1].split("/")[0])
    code = {exit_for_shard!r}.get(shard, 0)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scoreboard.csv").write_text(f"student,lab\\ns{{shard}},3\\n")
    sys.exit(code)
parts = args[args.index("merge") + 1:args.index("--out")]
out.mkdir(parents=True)
(out / "scoreboard.csv").write_text("".join(pathlib.Path(p, "scoreboard.csv").read_text() for p in parts))
""")
    script.chmod(0o755)
    return bin_dir


def _local(tmp: Path, bin_dir: Path | None = None, **extra) -> dict:
    path = f"{bin_dir}{os.pathsep}" if bin_dir else ""
    return dict(
        os.environ,
        PATH=f"{path}{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        RUN="run-7",
        LABKIT_BUILD=str(tmp / "scratch/build"),
        **extra,
    )


def test_a_rerun_under_the_same_run_refuses_before_grading(tmp_path, k8s):
    bin_dir = _fake_nox(tmp_path, {})
    command = _job_command(k8s[("Job", "labkit-grade")], tmp_path, shards=2)
    first = run(["bash", "-c", command], env=_local(tmp_path, bin_dir, JOB_COMPLETION_INDEX="0"))
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "results/run-7/shard-1/exit-status").read_text().strip() == "0"
    again = run(["bash", "-c", command], env=_local(tmp_path, bin_dir, JOB_COMPLETION_INDEX="0"))
    assert again.returncode == 3 and "new RUN" in again.stderr


def test_a_failed_shard_makes_the_merge_fail_at_once_naming_it(tmp_path, k8s):
    bin_dir = _fake_nox(tmp_path, {2: 1})
    grade = _job_command(k8s[("Job", "labkit-grade")], tmp_path, shards=2)
    codes = [
        run(["bash", "-c", grade], env=_local(tmp_path, bin_dir, JOB_COMPLETION_INDEX=str(i))).returncode
        for i in range(2)
    ]
    assert codes == [0, 1]
    assert (tmp_path / "results/run-7/shard-2/exit-status").read_text().strip() == "1"
    merge = run(
        ["bash", "-c", _job_command(k8s[("Job", "labkit-merge")], tmp_path)],
        env=_local(tmp_path, bin_dir, SHARDS="2"),
        timeout=20,
    )
    assert merge.returncode == 1 and "shard-2" in merge.stderr and "shard-1" not in merge.stderr
    assert not (tmp_path / "results/run-7/scoreboard").exists()


@pytest.fixture(scope="module")
def class_graded(tmp_path_factory, k8s):
    """A class of two graded whole, and by the Jobs' own commands as two shards and a merge."""
    if not _grading_cli():
        pytest.skip("`grade --shard` and `scoreboard merge` are not in labkit yet")
    tmp = tmp_path_factory.mktemp("class")
    reference = (ROOT / "reference/lab-3.ipynb").read_text()
    # One right and one wrong on many devices; `ada` and `cy` fall in different shards of two.
    for student, text in {
        "ada": reference,
        "cy": reference.replace("jax.devices()", "jax.devices()[:1]"),
    }.items():
        (tmp / "class/submissions" / student).mkdir(parents=True)
        (tmp / "class/submissions" / student / "lab-3.ipynb").write_text(text)
    narrow = "--labs 3 --configs cpu-8 --jobs 2"
    env = _local(tmp)
    whole = run(
        [
            "nox",
            "-s",
            "grade",
            "--",
            "--submissions",
            str(tmp / "class/submissions"),
            "--out",
            str(tmp / "whole"),
            *narrow.split(),
        ],
        env=env,
        timeout=900,
    )
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-2000:]
    grade_job = _job_command(k8s[("Job", "labkit-grade")], tmp, narrow, shards=2)
    for index in range(2):  # what the Job's pods run, one JOB_COMPLETION_INDEX each
        # Each pod has a scratch folder of its own.
        part = run(
            ["bash", "-c", f"rm -rf {tmp}/scratch/out; {grade_job}"],
            env=dict(env, JOB_COMPLETION_INDEX=str(index)),
            timeout=900,
        )
        assert part.returncode == 0, part.stdout[-2000:] + part.stderr[-2000:]
    merge = run(
        ["bash", "-c", _job_command(k8s[("Job", "labkit-merge")], tmp)],
        env=dict(env, SHARDS="2"),
        timeout=300,
    )
    assert merge.returncode == 0, merge.stdout + merge.stderr
    return tmp


def test_two_shards_merged_equal_one_whole_run(class_graded):
    whole = (class_graded / "whole/scoreboard.csv").read_text().splitlines()
    merged = (class_graded / "results/run-7/scoreboard/scoreboard.csv").read_text().splitlines()
    assert len(whole) == 3, whole  # the header and two students
    assert any(",failed," in row for row in whole), "the wrong solution should fail on cpu-8"
    assert merged == whole
    parts = [
        (class_graded / f"results/run-7/shard-{i}/scoreboard.csv").read_text().splitlines()[1:]
        for i in (1, 2)
    ]
    assert all(parts), "each shard grades part of the class"
    assert sorted(parts[0] + parts[1]) == sorted(whole[1:])
