"""The trtllm engine's plans: exact commands per TensorRT-LLM release and precision (golden files, one per distinct
plan, each headed by the upstream files and tags it was checked against), the rendered config per release, the points
it refuses and why, and engine reuse. No TensorRT-LLM is needed to plan."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import huggingface_hub.constants
import pytest

import trtdeploy
from trtdeploy import build, matrix
from trtdeploy.engines.trtllm import TrtllmEngine, releases
from trtdeploy.engines.trtllm.commands import awq_shard_problems, awq_tps
from trtdeploy.errors import UsageError
from trtdeploy.server._process import launch

from ..conftest import run_cli
from .trtllm_helpers import (
    COMMANDS_GOLDEN,
    GOLDEN,
    PRECISIONS,
    QWEN2_72B,
    QWEN3_8B,
    QWEN3_30B_A3B,
    QWEN25_05B,
    SPARK_LLM,
    VERSIONS,
    check_golden,
    commands,
    plan,
    real_sized,
    rendered_config,
)

#: The precisions whose GEMM kernels TensorRT-LLM's engine flow has no SM10.x (B200) dispatch for.
SM100_REFUSED = ("int8_wo", "int4_wo", "int4_awq", "int8_sq")


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
    check_golden(f"one-h100/{COMMANDS_GOLDEN[version]}", "".join(sections))


@pytest.mark.parametrize("version", ["0.17.0.post1", "1.2.1"])
def test_qwen2_72b_commands_on_eight_h100(qwen72b, tmp_path, version):
    sections = []
    for tp, pp in ((4, 2), (8, 1)):
        for precision in ("fp8", "fp16", "int8_wo"):
            found = plan(qwen72b, tmp_path, gpu="H100:8", precision=precision, tp=tp, pp=pp, engine_version=version)
            sections.append(f"## tp{tp}pp{pp} {precision}\n{commands(found, qwen72b)}\n")
    check_golden(f"qwen2-72b/{COMMANDS_GOLDEN[version]}", "".join(sections))


#: The tensorrt_llm config of each release's backend: random_seed/min_length and return_kv_cache_reuse_stats (0.17,
#: 0.18), return_perf_metrics and its outputs (0.19), seed/min_tokens (0.20 on), the token counts (1.0 on).
CONFIG_GOLDEN = {
    "0.17.0.post1": "0.17-0.18",
    "0.18.2": "0.17-0.18",
    "0.19.0": "0.19",
    "0.20.0": "0.20-0.21",
    "0.21.0": "0.20-0.21",
    "1.0.0": "1.0-1.2",
    "1.2.1": "1.0-1.2",
}


@pytest.mark.parametrize("version", CONFIG_GOLDEN)
def test_the_tensorrt_llm_config_per_release(qwen05b, tmp_path, version):
    found = plan(qwen05b, tmp_path / "deployments", gpu="L4", engine_version=version, max_batch_size=16)
    text = rendered_config(found, tmp_path / "repo")
    assert "${" not in text and 'backend: "tensorrtllm"' in text
    check_golden(f"config/{CONFIG_GOLDEN[version]}.pbtxt", text)


@pytest.mark.parametrize(
    ("version", "seed", "min_tokens"),
    [("0.19.0", "random_seed", "min_length"), ("0.20.0", "seed", "min_tokens"), ("0.21.0", "seed", "min_tokens")],
)
def test_the_seed_input_follows_the_release_through_the_ensemble(qwen05b, tmp_path, version, seed, min_tokens):
    found = plan(qwen05b, tmp_path, gpu="L4", engine_version=version)
    configs = build.render_repository(found.templates, tmp_path / "repo")
    ensemble = configs["ensemble"].read_text()  # feeds the backend its own names
    assert f'input_map {{ key: "{seed}" value: ' in ensemble and f'input_map {{ key: "{min_tokens}" value: ' in ensemble
    llm = configs["tensorrt_llm"].read_text()
    assert f'name: "{seed}"' in llm and f'name: "{min_tokens}"' in llm
    assert ("examples/models/core/qwen/" in commands(found, qwen05b)) == (version != "0.19.0")


def test_the_statistics_a_request_asks_for_are_declared_as_outputs(qwen05b, tmp_path):
    """The backend writes these outputs when the input is true: undeclared, Triton fails the response."""
    for version, switch, last in (
        ("0.18.2", "return_kv_cache_reuse_stats", "kv_cache_alloc_total_blocks"),
        ("1.2.1", "return_perf_metrics", "total_draft_tokens"),
    ):
        found = plan(qwen05b, tmp_path / version, gpu="L4", engine_version=version)
        llm = rendered_config(found, tmp_path / version / "repo")
        assert f'name: "{switch}"' in llm and f'name: "{last}"' in llm
        assert "arrival_time_ns" in llm if switch == "return_perf_metrics" else "arrival_time_ns" not in llm


@pytest.mark.parametrize("version", ["0.21.0", "1.0.0"])
def test_the_token_counts_reach_the_backend_from_the_release_that_has_them(qwen05b, tmp_path, version):
    """return_num_input_tokens/return_num_output_tokens (TensorRT-LLM pull request 5445, after 0.20.0; taken from
    1.0): declared on the tensorrt_llm model with their outputs, and passed through by the qwen ensemble."""
    found = plan(qwen05b, tmp_path, gpu="L4", engine_version=version)
    configs = build.render_repository(found.templates, tmp_path / "repo")
    llm, ensemble = configs["tensorrt_llm"].read_text(), configs["ensemble"].read_text()
    has_them = version == "1.0.0"
    for name in ("return_num_input_tokens", "return_num_output_tokens", "num_input_tokens", "num_output_tokens"):
        assert (f'name: "{name}"' in llm) == has_them
        assert (f'{{ name: "{name}" data_type:' in ensemble) == has_them  # the official ensemble of the release
        assert (f'key: "{name}" value: "{name}" }}' in ensemble) == has_them


def test_the_release_facts_are_public_for_plugins():
    assert trtdeploy.trtllm_release((0, 19)).seed_input == "random_seed"
    twenty = trtdeploy.trtllm_release((0, 20))
    assert (twenty.seed_input, twenty.min_tokens_input, twenty.token_count_inputs) == ("seed", "min_tokens", ())
    assert "token_count_inputs" in twenty.unconfirmed and "token_count_inputs" in twenty.sources
    assert trtdeploy.trtllm_release((0, 18)).guided_decoding_inputs == ()
    newest = trtdeploy.newest_trtllm_release()
    assert newest.line == (1, 2) and newest.token_count_outputs == ("num_input_tokens", "num_output_tokens")
    assert isinstance(newest, trtdeploy.TrtllmRelease)
    with pytest.raises(LookupError, match="no facts for TensorRT-LLM 0.22"):
        trtdeploy.trtllm_release((0, 22))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"gpu": "A100", "precision": "fp8"}, "fp8 needs compute capability 8.9\\+ and the A100-80GB is SM80"),
        ({"gpu": "H100:4", "tp": 4, "pp": 2}, "tp4pp2 needs 8 GPUs and 4 H100 are available"),
        ({"gpu": "cpu"}, "the trtllm engine builds for a GPU"),
        ({"gpu": "H100", "engine_version": "0.16.0"}, "outside what this engine plans for"),
        ({"gpu": "H100", "engine_version": "1.3.0"}, "outside what this engine plans for \\(0.17.x to 1.2.x\\)"),
        ({"gpu": "H100", "engine_version": "0.22.0"}, "not a release line this engine knows \\(0.17, 0.18, "),
        ({"gpu": "H100", "engine_version": "latest"}, "is not a version"),
        ({"gpu": "A100", "precision": "int4_awq", "kv_cache_dtype": "fp8"}, "fp8 needs compute capability 8.9"),
        ({"gpu": "A100", "kv_cache_dtype": "fp8"}, "--kv-cache-dtype fp8 needs compute capability 8.9\\+"),
        ({"gpu": "H100", "precision": "int8_wo", "kv_cache_dtype": "fp8"}, "convert_checkpoint.py, which writes"),
        ({"gpu": "H100", "kv_cache_dtype": "fp4"}, "--kv-cache-dtype 'fp4' is not one of fp8, int8"),
        ({"gpu": "H100", "precision": "fp8", "calib_size": 0}, "--calib-size must be >= 1"),
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


def test_a_dry_run_plans_for_a_release_that_is_not_installed(qwen05b, tmp_path, monkeypatch):
    result = run_cli(
        "build", "qwen_llm", "--engine", "trtllm", "--gpu", "L4", "--model-dir", str(qwen05b),
        "--trtllm-version", "0.17.0.post1", "--output-dir", str(tmp_path), "--dry-run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "trtllm-build --checkpoint_dir trtllm_checkpoint" in result.stdout
    assert "nvcr.io/nvidia/tritonserver:25.02-trtllm-python-py3" in result.stdout
    # whether or not this machine has TensorRT-LLM: a build where it is missing is refused with the reason
    monkeypatch.setattr(TrtllmEngine, "unavailable_reason", lambda self: "tensorrt_llm is not installed")
    request = build.BuildRequest(model="qwen_llm", engine="trtllm", gpu="L4", model_dir=qwen05b, output_root=tmp_path)
    with pytest.raises(UsageError, match="engine 'trtllm' is not usable here: tensorrt_llm is not installed"):
        build.plan(request)


@pytest.fixture(scope="module")
def qwen3_8b(trtdeploy_checkpoint, tmp_path_factory):
    return real_sized(trtdeploy_checkpoint, tmp_path_factory, "qwen_llm", QWEN3_8B)


def test_qwen3_is_planned_from_the_release_whose_engine_flow_converts_it(qwen3_8b, tmp_path):
    sections = []
    for precision in PRECISIONS:
        found = plan(qwen3_8b, tmp_path, gpu="H100", precision=precision, engine_version="1.2.1")
        sections.append(f"## {precision}\n{commands(found, qwen3_8b)}\n")
    check_golden("one-h100/0.20-1.2.sh", "".join(sections))  # the plan of Qwen2.5 on the same GPU
    assert "examples/models/core/qwen/convert_checkpoint.py" in commands(
        plan(qwen3_8b, tmp_path, gpu="H100", engine_version="1.0.0"), qwen3_8b
    )
    with pytest.raises(UsageError, match="TensorRT-LLM 0.21.0 cannot build Qwen3ForCausalLM engines .* from 1.0") as no:
        plan(qwen3_8b, tmp_path, gpu="H100", engine_version="0.21.0")
    assert "--trtllm-version 1.0.0 or newer" in no.value.hint
    assert releases.first_with("Qwen3MoeForCausalLM").line == (1, 0)


def test_int4_awq_checks_every_dimension_it_shards():
    """Row-parallel layers (attention output, MLP and expert down projections) split their input by TP, and AWQ
    scales each 128 input channels together: every shard must hold whole groups."""
    assert awq_shard_problems(QWEN2_72B, 4) == [
        "intermediate_size (down projection input) 29,568 / TP4 = 7,392 is not a multiple of the AWQ block 128"
    ]
    assert awq_tps(QWEN2_72B, 8) == [1]
    assert awq_shard_problems(QWEN25_05B, 2) == [
        "attention output projection input (heads x head_dim) 896 / TP2 = 448 is not a multiple of the AWQ block 128"
    ]
    moe = awq_shard_problems(QWEN3_30B_A3B, 8)
    assert moe == [
        "moe_intermediate_size (expert down projection input) 768 / TP8 = 96 is not a multiple of the AWQ block 128"
    ]
    assert awq_tps(QWEN3_30B_A3B, 8) == [1, 2] and awq_tps(QWEN3_8B, 8) == [1, 2, 4, 8]


def test_the_refused_points_and_their_reasons(qwen72b, qwen3_8b, tmp_path):
    """int4_awq at a TP that splits a dimension into partial AWQ groups, the precisions SM10.x has no kernels for
    (planned on SM12.x, where later sources have them), Qwen3 before its release: each with the numbers and a way
    out."""
    lines = []
    for checkpoint, base, changes in (
        (
            qwen72b,
            {"gpu": "H100:8", "precision": "int4_awq", "engine_version": "1.2.1"},
            [{"tp": 2}, {"tp": 4}, {"tp": 8}, {"tp": 1, "pp": 8}],
        ),
        (qwen3_8b, {"gpu": "B200", "engine_version": "1.2.1"}, [{"precision": p} for p in PRECISIONS]),
        (qwen3_8b, {"gpu": "RTX5090", "engine_version": "1.2.1"}, [{"precision": p} for p in SM100_REFUSED]),
        (qwen3_8b, {"gpu": "H100"}, [{"engine_version": v} for v in ("0.19.0", "0.21.0", "1.0.0")]),
    ):
        request = build.BuildRequest(model="qwen_llm", engine="trtllm", model_dir=checkpoint, output_root=tmp_path)
        requests = [replace(request, **base, **change) for change in changes]
        plans, rejected = matrix.plan_all(requests, dry_run=True, skip_invalid=True)
        lines += [f"planned: {found.point.name} {found.point.engine_version}" for found in plans]
        lines += [
            f"refused: {item.label} {item.request.engine_version}: {item.reason} | hint: {item.error.hint}"
            for item in rejected
        ]
    check_golden("refused.txt", "\n".join(lines) + "\n")


def test_on_sm120_the_integer_precisions_are_planned_with_a_note_on_their_kernels(qwen05b, tmp_path):
    """Later sources have SM120 kernels for them, older ones do not, and none is pinned to a release: the plan says
    so instead of refusing a build that may work."""
    for precision in SM100_REFUSED:
        found = plan(qwen05b, tmp_path, gpu="RTX5090", precision=precision, engine_version="1.2.1")
        notes = [note for note in found.notes if note.startswith(f"{precision} on RTX5090 (SM120): planned")]
        assert len(notes) == 1 and "sources not pinned to a release" in notes[0], found.notes
    bf16 = plan(qwen05b, tmp_path, gpu="RTX5090", precision="bf16", engine_version="1.2.1")
    assert not any("Arch unsupported" in note for note in bf16.notes)


def test_points_differing_only_in_kv_cache_or_calibration_get_folders_of_their_own(qwen05b, tmp_path):
    base = {"gpu": "H100", "precision": "fp8", "engine_version": "1.2.1"}
    names = [
        plan(qwen05b, tmp_path, **base, **changes).point.name
        for changes in (
            {},
            {"kv_cache_dtype": "int8"},
            {"calib_size": 256},
            {"calib_dataset": tmp_path / "a"},
            {"calib_dataset": tmp_path / "b"},
            {"kv_cache_dtype": "fp8", "calib_size": 64, "calib_dataset": tmp_path / "a"},
        )
    ]
    assert len(set(names)) == len(names)
    assert names[:3] == [
        "trtllm-fp8-bs64-tp1pp1-streaming",
        "trtllm-fp8-bs64-tp1pp1-streaming-kvint8",
        "trtllm-fp8-bs64-tp1pp1-streaming-calib256",
    ]
    assert re.fullmatch(r"trtllm-fp8-bs64-tp1pp1-streaming-calibdata-[0-9a-f]{6}", names[3])
    digest = names[3].rsplit("-", 1)[1]
    assert names[5] == f"trtllm-fp8-bs64-tp1pp1-streaming-kvfp8-calib64-calibdata-{digest}"


def test_a_dry_run_without_config_json_says_the_awq_check_is_pending(tmp_path):
    found = plan(None, tmp_path, gpu="H100:2", precision="int4_awq", tp=2, engine_version="1.2.1")
    assert not (found.context.llm_dir / "config.json").exists()
    pending = [note for note in found.notes if note.startswith("int4_awq at TP2: that every sharded input dimension")]
    assert len(pending) == 1 and "a build fetches it before the weights" in pending[0], found.notes


def test_a_build_checks_the_awq_shards_on_config_json_before_it_downloads_the_weights(qwen72b, tmp_path, monkeypatch):
    """A Hub cache that holds the default repository's config.json and nothing else (the tests never reach the Hub):
    the plan refuses the point, where a weights download would fail first."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    shutil.copy(qwen72b / "config.json", repo / "snapshots" / commit / "config.json")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(TrtllmEngine, "unavailable_reason", lambda self: None)
    request = build.BuildRequest(
        model="qwen_llm", engine="trtllm", gpu="H100:8", precision="int4_awq", output_root=tmp_path / "out"
    )
    with pytest.raises(UsageError, match="int4_awq at TP4: intermediate_size .* 29,568 / TP4"):
        build.plan(replace(request, tp=4))
    found = build.plan(replace(request, tp=1, pp=8))
    assert found.context.llm_dir == (repo / "snapshots" / commit).resolve()
    assert "int4_awq at TP1: every sharded input dimension is a whole number of 128-wide AWQ groups" in "\n".join(
        found.notes
    )
    assert not (tmp_path / "out").exists()


def test_calibration_and_kv_cache_options_reach_the_checkpoint_step(qwen05b, tmp_path, monkeypatch):
    dataset = tmp_path / "calib"
    dataset.mkdir()
    awq = plan(qwen05b, tmp_path, gpu="H100", precision="int4_awq", calib_dataset=dataset, engine_version="1.2.1")
    quantize = commands(awq, qwen05b).splitlines()[0]
    assert f"--calib_size 32 --calib_dataset {dataset}" in quantize
    assert f"calibration on {dataset}, 32 samples" in awq.notes
    fp8 = plan(qwen05b, tmp_path, gpu="H100", precision="fp8", calib_size=64, kv_cache_dtype="int8")
    first, second = commands(fp8, qwen05b).splitlines()
    assert "--kv_cache_dtype int8 --calib_size 64" in first and "--use_fp8_context_fmha" not in second
    int8_kv = plan(qwen05b, tmp_path, gpu="A100", precision="bf16", kv_cache_dtype="int8", calib_dataset=dataset)
    assert f"--int8_kv_cache --calib_dataset {dataset}" in commands(int8_kv, qwen05b)
    unused = plan(qwen05b, tmp_path, gpu="H100", precision="bf16", calib_size=64)
    assert any(note.startswith("--calib-dataset/--calib-size unused") for note in unused.notes)
    monkeypatch.setattr(TrtllmEngine, "unavailable_reason", lambda self: None)  # a real build checks the folder
    request = build.BuildRequest(model="qwen_llm", engine="trtllm", gpu="H100", model_dir=qwen05b, output_root=tmp_path)
    with pytest.raises(UsageError, match="--calib-dataset .*missing does not exist"):
        build.plan(replace(request, calib_dataset=tmp_path / "missing"))


def test_an_engine_that_cannot_honour_an_option_refuses_it_in_one_line(qwen05b, tmp_path):
    result = run_cli(
        "build", "qwen_llm", "--engine", "torch", "--gpu", "cpu", "--model-dir", str(qwen05b),
        "--kv-cache-dtype", "int8", "--calib-size", "8", "--output-dir", str(tmp_path), "--dry-run",
    )  # fmt: skip
    assert result.returncode == 2
    assert "Error: engine 'torch' cannot honour --kv-cache-dtype, --calib-size" in result.stderr
    assert not any(tmp_path.iterdir())


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
    check_golden(f"spark-tts-llm/{COMMANDS_GOLDEN[version]}", "".join(sections))


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
    assert found.point.name.endswith("-x2")
    orchestrator = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}  # launch_triton_server.py
    assert found.engine.server_env(found.context) == orchestrator
    assert any("mpirun -n 1" in note and "zero CUDA memory pool on every GPU" in note for note in found.notes)
    text = build.render_repository(found.templates, tmp_path / "repo")["tensorrt_llm"].read_text()
    assert 'key: "gpu_device_ids" value: { string_value: "0,1;2,3" }' in text and "count: 2" in text
    with pytest.raises(UsageError, match="2 replicas of tp2pp1 needs 4 GPUs and 2 H100 are available"):
        plan(qwen05b, tmp_path, gpu="H100:2", tp=2, replicas=2)
    torch = plan(qwen05b, tmp_path / "t", engine="torch", gpu="H100:2", replicas=2)
    text = build.render_repository(torch.templates, tmp_path / "torch-repo")["tensorrt_llm"].read_text()
    assert "kind: KIND_GPU" in text and "gpus: [ 0, 1 ]" in text
    with pytest.raises(UsageError, match="runs one LLM per deployment"):
        plan(qwen05b, tmp_path, engine="trtllm_pytorch", gpu="H100:2", replicas=2)


def test_rewriting_the_golden_files_is_refused_under_ci(monkeypatch):
    golden = GOLDEN / "refused.txt"
    before = golden.read_text()
    monkeypatch.setenv("TRTDEPLOY_UPDATE_GOLDEN", "1")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="refused under CI"):
        check_golden("refused.txt", "a plan nobody reviewed\n")
    assert golden.read_text() == before
