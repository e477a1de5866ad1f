"""Random-weight CosyVoice checkpoints in the official layout, for tests and benchmarks.

So far: ``cosyvoice{2,3}.yaml`` (its top-level sizes), ``llm.pt`` (the Qwen2 weights under ``llm.model.`` with
the generation's speech table, head and, for CosyVoice2, sos/task_id table), ``CosyVoice-BlankEN/`` (a Qwen2
config, tokenizer and weights of its own, as published) and ``campplus.onnx`` (a small speaker encoder with CAM++'s
interface: fbank frames ``[1, T, 80]`` in, statistics pooled over time, a 192-d embedding out).
"""

from __future__ import annotations

from pathlib import Path

from trtdeploy.checkpoints import TinyShape, write_random_causal_lm

from .convert import BLANK_LLM, LLM_WEIGHTS
from .generations import GENERATIONS, SPEECH_TOKENS, GenerationName
from .speaker import CAMPPLUS, EMBEDDING_DIM, MEL_BINS

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
        f"sample_rate: 24000\nllm_input_size: {hidden}\nllm_output_size: {hidden}\nspk_embed_dim: {EMBEDDING_DIM}\n"
        f"speech_token_size: {SPEECH_TOKENS}\ntoken_frame_rate: 25\ntoken_mel_ratio: 2\n"
    )
    _write_speaker_encoder(dest / CAMPPLUS, seed)


def _write_speaker_encoder(path: Path, seed: int) -> None:
    """A convolution over the fbank frames, mean and standard deviation over time, a projection to 192."""
    import torch

    class SpeakerEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(MEL_BINS, 32, kernel_size=3, padding=1)
            self.project = torch.nn.Linear(64, EMBEDDING_DIM)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            hidden = torch.relu(self.conv(features.transpose(1, 2)))
            return self.project(torch.cat([hidden.mean(-1), hidden.std(-1)], -1))

    torch.manual_seed(seed + 2)
    torch.onnx.export(
        SpeakerEncoder().eval(), (torch.randn(1, 50, MEL_BINS),), str(path), input_names=["input"],
        output_names=["output"], dynamic_axes={"input": {1: "frames"}}, dynamo=False,
    )  # fmt: skip
