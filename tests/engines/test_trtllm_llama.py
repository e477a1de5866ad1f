"""The trtllm engine's plans for the llama_llm and mistral_llm plugin's models (the ``llama`` converter): exact
commands per TensorRT-LLM release and precision for the published config.json of Llama-3.1-8B-Instruct, Llama-2-7b
and Mistral-7B-Instruct-v0.3 (golden files, each headed by the upstream files it was checked against)."""

from __future__ import annotations

import pytest

from .trtllm_helpers import COMMANDS_GOLDEN, PRECISIONS, VERSIONS, check_golden, commands, plan, real_sized

LLAMA31_8B_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
MISTRAL_7B_INSTRUCT_V03 = {
    "architectures": ["MistralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 32768,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
#: golden folder -> the plugin's model and the published config.json values.
MODELS = {
    "llama-3.1-8b-instruct": ("llama_llm", LLAMA31_8B_INSTRUCT),
    "llama-2-7b": ("llama_llm", LLAMA2_7B),
    "mistral-7b-instruct-v0.3": ("mistral_llm", MISTRAL_7B_INSTRUCT_V03),
}


@pytest.fixture(scope="module")
def checkpoints(trtdeploy_checkpoint, tmp_path_factory):
    """Each model's config.json over its plugin's tiny random checkpoint."""
    return {
        name: real_sized(trtdeploy_checkpoint, tmp_path_factory, model, config)
        for name, (model, config) in MODELS.items()
    }


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("version", VERSIONS)
def test_llama_family_commands_per_release_and_precision(checkpoints, tmp_path, name, version):
    model, checkpoint = MODELS[name][0], checkpoints[name]
    sections = []
    for precision in PRECISIONS:
        found = plan(checkpoint, tmp_path, model=model, gpu="H100", precision=precision, engine_version=version)
        sections.append(f"## {precision}\n{commands(found, checkpoint)}\n")
    check_golden(f"{name}/{COMMANDS_GOLDEN[version]}", "".join(sections))
