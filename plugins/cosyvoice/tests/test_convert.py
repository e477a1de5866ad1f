"""The CosyVoice LLM converted to a Qwen2 causal LM: the ids the official runtime uses, the original model's logits,
and the torch engine generating what the original layout generates."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from trtdeploy_cosyvoice.checkpoint import write_random_llm
from trtdeploy_cosyvoice.convert import (
    BLANK_LLM,
    LLM_WEIGHTS,
    SPEECH_BIAS_FILE,
    SpeechLayout,
    checkpoint_generation,
    convert_llm,
)
from trtdeploy_cosyvoice.generations import GENERATIONS, SPEECH_TOKENS

from trtdeploy import UsageError
from trtdeploy.engines.contract import GenerationRequest, SamplingParams
from trtdeploy.engines.torch.runtime import load_generator
from trtdeploy.testing import RecordingSink

#: Tokens of the Qwen2 tokenizer CosyVoice-BlankEN ships (151,643 byte-level BPE tokens, then <|endoftext|>,
#: <|im_start|> and <|im_end|>).
QWEN2_TOKENIZER = 151646
#: Ids the official runtime's conversions and BLS models use: first speech token, sos, task_id, end token.
OFFICIAL_IDS = {"cosyvoice2": (151663, 158227, 158228, 158224), "cosyvoice3": (151924, 158485, 158487, 158486)}
PADDED_VOCAB = {"cosyvoice2": 158336, "cosyvoice3": 158720}
#: Rows of the speech table that end an answer upstream: CosyVoice2's three end tokens, every row of CosyVoice3's after
#: its speech tokens.
UPSTREAM_STOP_ROWS = {"cosyvoice2": range(6561, 6564), "cosyvoice3": range(6561, 6761)}


@pytest.fixture(scope="module", params=["cosyvoice2", "cosyvoice3"])
def converted(request, tmp_path_factory, cosyvoice_checkpoint):
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = cosyvoice_checkpoint(request.param)
    layout = convert_llm(checkpoint, root / "llm")
    return checkpoint, root / "llm", layout


@pytest.mark.parametrize("name", ["cosyvoice2", "cosyvoice3"])
def test_the_layout_of_qwen2s_tokenizer_holds_the_official_runtimes_ids(name):
    """The layout computed for CosyVoice-BlankEN's real tokenizer (its size and the generation's new specials)."""
    generation = GENERATIONS[name]
    added = [token for token in generation.text_specials if token not in ("<|im_start|>", "<|im_end|>")]
    layout = SpeechLayout.for_generation(generation, QWEN2_TOKENIZER + len(added))
    offset = layout.speech_offset
    assert (offset, layout.sos_id, layout.task_id, layout.stop_ids[0]) == OFFICIAL_IDS[name]
    assert layout.padded_vocab_size == PADDED_VOCAB[name]
    assert set(layout.stop_ids) == {offset + row for row in UPSTREAM_STOP_ROWS[name]}
    names = generation.token_names()
    assert names[:2] == ["<|s_0|>", "<|s_1|>"] and names[generation.end_row] == "<|eos1|>"
    assert len(names) == layout.vocab_size - offset - (2 if name == "cosyvoice2" else 0)


def test_the_tokenizer_names_every_speech_row(converted):
    _, llm, layout = converted
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(llm))
    assert len(tokenizer) == layout.vocab_size
    ids = tokenizer.convert_tokens_to_ids(["<|s_0|>", "<|s_6560|>", "<|sos|>", "<|task_id|>", "<|eos1|>"])
    assert ids == [layout.speech_offset, layout.speech_offset + 6560, layout.sos_id, layout.task_id, layout.stop_ids[0]]
    assert tokenizer.convert_tokens_to_ids("<|endofprompt|>") < layout.speech_offset
    text = "<|sos|>hello<|task_id|><|s_12|><|s_7|>"
    encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert encoded[0] == layout.sos_id and encoded[-3:] == [
        layout.task_id,
        layout.speech_offset + 12,
        layout.speech_offset + 7,
    ]
    assert SpeechLayout.load(llm) == layout
    config = json.loads((llm / "config.json").read_text())
    assert config["vocab_size"] == layout.padded_vocab_size and not config["tie_word_embeddings"]


def _original_logits(checkpoint, text_ids, prompt_speech):
    """The original model's logits over its speech table after ``[sos] text [task_id] prompt-speech``, from llm.pt
    laid out as the official code reads it."""
    generation = checkpoint_generation(checkpoint)
    state = torch.load(checkpoint / LLM_WEIGHTS, weights_only=True)
    config = transformers.AutoConfig.from_pretrained(str(checkpoint / BLANK_LLM))
    qwen = transformers.Qwen2ForCausalLM(config).eval()
    qwen.load_state_dict({k.removeprefix("llm.model."): v for k, v in state.items() if k.startswith("llm.model.")})
    speech = state["speech_embedding.weight"]
    if generation.name == "cosyvoice2":
        sos, task = state["llm_embedding.weight"]
    else:  # CosyVoice3LM's sos and task_id rows
        sos, task = speech[6561], speech[6563]
    text = qwen.model.embed_tokens(torch.tensor(text_ids))
    embeds = torch.cat([sos[None], text, task[None], speech[torch.tensor(prompt_speech, dtype=torch.long)]])
    with torch.no_grad():
        hidden = qwen.model(inputs_embeds=embeds[None]).last_hidden_state[0]
        logits = hidden @ state["llm_decoder.weight"].T
        if "llm_decoder.bias" in state:
            logits = logits + state["llm_decoder.bias"]
    return logits


def test_the_converted_llm_gives_the_original_models_logits(converted):
    checkpoint, llm, layout = converted
    text_ids, prompt_speech = [5, 17, 230, 99, layout.speech_offset - 1], [3, 6560, 0, 1234]
    expected = _original_logits(checkpoint, text_ids, prompt_speech)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(llm)).eval()
    ids = [layout.sos_id, *text_ids, layout.task_id, *(layout.speech_offset + token for token in prompt_speech)]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0] + torch.from_numpy(np.load(llm / SPEECH_BIAS_FILE))
    speech = slice(layout.speech_offset, layout.speech_offset + layout.speech_rows)
    torch.testing.assert_close(logits[:, speech], expected, rtol=1e-5, atol=1e-5)
    outside = torch.ones(logits.shape[1], dtype=torch.bool)
    outside[speech] = False
    assert torch.isneginf(logits[:, outside]).all()


def test_the_torch_engine_generates_the_original_models_greedy_tokens(converted):
    checkpoint, llm, layout = converted
    text_ids, prompt_speech = [11, 42, 7], [100, 200]
    expected = []
    for _ in range(6):
        logits = _original_logits(checkpoint, text_ids, prompt_speech + expected)
        expected.append(int(logits[-1].argmax()))
    generator = load_generator(llm, max_slots=2, max_seq_len=64)
    try:
        sink = RecordingSink()
        prompt = [layout.sos_id, *text_ids, layout.task_id, *(layout.speech_offset + token for token in prompt_speech)]
        generator.submit(
            GenerationRequest(
                input_ids=[prompt], max_new_tokens=6, end_id=layout.stop_ids[0], sampling=SamplingParams(top_k=1),
                embedding_bias=np.load(llm / SPEECH_BIAS_FILE),
            ),
            sink,
        )  # fmt: skip
        assert sink.wait().error is None
    finally:
        generator.close()
    assert all(token < SPEECH_TOKENS for token in expected)  # speech all the way (the seeded weights' answer)
    assert [layout.speech_token(token) for token in sink.outputs[0]] == expected


def test_a_folder_that_is_not_a_cosyvoice_checkpoint_is_refused(tmp_path):
    with pytest.raises(UsageError, match="neither cosyvoice2.yaml nor cosyvoice3.yaml"):
        convert_llm(tmp_path, tmp_path / "out")
    (tmp_path / "cosyvoice2.yaml").write_text("{}\n")
    with pytest.raises(
        UsageError, match=r"not a whole CosyVoice checkpoint \(missing llm.pt, CosyVoice-BlankEN/config"
    ):
        convert_llm(tmp_path, tmp_path / "out")
    (tmp_path / "cosyvoice3.yaml").write_text("{}\n")
    with pytest.raises(UsageError, match="both cosyvoice2.yaml and cosyvoice3.yaml"):
        checkpoint_generation(tmp_path)


def test_an_llm_of_the_other_generation_is_refused(converted, tmp_path):
    checkpoint, _, layout = converted
    other = {"cosyvoice2": "cosyvoice3", "cosyvoice3": "cosyvoice2"}[layout.generation]
    (tmp_path / f"{other}.yaml").write_text("{}\n")
    (tmp_path / LLM_WEIGHTS).symlink_to(checkpoint / LLM_WEIGHTS)
    (tmp_path / BLANK_LLM).symlink_to(checkpoint / BLANK_LLM)
    with pytest.raises(UsageError, match=f"is not a {other} LLM|speech-table rows where {other} has"):
        convert_llm(tmp_path, tmp_path / "out")
    (tmp_path / LLM_WEIGHTS).unlink()
    (tmp_path / LLM_WEIGHTS).write_bytes(b"not a checkpoint")
    with pytest.raises(UsageError, match="cannot read"):
        convert_llm(tmp_path, tmp_path / "out")


def test_every_stop_token_ends_the_answer_on_the_torch_engine(converted):
    """With the checkpoint's end tokens (generation_config.json), any stop row ends the answer, as upstream."""
    _, llm, layout = converted
    bias = np.load(llm / SPEECH_BIAS_FILE)
    prompt = [layout.sos_id, 11, 42, layout.task_id]
    generator = load_generator(llm, max_slots=2, max_seq_len=64)
    try:
        for stop in (*layout.stop_ids[:3], layout.stop_ids[-1]):
            forced = bias.copy()
            forced[stop] = 1e4  # the first token sampled is this stop token
            sink = RecordingSink()
            generator.submit(
                GenerationRequest(input_ids=[prompt], max_new_tokens=4, sampling=SamplingParams(top_k=1),
                                  embedding_bias=forced),
                sink,
            )  # fmt: skip
            assert sink.wait().error is None
            assert sink.outputs[0] == [], layout.stop_ids.index(stop)
    finally:
        generator.close()


def test_the_chat_template_wraps_a_prompt_as_the_official_conversions_do(converted):
    _, llm, _ = converted
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(llm))
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "<|s_3|><|s_9|>"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<|sos|>hello<|task_id|><|s_3|><|s_9|>"


def test_an_incomplete_checkpoint_or_a_used_folder_is_refused(converted, tmp_path):
    checkpoint, _, layout = converted
    (tmp_path / f"{layout.generation}.yaml").write_text("{}\n")
    (tmp_path / LLM_WEIGHTS).symlink_to(checkpoint / LLM_WEIGHTS)
    with pytest.raises(
        UsageError, match=r"\(missing CosyVoice-BlankEN/config.json, CosyVoice-BlankEN/tokenizer_config"
    ):
        convert_llm(tmp_path, tmp_path / "out")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="is not empty"):
        convert_llm(checkpoint, tmp_path / "out")


def test_a_cosyvoice2_llm_without_its_heads_bias_is_refused(tmp_path):
    write_random_llm(tmp_path, "cosyvoice2")
    state = torch.load(tmp_path / LLM_WEIGHTS, weights_only=True)
    del state["llm_decoder.bias"]
    torch.save(state, tmp_path / LLM_WEIGHTS)
    with pytest.raises(UsageError, match=r"is not a cosyvoice2 LLM \(missing llm_decoder.bias\)"):
        convert_llm(tmp_path, tmp_path / "out")
