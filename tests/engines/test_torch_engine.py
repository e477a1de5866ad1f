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

#: The optional inputs of TensorRT-LLM's tensorrt_llm model (tensorrtllm_backend v0.19.0) that the python models take;
#: the ensemble refuses LoRA, prompt-table and guided-decoding inputs before they reach them.
OPTIONAL_INPUTS = {
    "end_id", "pad_id", "streaming", "exclude_input_in_output", "temperature", "runtime_top_k", "runtime_top_p",
    "random_seed", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_length", "beam_width",
    "len_penalty", "num_return_sequences", "return_log_probs", "return_context_logits", "return_generation_logits",
    "return_perf_metrics", "return_num_input_tokens", "return_num_output_tokens", "stop_words_list", "bad_words_list",
    "embedding_bias",
}  # fmt: skip
OUTPUTS = {
    "output_ids": [-1, -1], "sequence_length": [-1], "cum_log_probs": [-1], "output_log_probs": [-1, -1],
    "context_logits": [-1, -1], "generation_logits": [-1, -1, -1], "batch_index": [1], "sequence_index": [1],
    "kv_cache_alloc_new_blocks": [1], "kv_cache_reused_blocks": [1], "kv_cache_alloc_total_blocks": [1],
    "arrival_time_ns": [1], "first_scheduled_time_ns": [1], "first_token_time_ns": [1], "last_token_time_ns": [1],
    "acceptance_rate": [1], "total_accepted_draft_tokens": [1], "total_draft_tokens": [1], "num_input_tokens": [1],
    "num_output_tokens": [1],
}  # fmt: skip


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
    assert "lower --max-input-len/--max-output-len to sum to at most 256" in unsupported_reason(config, max_seq_len=384)
    assert unsupported_reason(config, max_seq_len=256) is None
    assert unsupported_reason({**config, "use_sliding_window": False}, max_seq_len=384) is None
    # Mistral has no switch: its window applies whenever it is set (v0.1), and v0.3 sets none
    mistral = {"architectures": ["MistralForCausalLM"], "sliding_window": 4096, "use_sliding_window": None}
    assert "last 4096 tokens only" in unsupported_reason(mistral, max_seq_len=8192)
    assert unsupported_reason(mistral, max_seq_len=4096) is None
    assert unsupported_reason({**mistral, "sliding_window": None}, max_seq_len=32768) is None


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
    assert list(inputs["stop_words_list"].dims) == [2, -1] and inputs["stop_words_list"].allow_ragged_batch
    assert {tensor.name: list(tensor.dims) for tensor in config.output} == OUTPUTS
    params = {key: value.string_value for key, value in config.parameters.items()}
    assert params["hf_model_dir"] == str(ctx.llm_dir)
    assert params["max_seq_len"] == "384" and params["max_slots"] == "64"
    assert params["device"] == ("cuda" if gpu == "H100" else "cpu")
    assert params["cuda_graphs"] == ("true" if gpu == "H100" else "false")
    assert params["exclude_input_in_output"] == "true"
    assert [group.kind for group in config.instance_group] == [config.instance_group[0].KIND_CPU]
