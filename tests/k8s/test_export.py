"""``trtdeploy export k8s``: every manifest validates offline (Kubernetes' own schemas through kubernetes-validate,
the CRDs' published schemas through jsonschema), kustomization.yaml applies exactly what was written, the exports
match their golden files, and a change of the deployment shows up where it must and nowhere else."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from trtdeploy.capacity import recommend_hpa
from trtdeploy.deployment import LOAD_TIMES_KEPT, Deployment
from trtdeploy.engines.trtllm.versions import TRITON_IMAGES
from trtdeploy.k8s import ExportOptions, build_argv, export_k8s, make_context, shell_word
from trtdeploy.k8s._export import BUILD_STAGE, EXTRA_FILES

from ..capacity.runs import write_llm_run
from ..conftest import run_cli
from ..engines.trtllm_helpers import under_ci
from ..manifests import write_manifest
from .deployments import SOURCE, write_deployment

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
#: The Kubernetes release the manifests are checked against (kubernetes-validate ships its schemas).
KUBERNETES = "1.30"
#: The published schemas of the custom resources the exports use (see crds/README.md).
CRDS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.x-k8s.io_v1_LeaderWorkerSet.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_ServiceMonitor.json",
    ("gateway.networking.k8s.io/v1", "GRPCRoute"): "gateway.networking.k8s.io_v1_GRPCRoute.json",
}
#: The three deployments of the issue: a torch one, TensorRT-LLM TP4 on one node, TP8 x PP2 across two nodes.
DEPLOYMENTS = {
    "torch-l4": {"engine": "torch", "gpu": "L4"},
    "trtllm-tp4": {"engine": "trtllm", "gpu": "H100:4", "tp": 4, "engine_version": "1.2.1"},
    "trtllm-tp8pp2": {"engine": "trtllm", "gpu": "H100:16", "tp": 8, "pp": 2, "engine_version": "1.2.1"},
}
#: The options the golden exports are written with (every optional manifest included).
OPTIONS = ExportOptions(namespace="llm", replicas=2, gateway="infra/edge", hf_token_secret="hf-token")

pytestmark = pytest.mark.plugins("qwen_llm")


@pytest.fixture
def deployment(tmp_path: Path, qwen_checkpoint: Path) -> Callable[..., Deployment]:
    def make(label: str = "trtllm-tp4", **changes: Any) -> Deployment:
        folder = tmp_path / "deployments" / f"{label}-{len(list(tmp_path.glob('deployments/*')))}"
        return Deployment.load(write_deployment(folder, qwen_checkpoint, **{**DEPLOYMENTS[label], **changes}))

    return make


def _documents(folder: Path, names: list[str]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name in names for doc in yaml.safe_load_all((folder / name).read_text()) if doc]


def _resources(folder: Path) -> list[str]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]


def _validate(doc: dict[str, Any]) -> None:
    crd = CRDS.get((doc["apiVersion"], doc["kind"]))
    if crd is None:  # raises SchemaNotFoundError for a kind it does not know, instead of passing it
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        return
    jsonschema.validate(doc, json.loads((HERE / "crds" / crd).read_text()))
    if doc["kind"] == "LeaderWorkerSet":  # its published schema takes unknown fields: the pods' specs, strictly
        for role in ("leaderTemplate", "workerTemplate"):
            template = doc["spec"]["leaderWorkerTemplate"][role]
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role}, "template": template}
            kubernetes_validate.validate(pod_template, KUBERNETES, strict=True)


@pytest.mark.parametrize("label", DEPLOYMENTS)
def test_every_manifest_validates_and_kustomize_applies_exactly_what_was_written(
    deployment: Callable[..., Deployment], tmp_path: Path, label: str
) -> None:
    written = export_k8s(deployment(label), OPTIONS, tmp_path / "k8s")
    files = sorted(str(p.relative_to(written.output_dir)) for p in written.output_dir.rglob("*") if p.is_file())
    assert files == written.files
    resources = _resources(written.output_dir)
    top = {name for name in files if "/" not in name}
    assert sorted(resources) == sorted(top - {"kustomization.yaml", *EXTRA_FILES}) == sorted(written.resources)
    stage = written.output_dir / BUILD_STAGE
    staged = _resources(stage)  # the build, applied and waited for first
    assert sorted(staged) == sorted(p.name for p in stage.iterdir() if p.name != "kustomization.yaml")
    kinds = []
    for name, doc in [*_documents(written.output_dir, resources), *_documents(stage, staged)]:
        kinds.append(doc["kind"])
        _validate(doc)
        assert doc["metadata"]["namespace"] == "llm", name
    workload = "LeaderWorkerSet" if label == "trtllm-tp8pp2" else "Deployment"
    assert {workload, "Job", "PersistentVolumeClaim", "Service", "PodDisruptionBudget"} <= set(kinds)
    assert {"ServiceMonitor", "HorizontalPodAutoscaler", "GRPCRoute"} <= set(kinds)
    assert ("Role" in kinds) == (workload == "LeaderWorkerSet")
    adapter = yaml.safe_load((written.output_dir / "prometheus-adapter-values.yaml").read_text())
    assert "apiVersion" not in adapter and adapter["rules"]["custom"][0]["name"]["as"] == "triton_requests_in_flight"


@pytest.mark.parametrize("label", DEPLOYMENTS)
def test_the_exports_match_their_golden_files(deployment: Callable[..., Deployment], tmp_path: Path, label: str):
    """TRTDEPLOY_UPDATE_GOLDEN=1 rewrites them (refused under CI) and skips, for the diff to be read by hand."""
    written = export_k8s(deployment(label), OPTIONS, tmp_path / "k8s")
    golden = GOLDEN / label
    if os.environ.get("TRTDEPLOY_UPDATE_GOLDEN"):
        if under_ci():
            pytest.fail("TRTDEPLOY_UPDATE_GOLDEN=1 rewrites golden files: refused under CI (CI is set)")
        shutil.rmtree(golden, ignore_errors=True)
        for name in written.files:
            (golden / name).parent.mkdir(parents=True, exist_ok=True)
            (golden / name).write_text((written.output_dir / name).read_text())
        pytest.skip(f"rewrote {golden}")
    assert sorted(str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file()) == written.files
    for name in written.files:
        assert (written.output_dir / name).read_text() == (golden / name).read_text(), name


#: The digest of the build's image and command in its Job's name and folder: it changes with every build option.
_DIGEST = re.compile(r"(/deployments/|-build-)[0-9a-f]{8}\b")


def _leaves(node: Any, path: tuple = ()) -> dict[tuple, Any]:
    """Every scalar of a parsed document by its path (list items by index), the build's digest left out."""
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, (*path, key)).items()}
    if isinstance(node, list):
        return {k: v for index, value in enumerate(node) for k, v in _leaves(value, (*path, index)).items()}
    return {path: _DIGEST.sub(r"\1<digest>", node) if isinstance(node, str) else node}


def _changes(before: Path, after: Path) -> dict[tuple, tuple[Any, Any]]:
    """(file, *path) -> (before, after) for every scalar of the resources (both stages) that differs."""
    found = {}
    names = [*_resources(before), *(f"{BUILD_STAGE}/{name}" for name in _resources(before / BUILD_STAGE))]
    for name in names:
        old, new = (_leaves(yaml.safe_load((folder / name).read_text())) for folder in (before, after))
        for path in old.keys() | new.keys():
            if old.get(path) != new.get(path):
                found[(name, *path)] = (old.get(path), new.get(path))
    return found


def _build_line(folder: Path) -> str:
    job = yaml.safe_load((folder / BUILD_STAGE / "build-job.yaml").read_text())
    return job["spec"]["template"]["spec"]["containers"][0]["args"][0]


def _job_name(folder: Path) -> str:
    return yaml.safe_load((folder / BUILD_STAGE / "build-job.yaml").read_text())["metadata"]["name"]


def test_a_change_of_gpu_release_or_tp_shows_up_where_it_must(
    deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    options = ExportOptions(name="qwen")
    base = export_k8s(deployment(), options, tmp_path / "base").output_dir
    affinity = ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    selector = (*affinity, "nodeSelectorTerms", 0, "matchExpressions", 0, "values", 0)
    job = f"{BUILD_STAGE}/build-job.yaml"
    command = (job, "spec", "template", "spec", "containers", 0, "args", 0)

    other_gpu = export_k8s(deployment(gpu="A100-80GB:4"), options, tmp_path / "gpu").output_dir
    changes = _changes(base, other_gpu)
    assert changes.pop(command) == (
        _DIGEST.sub(r"\1<digest>", _build_line(base)),
        _DIGEST.sub(r"\1<digest>", _build_line(base)).replace("--gpu=H100:4", "--gpu=A100-80GB:4"),
    )
    assert changes == {
        ("deployment.yaml", "spec", "template", *selector): ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"),
        ("deployment.yaml", "spec", "template", *selector[:-1], 1): ("NVIDIA-H100-PCIe", "NVIDIA-A100-80GB-PCIe"),
        (job, "spec", "template", *selector): ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"),
        (job, "spec", "template", *selector[:-1], 1): ("NVIDIA-H100-PCIe", "NVIDIA-A100-80GB-PCIe"),
    }
    assert _job_name(base) != _job_name(other_gpu)  # another build, in a folder of its own: never the old one served

    older = export_k8s(deployment(engine_version="0.19.0"), options, tmp_path / "release").output_dir
    changes = _changes(base, older)
    images = {path: change for path, change in changes.items() if path[-1] == "image"}
    assert set(images.values()) == {("trtdeploy:0.1.0-trtllm1.2.1-qwen-llm", "trtdeploy:0.1.0-trtllm0.19.0-qwen-llm")}
    assert len(images) == 3  # the serving container, the wait for the build, the build
    assert set(changes) - set(images) == {command}
    assert "--trtllm-version=0.19.0" in _build_line(older)
    assert "--build-arg TRITON_TAG=25.05 --build-arg TRTLLM_VERSION=0.19.0" in (older / "README.md").read_text()

    tp2 = export_k8s(deployment(tp=2, gpu="H100:2"), options, tmp_path / "tp").output_dir
    changes = _changes(base, tp2)
    limits = {path: change for path, change in changes.items() if "nvidia.com/gpu" in path}
    assert set(limits.values()) == {(4, 2)} and len(limits) == 4  # requests and limits, serving pod and build
    scripts = [yaml.safe_load((folder / "deployment.yaml").read_text())["spec"]["template"]["spec"]["containers"][0]
               ["args"][0] for folder in (base, tp2)]  # fmt: skip
    ranks = [_server_command(script).count(":") for script in scripts]
    assert ranks == [3, 1]  # mpirun's rank separators: 4 ranks, then 2
    # the rest: the deployment's folder (its name says tp2) and the build's --tp/--gpu
    assert all("tp2pp1" in str(new) for path, (_, new) in changes.items() if new != 2 and path != command)
    assert "--tp=2" in _build_line(tp2) and "--gpu=H100:2" in _build_line(tp2)


def _server_command(script: str) -> list[str]:
    """The words of the command a server script ends in (``exec ...``, continued over lines)."""
    return shlex.split(script[script.index("\nexec ") :].replace("\\\n", " "))


def test_the_build_job_builds_the_same_point_as_the_real_build_cli_plans_it(
    deployment: Callable[..., Deployment], tmp_path: Path, qwen_checkpoint: Path
) -> None:
    for label in DEPLOYMENTS:
        dep = deployment(label)
        argv = build_argv(dep, output_dir=str(tmp_path / "cluster"))
        assert f"--revision={SOURCE['commit']}" in argv  # the very checkpoint it was built from
        planned = run_cli(*argv, "--dry-run", "--json")
        assert planned.returncode == 0, planned.stderr
        plan = json.loads(planned.stdout)
        assert plan["point"] == dep.manifest["point"]
        assert Path(plan["deployment"]) == tmp_path / "cluster" / "qwen_llm" / dep.point.name
    local = deployment("torch-l4")
    manifest = json.loads((local.path / "manifest.json").read_text())
    manifest["source"] = {"path": str(qwen_checkpoint), "fingerprint": "0"}
    manifest["point"]["engine_options"] = {"overlap_admission": True}  # built with -o overlap_admission=true
    (local.path / "manifest.json").write_text(json.dumps(manifest))
    argv = build_argv(Deployment.load(local.path), output_dir=str(tmp_path), checkpoint_dir=str(qwen_checkpoint))
    assert "overlap_admission=true" in argv
    planned = run_cli(*argv, "--dry-run", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["point"] == manifest["point"]


def test_a_local_checkpoint_needs_a_volume_holding_it(deployment: Callable[..., Deployment], tmp_path: Path) -> None:
    dep = deployment("torch-l4")
    manifest = json.loads((dep.path / "manifest.json").read_text())
    manifest["source"] = {"path": "/data/qwen", "fingerprint": "0"}
    (dep.path / "manifest.json").write_text(json.dumps(manifest))
    refused = run_cli("export", "k8s", str(dep.path), "--output-dir", str(tmp_path / "out"))
    assert refused.returncode == 2 and "local checkpoint /data/qwen" in refused.stderr
    assert "--checkpoint-claim" in refused.stderr and not (tmp_path / "out").exists()
    ctx = make_context(Deployment.load(dep.path), ExportOptions(checkpoint_claim="weights:qwen"))
    job = ctx.storage.job
    assert job is not None and "--model-dir=/data/qwen" in job.argv
    assert (job.checkpoint_claim, job.checkpoint_subpath, job.checkpoint_path) == ("weights", "qwen", "/data/qwen")
    # the serving pods read the tokenizer (and the torch engine the weights) where the build found them
    written = export_k8s(Deployment.load(dep.path), ExportOptions(checkpoint_claim="weights:qwen"), tmp_path / "k8s")
    pod = yaml.safe_load((written.output_dir / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "checkpoint"]
    assert (mount["mountPath"], mount["subPath"], mount["readOnly"]) == ("/data/qwen", "qwen", True)
    assert {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod["volumes"]
    hub = run_cli("export", "k8s", str(deployment("torch-l4").path), "--checkpoint-claim", "weights")
    assert hub.returncode == 2 and "built from the Hub" in hub.stderr


def test_the_startup_probe_covers_the_measured_load_time(deployment: Callable[..., Deployment]) -> None:
    dep = deployment("torch-l4")
    never = make_context(dep, ExportOptions()).probes
    assert (never.measured_load_s, never.startup_budget_s) == (None, 900)
    for seconds in (30.0, 140.0, *[20.0] * (LOAD_TIMES_KEPT - 1)):
        dep.record_load_time(seconds)
    assert len(dep.load_times) == LOAD_TIMES_KEPT and dep.load_times[0]["seconds"] == 140.0  # the first one dropped
    measured = make_context(dep, ExportOptions()).probes
    assert measured.measured_load_s == 140.0 and measured.startup_failure_threshold * 10 == measured.startup_budget_s
    assert measured.startup_budget_s == 420  # three times the longest load
    (dep.path / "load_times.json").write_text("{not json")
    assert dep.load_times == [] and make_context(dep, ExportOptions()).probes.startup_budget_s == 900


def test_dev_shm_grows_with_the_python_instances(deployment: Callable[..., Deployment]) -> None:
    small = make_context(deployment("trtllm-tp4"), ExportOptions())
    large = make_context(deployment("trtllm-tp4", options={"preprocessing_instances": "8"}), ExportOptions())
    assert large.python_instances == small.python_instances + 6
    assert small.shm_size == f"{-(-(1024 + 256 * small.python_instances) // 1024)}Gi"
    assert int(large.shm_size[:-2]) > int(small.shm_size[:-2])


def test_the_server_script_runs_what_serve_runs_listening_on_the_pod_ip(deployment: Callable[..., Deployment]):
    ctx = make_context(deployment("trtllm-tp4"), ExportOptions())
    command = _server_command(ctx.server_script)
    assert command[:3] == ["exec", "mpirun", "--allow-run-as-root"] and command.count(":") == 3
    assert "--http-address=0.0.0.0" in command and "--metrics-address=0.0.0.0" in command
    restricted = [arg for arg in command if arg.startswith("--http-restricted-api=")]
    rule = "shared-memory,model-repository,logging,trace:trtdeploy-api-key=${TRTDEPLOY_API_KEY}"
    assert restricted == [f"--http-restricted-api={rule}"]
    assert shell_word("a'b=${TRTDEPLOY_API_KEY}") == "'a'\"'\"'b='\"${TRTDEPLOY_API_KEY}\""
    assert shell_word("") == "''"


def test_export_writes_json_and_replaces_a_folder_only_with_force(
    deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    dep = deployment("torch-l4")
    out = tmp_path / "out"
    first = run_cli("export", "k8s", str(dep.path), "--output-dir", str(out), "--json")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert report["kind"] == "Deployment" and report["files"] == on_disk
    again = run_cli("export", "k8s", str(dep.path), "--output-dir", str(out), "--replicas", "3")
    assert again.returncode == 2 and "is not empty" in again.stderr and "--force" in again.stderr
    forced = run_cli("export", "k8s", str(dep.path), "--output-dir", str(out), "--replicas", "3", "--force")
    assert forced.returncode == 0, forced.stderr
    assert yaml.safe_load((out / "hpa.yaml").read_text())["spec"]["minReplicas"] == 3
    elsewhere = tmp_path / "mine"
    (elsewhere / "notes").mkdir(parents=True)
    refused = run_cli("export", "k8s", str(dep.path), "--output-dir", str(elsewhere), "--force")
    assert refused.returncode == 2 and "not an earlier export" in refused.stderr
    assert (elsewhere / "notes").is_dir()  # a folder of something else is never replaced
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch folder left


@pytest.mark.parametrize(
    ("args", "changes", "code", "message"),
    [
        (["--replicas", "0"], {}, 2, "--replicas must be >= 1, got 0"),
        (["--gpus-per-node", "6"], {}, 2, "do not split into whole nodes of 6"),
        (["--gpus-per-node", "16"], {}, 2, "holds at most 8"),
        (["--storage", "volume"], {}, 2, "--storage volume needs --claim"),
        (["--storage", "volume", "--claim", "models"], {}, 2, "mounts the claim at /models"),
        (["--name", "Bad_Name"], {}, 2, "is not a Kubernetes resource name"),
        (["--storage", "s3"], {}, 2, "--storage 's3' is not one of build, volume"),
        (["--gateway", "a/b/c"], {}, 2, "'a/b' is not a namespace name"),
        (["--storage-size", "lots"], {}, 2, "--storage-size 'lots' is not a Kubernetes quantity"),
        (["--hf-token-secret", "Bad Secret"], {}, 2, "--hf-token-secret 'Bad Secret' is not a Kubernetes object"),
        (["--gpu-product", "has space"], {}, 2, "--gpu-product 'has space' is not a label value"),
        (["--access-mode", "ReadWriteOnce"], {}, 2, "--access-mode ReadWriteOnce: the build Job and every"),
        ([], {"gpu": "RTX-A6000"}, 2, "whose nvidia.com/gpu.product node label is not known"),
        ([], {"status": "failed"}, 4, "is not a complete build"),
    ],
)
def test_bad_input_is_one_line_with_a_hint(
    tmp_path: Path, args: list[str], changes: dict, code: int, message: str
) -> None:
    gpu = changes.pop("gpu", "H100")
    folder = write_manifest(
        tmp_path / "dep", models=["m"], entry_model="m", engine="trtllm", gpu=gpu, tp=8, pp=2, **changes
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(server_ranks=16, source=SOURCE)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli("export", "k8s", str(folder), "--output-dir", str(tmp_path / "out"), *args)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert message in lines[0] and len(lines) <= 2, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_deployment_is_not_found(tmp_path: Path) -> None:
    result = run_cli("export", "k8s", str(tmp_path / "nothing"))
    assert result.returncode == 3 and "does not exist" in result.stderr


def test_the_image_instructions_build_with_the_dockerfiles_arguments(deployment: Callable[..., Deployment]) -> None:
    dockerfile = (HERE.parents[1] / "docker" / "Dockerfile").read_text()
    for label in DEPLOYMENTS:
        ctx = make_context(deployment(label), ExportOptions())
        assert set(ctx.image_build_args) <= set(re.findall(r"^ARG (\w+)=", dockerfile, re.MULTILINE))
        assert ctx.image_build_args["PLUGINS"] == "qwen_llm"
        assert TRITON_IMAGES[ctx.image_build_args["TRTLLM_VERSION"]] == ctx.image_build_args["TRITON_TAG"]


def test_from_perf_sets_the_hpa_target_a_run_of_the_deployment_recommends(
    deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    dep = deployment("torch-l4")
    latencies = {1: [100.0] * 40, 2: [120.0] * 40, 4: [200.0] * 40}
    run = write_llm_run(
        tmp_path / "run", latencies, build={"model": "qwen_llm", "point": dep.point.name}, slo="e2e_ms_p99<=1000"
    )
    written = export_k8s(dep, ExportOptions(from_perf=run), tmp_path / "out")
    (hpa,) = (document for _, document in _documents(written.output_dir, ["hpa.yaml"]))
    target = hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    assert target == f"{round(recommend_hpa(run).in_flight * 1000)}m"
    assert target != f"{dep.point.max_batch_size}"  # not the default: a full batch
    other = write_llm_run(
        tmp_path / "other", latencies, build={"model": "qwen_llm", "point": "torch-fp16-bs8"}, slo="e2e_ms_p99<=1000"
    )
    result = run_cli("export", "k8s", str(dep.path), "--from-perf", str(other), "--output-dir", str(tmp_path / "x"))
    assert result.returncode == 2 and "measured qwen_llm torch-fp16-bs8" in result.stderr
    assert not (tmp_path / "x").exists()


def test_a_build_that_fails_before_it_can_say_so_is_marked_failed_for_the_waiting_pods(
    deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    """The Job's command and the pods' wait, run by sh with a `trtdeploy` that dies at once (as a failed download,
    a refused plan or a kill leave nothing behind)."""
    ctx = make_context(deployment("torch-l4"), ExportOptions(mount_path=str(tmp_path / "models")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtdeploy").write_text("#!/bin/sh\nexit 3\n")
    (bin_dir / "trtdeploy").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    built = subprocess.run(["sh", "-c", ctx.storage.job.command_line], env=env, check=False)
    assert built.returncode == 3  # the Job fails as the build did
    assert json.loads(Path(ctx.storage.deployment_dir + ".failed/manifest.json").read_text()) == {"status": "failed"}
    written = export_k8s(deployment("torch-l4"), ExportOptions(mount_path=str(tmp_path / "models")), tmp_path / "out")
    pod = yaml.safe_load((written.output_dir / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    (wait,) = pod["initContainers"]
    waited = subprocess.run(["sh", "-c", wait["args"][0]], env=env, capture_output=True, text=True, timeout=60)
    assert waited.returncode == 1 and "the build failed" in waited.stderr
