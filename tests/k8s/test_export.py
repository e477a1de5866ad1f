"""``trtdeploy export k8s``: every manifest validates offline (Kubernetes' own schemas through kubernetes-validate,
the CRDs' published schemas through jsonschema), kustomization.yaml applies exactly what was written, the exports
match their golden files, and a change of the deployment shows up where it must and nowhere else."""

from __future__ import annotations

import json
import os
import re
import shlex
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
from trtdeploy.k8s._export import EXTRA_FILES

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


@pytest.mark.parametrize("label", DEPLOYMENTS)
def test_every_manifest_validates_and_kustomize_applies_exactly_what_was_written(
    deployment: Callable[..., Deployment], tmp_path: Path, label: str
) -> None:
    written = export_k8s(deployment(label), OPTIONS, tmp_path / "k8s")
    files = sorted(p.name for p in written.output_dir.iterdir())
    assert files == written.files
    resources = _resources(written.output_dir)
    assert sorted(resources) == sorted(set(files) - {"kustomization.yaml", *EXTRA_FILES}) == sorted(written.resources)
    kinds = []
    for name, doc in _documents(written.output_dir, resources):
        kinds.append(doc["kind"])
        crd = CRDS.get((doc["apiVersion"], doc["kind"]))
        if crd is not None:
            jsonschema.validate(doc, json.loads((HERE / "crds" / crd).read_text()))
        else:  # raises SchemaNotFoundError for a kind it does not know, instead of passing it
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
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
        golden.mkdir(parents=True, exist_ok=True)
        for stale in golden.iterdir():
            stale.unlink()
        for name in written.files:
            (golden / name).write_text((written.output_dir / name).read_text())
        pytest.skip(f"rewrote {golden}")
    assert sorted(p.name for p in golden.iterdir()) == written.files
    for name in written.files:
        assert (written.output_dir / name).read_text() == (golden / name).read_text(), name


def _leaves(node: Any, path: tuple = ()) -> dict[tuple, Any]:
    """Every scalar of a parsed document by its path (list items by index, the args of a command by index too)."""
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, (*path, key)).items()}
    if isinstance(node, list):
        return {k: v for index, value in enumerate(node) for k, v in _leaves(value, (*path, index)).items()}
    return {path: node}


def _changes(before: Path, after: Path) -> dict[tuple, tuple[Any, Any]]:
    """(file, *path) -> (before, after) for every scalar of the resources that differs."""
    found = {}
    for name in _resources(before):
        old, new = (_leaves(yaml.safe_load((folder / name).read_text())) for folder in (before, after))
        for path in old.keys() | new.keys():
            if old.get(path) != new.get(path):
                found[(name, *path)] = (old.get(path), new.get(path))
    return found


def test_a_change_of_gpu_release_or_tp_shows_up_where_it_must(
    deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    options = ExportOptions(name="qwen")
    base = export_k8s(deployment(), options, tmp_path / "base").output_dir
    affinity = ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    selector = (*affinity, "nodeSelectorTerms", 0, "matchExpressions", 0, "values", 0)

    other_gpu = export_k8s(deployment(gpu="A100-80GB:4"), options, tmp_path / "gpu").output_dir
    assert _changes(base, other_gpu) == {
        ("deployment.yaml", "spec", "template", *selector): ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"),
        ("deployment.yaml", "spec", "template", *selector[:-1], 1): ("NVIDIA-H100-PCIe", "NVIDIA-A100-80GB-PCIe"),
        ("build-job.yaml", "spec", "template", *selector): ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"),
        ("build-job.yaml", "spec", "template", *selector[:-1], 1): ("NVIDIA-H100-PCIe", "NVIDIA-A100-80GB-PCIe"),
        ("build-job.yaml", "spec", "template", "spec", "containers", 0, "args", 3): (
            "--gpu=H100:4",
            "--gpu=A100-80GB:4",
        ),  # noqa: E501
    }

    older = export_k8s(deployment(engine_version="0.19.0"), options, tmp_path / "release").output_dir
    changes = _changes(base, older)
    images = {path: change for path, change in changes.items() if path[-1] == "image"}
    assert set(images.values()) == {("trtdeploy:0.1.0-trtllm1.2.1-qwen-llm", "trtdeploy:0.1.0-trtllm0.19.0-qwen-llm")}
    assert len(images) == 3  # the serving container, the wait for the build, the build
    assert set(changes) - set(images) == {("build-job.yaml", "spec", "template", "spec", "containers", 0, "args", 13)}
    assert "--trtllm-version=0.19.0" in (older / "build-job.yaml").read_text()
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
    assert all("tp2pp1" in str(new) or new in ("--tp=2", "--gpu=H100:2") for _, new in changes.values() if new != 2)


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
    (local.path / "manifest.json").write_text(json.dumps(manifest))
    argv = build_argv(Deployment.load(local.path), output_dir=str(tmp_path), checkpoint_dir=str(qwen_checkpoint))
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
    assert report["kind"] == "Deployment" and report["files"] == sorted(p.name for p in out.iterdir())
    again = run_cli("export", "k8s", str(dep.path), "--output-dir", str(out), "--replicas", "3")
    assert again.returncode == 2 and "is not empty" in again.stderr and "--force" in again.stderr
    forced = run_cli("export", "k8s", str(dep.path), "--output-dir", str(out), "--replicas", "3", "--force")
    assert forced.returncode == 0, forced.stderr
    assert yaml.safe_load((out / "deployment.yaml").read_text())["spec"]["replicas"] == 3
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
    run = write_llm_run(tmp_path / "run", latencies, build={"point": dep.point.name}, slo="e2e_ms_p99<=1000")
    written = export_k8s(dep, ExportOptions(from_perf=run), tmp_path / "out")
    (hpa,) = (document for _, document in _documents(written.output_dir, ["hpa.yaml"]))
    target = hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    assert target == f"{round(recommend_hpa(run).in_flight * 1000)}m"
    assert target != f"{dep.point.max_batch_size}"  # not the default: a full batch
    other = write_llm_run(tmp_path / "other", latencies, build={"point": "torch-fp16-bs8"}, slo="e2e_ms_p99<=1000")
    result = run_cli("export", "k8s", str(dep.path), "--from-perf", str(other), "--output-dir", str(tmp_path / "x"))
    assert result.returncode == 2 and "measured the deployment torch-fp16-bs8" in result.stderr
    assert not (tmp_path / "x").exists()
