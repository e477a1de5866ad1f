"""llama_llm and mistral_llm without a server: checkpoint checks, end tokens per tokenizer, Llama 3.1's rope scaling in
the torch engine, and the sliding window of Mistral v0.1 refused where no engine here implements it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from trtdeploy import UsageError, build
from trtdeploy.checkpoints import write_tokenizer
from trtdeploy.plugins import get_model
from trtdeploy.testing import RecordingSink


def test_the_plugins_command_lists_both_models():
    result = subprocess.run(
        [sys.executable, "-m", "trtdeploy", "plugins", "--json"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    listed = {plugin["name"]: plugin for plugin in json.loads(result.stdout)["plugins"]}
    assert listed["llama_llm"]["models"] == ["llama_llm", "mistral_llm"]
    assert listed["llama_llm"]["version"] == "0.1.0"


def with_config(folder, **values):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **values}))


@pytest.mark.parametrize(("model", "other"), [("llama_llm", "mistral_llm"), ("mistral_llm", "llama_llm")])
def test_validate_checkpoint_names_what_is_wrong(trtdeploy_checkpoint, tmp_path, model, other):
    spec = get_model(model)
    good = trtdeploy_checkpoint(model)
    spec.validate_checkpoint(good)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(good, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(UsageError, match=r"holds no \*.safetensors"):
        spec.validate_checkpoint(no_weights)
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(good, no_tokenizer, ignore=shutil.ignore_patterns("tokenizer_config.json"))
    with pytest.raises(UsageError, match=r"missing tokenizer_config.json"):
        spec.validate_checkpoint(no_tokenizer)
    # the other family's checkpoint: named by its architecture
    (architecture,) = get_model(other).architectures
    with pytest.raises(UsageError, match=f"is a {architecture}, not one of {spec.architectures[0]}"):
        spec.validate_checkpoint(trtdeploy_checkpoint(other))


def test_random_checkpoints_have_their_familys_tokenizer_and_config(trtdeploy_checkpoint):
    from transformers import AutoConfig, AutoTokenizer

    llama = trtdeploy_checkpoint("llama_llm")
    tokenizer = AutoTokenizer.from_pretrained(str(llama))
    assert tokenizer.convert_ids_to_tokens(tokenizer("Hi")["input_ids"][0]) == "<|begin_of_text|>"
    assert AutoConfig.from_pretrained(str(llama)).rope_parameters["rope_type"] == "llama3"
    mistral = trtdeploy_checkpoint("mistral_llm")
    tokenizer = AutoTokenizer.from_pretrained(str(mistral))
    assert tokenizer.convert_ids_to_tokens(tokenizer("Hi")["input_ids"])[0] == "<s>"
    assert "<0xE4>" in tokenizer.get_vocab()  # sentencepiece's byte fallback
    assert json.loads((mistral / "config.json").read_text())["sliding_window"] is None  # v0.3


@pytest.mark.parametrize(
    ("kind", "added", "expected"),
    [
        ("llama3", ("<|eom_id|>",), ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"]),  # Llama 3.1
        ("llama3", (), ["<|eot_id|>", "<|end_of_text|>"]),  # Llama 3: <|eom_id|> is a reserved token there
        ("llama", (), []),  # Llama 2: none of them (its EOS </s> ends every answer)
    ],
)
def test_end_tokens_are_those_the_checkpoints_tokenizer_has(tmp_path, kind, added, expected):
    write_tokenizer(tmp_path, kind, added_tokens=added)
    assert get_model("llama_llm").checkpoint_end_tokens(tmp_path) == expected


def greedy_of(folder, prompt, tokens):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return model.config, out[0, len(prompt) :].tolist()


def test_llama31_rope_scaling_is_served_as_transformers_computes_it(trtdeploy_checkpoint, tmp_path):
    """config.json in the form Llama 3.1/3.2 publish it (``rope_scaling`` of type llama3), its original context
    shrunk to 64 positions so that the scaling changes what a short sequence says: the torch engine's greedy tokens
    are transformers'."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtdeploy.engines.torch.runtime import NEVER_STOP, GenerationRequest, load_generator

    scaled, plain = tmp_path / "llama31", tmp_path / "unscaled"
    model = AutoModelForCausalLM.from_pretrained(str(trtdeploy_checkpoint("llama_llm")))
    torch.manual_seed(0)
    with torch.no_grad():  # weights wider than the initializer's, so that greedy choices are not a repeated token
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15)
    model.save_pretrained(str(plain))
    shutil.copytree(plain, scaled)
    config = json.loads((scaled / "config.json").read_text())
    scaling = config.pop("rope_parameters")
    rope_scaling = {**scaling, "type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}
    config.update(rope_theta=rope_scaling.pop("rope_theta"), rope_scaling=rope_scaling)
    (scaled / "config.json").write_text(json.dumps(config))
    with_config(plain, rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"]})
    prompt = torch.randint(3, 400, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    loaded, expected = greedy_of(scaled, prompt, 64)
    assert loaded.rope_parameters["rope_type"] == "llama3" and loaded.rope_parameters["factor"] == 8
    assert greedy_of(plain, prompt, 64)[1] != expected  # the scaling matters here
    generator = load_generator(scaled, max_slots=2, max_input_len=48, max_seq_len=128)
    try:
        sink = RecordingSink()
        generator.submit(GenerationRequest([prompt], 64, end_id=NEVER_STOP), sink)
        assert sink.wait().error is None and sink.tokens == expected
    finally:
        generator.close()


@pytest.fixture(scope="module")
def mistral_v01(trtdeploy_checkpoint, tmp_path_factory):
    """The random Mistral checkpoint with v0.1's 4096-token sliding window."""
    folder = tmp_path_factory.mktemp("mistral") / "v0.1"
    shutil.copytree(trtdeploy_checkpoint("mistral_llm"), folder)
    with_config(folder, sliding_window=4096)
    return folder


@pytest.mark.parametrize(
    ("engine", "target"),
    [("torch", {"gpu": "cpu"}), ("trtllm", {"gpu": "H100", "engine_version": "0.19.0"})],
)
def test_a_sliding_window_shorter_than_the_sequence_is_refused_at_plan_time(mistral_v01, tmp_path, engine, target):
    request = build.BuildRequest(
        model="mistral_llm", engine=engine, model_dir=mistral_v01, output_root=tmp_path, **target
    )
    with pytest.raises(UsageError, match="lower --max-input-len/--max-output-len to sum to at most 4096") as refused:
        build.plan(build.BuildRequest(**{**vars(request), "max_input_len": 4096, "max_output_len": 1024}), dry_run=True)
    assert "last 4096 tokens only (sliding_window in config.json)" in str(refused.value)
    assert "\n" not in str(refused.value)
    # within the window full attention is the same attention: planned
    build.plan(build.BuildRequest(**{**vars(request), "max_input_len": 3072, "max_output_len": 1024}), dry_run=True)
