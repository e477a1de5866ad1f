"""The trtllm engine's plans: exact commands per TensorRT-LLM release and precision (golden files), the rendered
config per backend family, the points it refuses, and engine reuse. No TensorRT-LLM is needed to plan."""

from __future__ import annotations

import json

import pytest

from trtdeploy import build
from trtdeploy.errors import UsageError
from trtdeploy.server._process import launch

from ..conftest import run_cli
from .trtllm_helpers import (
    PRECISIONS,
    QWEN2_72B,
    QWEN25_05B,
    SPARK_LLM,
    VERSIONS,
    check_golden,
    commands,
    plan,
    real_sized,
    rendered_config,
)


@pytest.fixture(scope="module")
def qwen05b(trtdeploy_checkpoint, tmp_path_factory):
    """Qwen2.5-0.5B's config.json over a tiny random checkpoint."""
    return real_sized(trtdeploy_checkpoint, tmp_path_factory, "qwen_llm", QWEN25_05B)


@pytest.fixture(scope="module")
def qwen72b(trtdeploy_checkpoint, tmp_path_factory):
    return real_sized(trtdeploy_checkpoint, tmp_path_factory, "qwen_llm", QWEN2_72B)


@pytest.mark.parametrize("version", VERSIONS)
def test_qwen25_05b_commands_per_release_and_precision(qwen05b, tmp_path, version):
    sections = []
    for precision in PRECISIONS:
        found = plan(qwen05b, tmp_path, gpu="H100", precision=precision, engine_version=version)
        sections.append(f"## {precision}\n{commands(found, qwen05b)}\n")
    check_golden(f"qwen2.5-0.5b/{version}.sh", "".join(sections))


@pytest.mark.parametrize("version", ["0.17.0.post1", "1.2.1"])
def test_qwen2_72b_commands_on_eight_h100(qwen72b, tmp_path, version):
    sections = []
    for tp, pp in ((4, 2), (8, 1)):
        for precision in ("fp8", "fp16", "int8_wo"):
            found = plan(qwen72b, tmp_path, gpu="H100:8", precision=precision, tp=tp, pp=pp, engine_version=version)
            sections.append(f"## tp{tp}pp{pp} {precision}\n{commands(found, qwen72b)}\n")
    check_golden(f"qwen2-72b/{version}.sh", "".join(sections))


@pytest.mark.parametrize(("version", "family"), [("0.17.0.post1", "0.17"), ("0.19.0", "0.19"), ("1.2.1", "1.x")])
def test_the_tensorrt_llm_config_per_backend_family(qwen05b, tmp_path, version, family):
    found = plan(qwen05b, tmp_path / "deployments", gpu="L4", engine_version=version, max_batch_size=16)
    text = rendered_config(found, tmp_path / "repo")
    assert "${" not in text and 'backend: "tensorrtllm"' in text
    check_golden(f"config/{family}.pbtxt", text)


def test_the_seed_input_follows_the_release_through_the_ensemble(qwen05b, tmp_path):
    for version, seed in (("0.19.0", "random_seed"), ("1.2.1", "seed")):
        found = plan(qwen05b, tmp_path / version, gpu="L4", engine_version=version)
        configs = build.render_repository(found.templates, tmp_path / version / "repo")
        assert f'input_map {{ key: "{seed}" value: "random_seed" }}' in configs["ensemble"].read_text()
        assert f'name: "{seed}"' in configs["tensorrt_llm"].read_text()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"gpu": "A100", "precision": "fp8"}, "fp8 needs compute capability 8.9\\+ and the A100-80GB is SM80"),
        ({"gpu": "H100:4", "tp": 4, "pp": 2}, "tp4pp2 needs 8 GPUs and 4 H100 are available"),
        ({"gpu": "cpu"}, "the trtllm engine builds for a GPU"),
        ({"gpu": "H100", "engine_version": "0.16.0"}, "outside what this engine plans for"),
        ({"gpu": "H100", "engine_version": "1.3.0"}, "outside what this engine plans for \\(0.17.x to 1.2.x\\)"),
        ({"gpu": "H100", "engine_version": "latest"}, "is not a version"),
    ],
)
def test_points_that_cannot_work_are_refused_with_their_reason(qwen05b, tmp_path, changes, message):
    with pytest.raises(UsageError, match=message):
        plan(qwen05b, tmp_path, **changes)


def test_a_model_too_large_for_its_gpus_is_refused_with_the_numbers(qwen72b, tmp_path):
    with pytest.raises(UsageError, match="does not fit a H100: .* GiB per GPU \\(weights 135"):
        plan(qwen72b, tmp_path, gpu="H100", precision="fp16")
    fits = plan(qwen72b, tmp_path, gpu="H100:8", precision="fp16", tp=8)
    assert any(note.startswith("memory: ") for note in fits.notes)


def test_the_matrix_reports_every_invalid_point_and_builds_none(qwen05b, tmp_path):
    result = run_cli(
        "build", "qwen_llm", "--engine", "trtllm", "--gpu", "A100:2", "--model-dir", str(qwen05b),
        "--precision", "bf16,fp8", "--max-batch-size", "8,16", "--tp", "1,2,4", "--isl-osl", "1024:256,2048:512",
        "--output-dir", str(tmp_path), "--dry-run", "--json",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "16 of 24 matrix points cannot be built" in result.stderr
    assert "fp8 needs compute capability" in result.stderr and "tp4pp1 needs 4 GPUs" in result.stderr
    assert not any(tmp_path.iterdir())
    skipped = run_cli(
        "build", "qwen_llm", "--engine", "trtllm", "--gpu", "A100:2", "--model-dir", str(qwen05b),
        "--precision", "bf16,fp8", "--max-batch-size", "8,16", "--tp", "1,2,4", "--isl-osl", "1024:256,2048:512",
        "--output-dir", str(tmp_path), "--dry-run", "--json", "--skip-invalid",
    )  # fmt: skip
    assert skipped.returncode == 0, skipped.stderr
    points = json.loads(skipped.stdout)["points"]
    names = sorted(p["deployment"].rsplit("/", 1)[1] for p in points)
    assert len(names) == 8 == len(set(names))
    assert "trtllm-bf16-bs16-tp2pp1-streaming-isl2048-osl512" in names


def test_a_dry_run_plans_for_a_release_that_is_not_installed(qwen05b, tmp_path):
    result = run_cli(
        "build", "qwen_llm", "--engine", "trtllm", "--gpu", "L4", "--model-dir", str(qwen05b),
        "--trtllm-version", "0.17.0.post1", "--output-dir", str(tmp_path), "--dry-run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "trtllm-build --checkpoint_dir trtllm_checkpoint" in result.stdout
    assert "nvcr.io/nvidia/tritonserver:25.02-trtllm-python-py3" in result.stdout
    built = run_cli("build", "qwen_llm", "--engine", "trtllm", "--gpu", "L4", "--model-dir", str(qwen05b))
    assert built.returncode == 2 and "tensorrt_llm is not installed" in built.stderr


def test_the_real_server_loads_every_model_that_does_not_need_the_tensorrtllm_backend(qwen05b, tmp_path):
    found = plan(qwen05b, tmp_path / "deployments", gpu="L4", engine_version="1.2.1")
    configs = build.render_repository(found.templates, tmp_path / "repo")
    python_models = [name for name, path in configs.items() if 'backend: "tensorrtllm"' not in path.read_text()]
    loadable = [name for name in python_models if name != "ensemble"]  # the ensemble needs tensorrt_llm
    assert loadable == ["preprocessing", "postprocessing"] or sorted(loadable) == ["postprocessing", "preprocessing"]
    explicit = ["--model-control-mode=explicit", *(f"--load-model={name}" for name in loadable)]
    with launch(tmp_path / "repo", models=loadable, extra_args=explicit, timeout=240) as server:
        assert server.is_ready(loadable)


@pytest.fixture(scope="module")
def spark_checkpoint(trtdeploy_checkpoint, tmp_path_factory):
    """The Spark-TTS layout with the real LLM's config.json."""
    return real_sized(trtdeploy_checkpoint, tmp_path_factory, "spark_tts", SPARK_LLM, llm_subfolder="LLM")


def spark_plan(checkpoint, root, **changes) -> build.Plan:
    return plan(checkpoint, root, model="spark_tts", gpu="L4", max_batch_size=16, **changes)


@pytest.mark.parametrize("version", VERSIONS)
def test_spark_tts_llm_commands_per_release_and_precision(spark_checkpoint, tmp_path, version):
    sections = []
    for precision in PRECISIONS:
        found = spark_plan(spark_checkpoint, tmp_path, precision=precision, engine_version=version)
        sections.append(f"## {precision}\n{commands(found, spark_checkpoint)}\n")
    check_golden(f"spark-tts-llm/{version}.sh", "".join(sections))


def test_spark_tts_on_an_l4_says_where_it_departs_from_the_official_recipe(spark_checkpoint, tmp_path):
    found = spark_plan(spark_checkpoint, tmp_path, engine_version="0.17.0.post1")
    notes = "\n".join(found.notes)
    assert "the official BLS asks for 512 tokens" in notes
    assert "default max_input_len 1024" in notes
    assert "caps it at 2560 tokens" in notes
    build_command = commands(found, spark_checkpoint).splitlines()[1]
    assert "--max_input_len 5048 --max_seq_len 5048" in build_command  # segmented streaming: prompt + answer so far
    configs = build.render_repository(found.templates, tmp_path / "repo")
    llm = configs["tensorrt_llm"].read_text()
    assert "decoupled: false" in llm and '"max_tokens_in_paged_kv_cache" value: { string_value: "80768" }' in llm
    assert 'key: "llm_seed_input" value: { string_value: "random_seed" }' in configs["spark_tts"].read_text()
    loadable = sorted(name for name, path in configs.items() if 'backend: "tensorrtllm"' not in path.read_text())
    assert loadable == ["audio_tokenizer", "spark_tts", "spark_tts_offline", "vocoder"]
    for name in ("audio_tokenizer", "vocoder"):  # built for the L4; this host has no GPU
        path = configs[name]
        path.write_text(path.read_text().replace('string_value: "cuda"', 'string_value: "cpu"'))
    explicit = ["--model-control-mode=explicit", *(f"--load-model={name}" for name in loadable)]
    with launch(tmp_path / "repo", models=loadable, extra_args=explicit, timeout=300) as server:
        assert server.is_ready(loadable)


def test_replicas_are_instances_on_gpu_groups_of_their_own(qwen05b, tmp_path):
    found = plan(qwen05b, tmp_path / "d", gpu="H100:4", tp=2, replicas=2)
    assert found.point.name.endswith("-x2") and found.engine.server_env(found.context) == {"TRTLLM_ORCHESTRATOR": "1"}
    text = build.render_repository(found.templates, tmp_path / "repo")["tensorrt_llm"].read_text()
    assert 'key: "gpu_device_ids" value: { string_value: "0,1;2,3" }' in text and "count: 2" in text
    with pytest.raises(UsageError, match="2 replicas of tp2pp1 needs 4 GPUs and 2 H100 are available"):
        plan(qwen05b, tmp_path, gpu="H100:2", tp=2, replicas=2)
    torch = plan(qwen05b, tmp_path / "t", engine="torch", gpu="H100:2", replicas=2)
    text = build.render_repository(torch.templates, tmp_path / "torch-repo")["tensorrt_llm"].read_text()
    assert "kind: KIND_GPU" in text and "gpus: [ 0, 1 ]" in text
    with pytest.raises(UsageError, match="runs one LLM per deployment"):
        plan(qwen05b, tmp_path, engine="trtllm_pytorch", gpu="H100:2", replicas=2)
