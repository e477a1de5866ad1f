"""Random-weight CosyVoice checkpoints in the official layout, for tests and benchmarks.

So far the LLM's part of the layout: ``cosyvoice{2,3}.yaml`` (its top-level sizes), ``llm.pt`` (the Qwen2 weights
under ``llm.model.`` with the generation's speech table, head and, for CosyVoice2, sos/task_id table) and
``CosyVoice-BlankEN/`` (a Qwen2 config, tokenizer and weights of its own, as published).
"""

from __future__ import annotations

from pathlib import Path

from trtdeploy.checkpoints import TinyShape, write_random_causal_lm

from .convert import BLANK_LLM, LLM_WEIGHTS
from .generations import GENERATIONS, SPEECH_TOKENS, GenerationName

#: Room for the tiny tokenizer (400 tokens) and CosyVoice3's 278 added specials.
TINY_LLM = TinyShape(vocab_size=768)


def write_random_checkpoint(dest: Path, generation: GenerationName, *, seed: int = 0) -> None:
    import torch
    import transformers

    spec = GENERATIONS[generation]
    blank = dest / BLANK_LLM
    write_random_causal_lm(blank, shape=TINY_LLM, seed=seed, max_position_embeddings=32768)
    config = transformers.AutoConfig.from_pretrained(str(blank), local_files_only=True)
    torch.manual_seed(seed + 1)  # llm.pt holds the trained LLM, not BlankEN's weights
    qwen = transformers.Qwen2ForCausalLM(config)
    hidden = config.hidden_size
    state = {f"llm.model.{key}": value.detach().clone() for key, value in qwen.state_dict().items()}
    state["speech_embedding.weight"] = torch.randn(spec.speech_rows, hidden) * 0.5
    decoder = torch.nn.Linear(hidden, spec.speech_rows, bias=spec.sos_row is None)
    state.update({f"llm_decoder.{key}": value.detach().clone() for key, value in decoder.state_dict().items()})
    if spec.sos_row is None:
        state["llm_embedding.weight"] = torch.randn(2, hidden) * 0.5
    torch.save(state, dest / LLM_WEIGHTS)
    (dest / f"{generation}.yaml").write_text(
        f"sample_rate: 24000\nllm_input_size: {hidden}\nllm_output_size: {hidden}\nspk_embed_dim: 192\n"
        f"speech_token_size: {SPEECH_TOKENS}\ntoken_frame_rate: 25\ntoken_mel_ratio: 2\n"
    )
