"""The torch engine's build-time side: availability, validation, and its rendered config.pbtxt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtdeploy.engines.torch import TorchEngine, unsupported_reason
from trtdeploy.errors import UsageError
from trtdeploy.repo import TemplateSource, render_repository, validate_config
from trtdeploy.spec import BuildContext, BuildPoint

OPTIONAL_INPUTS = {
    "end_id",
    "pad_id",
    "streaming",
    "temperature",
    "runtime_top_k",
    "runtime_top_p",
    "repetition_penalty",
    "random_seed",
    "exclude_input_in_output",
}


def context(tmp_path: Path, *, mode="streaming", gpu="H100", tp=1, architecture="Qwen2ForCausalLM", **config):
    llm_dir = tmp_path / "llm"
    llm_dir.mkdir(exist_ok=True)
    (llm_dir / "config.json").write_text(json.dumps({"architectures": [architecture], **config}))
    point = BuildPoint(
        model="qwen_llm",
        engine="torch",
        precision="bf16",
        max_batch_size=64,
        mode=mode,
        gpu=gpu,
        max_input_len=128,
        max_output_len=256,
        tp=tp,
    )
    deployment = tmp_path / "deployment"
    return BuildContext(
        point=point,
        deployment_dir=deployment,
        checkpoint_dir=llm_dir,
        llm_dir=llm_dir,
        engine_dir=deployment / "engines",
        model_repo_dir=deployment / "model_repo",
    )


def test_cli_import_does_not_pull_in_torch():
    code = (
        "import sys, trtdeploy.engines.torch as e; e.TorchEngine().unavailable_reason(); print('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_defaults_and_availability():
    engine = TorchEngine()
    assert engine.unavailable_reason() is None  # torch and transformers are installed here
    assert (engine.default_precision("cuda"), engine.default_precision("cpu")) == ("bf16", "fp32")
    assert set(engine.precisions) == {"fp32", "fp16", "bf16"}


def test_validate_rejects_tensor_and_pipeline_parallelism(tmp_path):
    with pytest.raises(UsageError, match="torch engine serves one GPU; use --engine trtllm for TP/PP"):
        TorchEngine().validate(context(tmp_path, tp=2))


def test_validate_rejects_an_unsupported_architecture(tmp_path):
    with pytest.raises(UsageError, match="architecture GPT2LMHeadModel is not supported"):
        TorchEngine().validate(context(tmp_path, architecture="GPT2LMHeadModel"))
    TorchEngine().validate(context(tmp_path, architecture="LlamaForCausalLM"))


def test_sliding_window_is_refused_only_when_it_matters():
    config = {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 256}
    assert "sliding-window" in unsupported_reason(config, max_seq_len=384)
    assert unsupported_reason(config, max_seq_len=256) is None
    assert unsupported_reason({**config, "use_sliding_window": False}, max_seq_len=384) is None


@pytest.mark.parametrize(("mode", "gpu"), [("streaming", "H100"), ("offline", "cpu")])
def test_config_renders_the_llm_contract(tmp_path, mode, gpu):
    ctx = context(tmp_path, mode=mode, gpu=gpu)
    engine = TorchEngine()
    variables = {"ctx": ctx, "engine": engine.template_context(ctx)}
    configs = render_repository([TemplateSource(engine.templates_dir, ("tensorrt_llm",), variables)], tmp_path / "r")
    config = validate_config(configs["tensorrt_llm"], expected_name="tensorrt_llm")
    assert (tmp_path / "r" / "tensorrt_llm" / "1" / "model.py").is_file()
    assert config.backend == "python" and config.max_batch_size == 64
    assert config.model_transaction_policy.decoupled == (mode == "streaming")
    inputs = {tensor.name: tensor for tensor in config.input}
    assert list(inputs["input_ids"].dims) == [-1] and inputs["input_ids"].allow_ragged_batch
    assert {name for name, tensor in inputs.items() if tensor.optional} == OPTIONAL_INPUTS
    assert {tensor.name: list(tensor.dims) for tensor in config.output} == {
        "output_ids": [-1, -1],
        "sequence_length": [-1],
    }
    params = {key: value.string_value for key, value in config.parameters.items()}
    assert params["hf_model_dir"] == str(ctx.llm_dir)
    assert params["max_seq_len"] == "384" and params["max_slots"] == "64"
    assert params["device"] == ("cuda" if gpu == "H100" else "cpu")
    assert params["cuda_graphs"] == ("true" if gpu == "H100" else "false")
    assert params["exclude_input_in_output"] == "true"
    assert [group.kind for group in config.instance_group] == [config.instance_group[0].KIND_CPU]
