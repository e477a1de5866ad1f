"""The CosyVoice LLM as a plain Qwen2 causal LM, so that every engine serves it behind the LLM contract.

The official checkpoint keeps the LLM in ``llm.pt``: the Qwen2 weights under ``llm.model.``, a speech-token table
(``speech_embedding``), a head over the speech table's rows (``llm_decoder``) and, in CosyVoice2, a two-row table
of sos and task_id (``llm_embedding``). The conversion appends the speech table's rows to the Qwen2 tokenizer as
``<|s_N|>`` tokens (and the generation's named rows, see :mod:`.generations`), then writes one embedding and one head
over the joint vocabulary, padded to a multiple of 128 rows, as the official runtime's Hugging Face conversions do:

- embedding rows: the text tokens' from Qwen2's table, then the speech table's, then (CosyVoice2) sos and task_id;
- head rows: zero, but the speech table's rows, which are ``llm_decoder``'s.

A standard Qwen2 head has no bias, so the head's bias and the mask that keeps the answer inside the speech table
are one vector the BLS sends with each request as ``embedding_bias`` (``speech_logit_bias.npy``): the decoder's bias
on the speech rows (0 for CosyVoice3, whose head has none), -inf on every other row. The LLM's distribution over
its answer is then the original model's exactly (the official CosyVoice3 conversion leaves the text rows of Qwen2's
head unmasked, so an answer can hold text tokens, which its BLS skips).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trtdeploy import UsageError

from .generations import GENERATIONS, SOS, SPEECH_TOKENS, TASK_ID, Generation

#: The Qwen2 model inside the official checkpoint (its tokenizer and config; the weights are llm.pt's).
BLANK_LLM = "CosyVoice-BlankEN"
LLM_WEIGHTS = "llm.pt"
#: Written next to the converted LLM: the per-request logit bias, and what the BLS needs to know of the vocabulary.
SPEECH_BIAS_FILE = "speech_logit_bias.npy"
LAYOUT_FILE = "cosyvoice_llm.json"
PAD_ROWS_TO = 128
#: The official conversions' chat template: a user turn is a prompt's text between sos and task_id, an assistant
#: turn its speech tokens as they are (``<|s_12|><|s_7|>...``).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}<|sos|>{{ message['content'] }}<|task_id|>"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] }}{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class SpeechLayout:
    """Where the speech tokens sit in the converted LLM's vocabulary."""

    generation: str
    #: Tokens of the text tokenizer (the Qwen2 one with the generation's specials): the first speech token's id.
    speech_offset: int
    speech_rows: int
    sos_id: int
    task_id: int
    #: The end token, then every other token that ends an answer.
    stop_ids: tuple[int, ...]
    vocab_size: int
    padded_vocab_size: int

    @classmethod
    def for_generation(cls, generation: Generation, speech_offset: int) -> SpeechLayout:
        """The layout of ``generation``'s speech tokens appended to a text tokenizer of ``speech_offset`` tokens."""
        rows = generation.speech_rows
        vocab_size = speech_offset + rows + (2 if generation.sos_row is None else 0)
        return cls(
            generation=generation.name,
            speech_offset=speech_offset,
            speech_rows=rows,
            sos_id=speech_offset + (rows if generation.sos_row is None else generation.sos_row),
            task_id=speech_offset + (rows + 1 if generation.task_row is None else generation.task_row),
            stop_ids=tuple(speech_offset + row for row in generation.stop_rows),
            vocab_size=vocab_size,
            padded_vocab_size=-(-vocab_size // PAD_ROWS_TO) * PAD_ROWS_TO,
        )

    @classmethod
    def load(cls, llm_dir: Path) -> SpeechLayout:
        values = json.loads((llm_dir / LAYOUT_FILE).read_text())
        values["stop_ids"] = tuple(values["stop_ids"])
        return cls(**values)

    def speech_token(self, token_id: int) -> int | None:
        """The speech token (0 to 6,560) an output id stands for, or None for any other id."""
        row = token_id - self.speech_offset
        return row if 0 <= row < SPEECH_TOKENS else None


def checkpoint_generation(checkpoint_dir: Path) -> Generation:
    """The generation of an official checkpoint, told by its yaml (``cosyvoice2.yaml`` or ``cosyvoice3.yaml``)."""
    found = [GENERATIONS[name] for name in GENERATIONS if (checkpoint_dir / f"{name}.yaml").is_file()]
    if len(found) != 1:
        raise UsageError(
            f"{checkpoint_dir} is not a CosyVoice checkpoint: it holds "
            + ("both cosyvoice2.yaml and cosyvoice3.yaml" if found else "neither cosyvoice2.yaml nor cosyvoice3.yaml"),
            hint="pass the folder downloaded from FunAudioLLM/CosyVoice2-0.5B or FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        )
    return found[0]


def convert_llm(checkpoint_dir: Path, dest: Path) -> SpeechLayout:
    """Write the checkpoint's LLM into the empty folder ``dest`` as a Qwen2 causal LM (config, safetensors,
    tokenizer, generation config) with ``speech_logit_bias.npy`` and ``cosyvoice_llm.json`` beside it."""
    import numpy as np
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    generation = checkpoint_generation(checkpoint_dir)
    blank = checkpoint_dir / BLANK_LLM
    needed = (LLM_WEIGHTS, f"{BLANK_LLM}/config.json", f"{BLANK_LLM}/tokenizer_config.json")
    missing = [name for name in needed if not (checkpoint_dir / name).is_file()]
    if missing:
        raise UsageError(
            f"{checkpoint_dir} is not a whole CosyVoice checkpoint (missing {', '.join(missing)})",
            hint="download the whole official checkpoint",
        )
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest} is not empty: the converted LLM is written into an empty folder")
    state = _llm_state(checkpoint_dir / LLM_WEIGHTS, generation)
    tokenizer = AutoTokenizer.from_pretrained(str(blank), local_files_only=True)
    tokenizer.add_special_tokens(
        {
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": [*generation.text_specials],
        }
    )
    layout = SpeechLayout.for_generation(generation, len(tokenizer))
    offset, rows, padded = layout.speech_offset, layout.speech_rows, layout.padded_vocab_size
    names = generation.token_names() + ([SOS, TASK_ID] if generation.sos_row is None else [])
    if tokenizer.add_tokens(names) != len(names) or len(tokenizer) != layout.vocab_size:
        raise UsageError(
            f"{blank}'s tokenizer already holds speech tokens (<|s_0|> ...)", hint="is CosyVoice-BlankEN the original?"
        )
    tokenizer.chat_template = CHAT_TEMPLATE

    weights = {key.removeprefix("llm.model."): value for key, value in state.items() if key.startswith("llm.model.")}
    text_embedding = weights["model.embed_tokens.weight"]
    if text_embedding.shape[0] < offset:
        raise UsageError(
            f"{LLM_WEIGHTS}'s text embedding has {text_embedding.shape[0]} rows, fewer than the {offset} tokens of "
            f"{generation.name}'s tokenizer",
            hint=f"is {BLANK_LLM} this checkpoint's?",
        )
    hidden, dtype = text_embedding.shape[1], text_embedding.dtype
    embedding = torch.zeros(padded, hidden, dtype=dtype)
    embedding[:offset] = text_embedding[:offset]
    embedding[offset : offset + rows] = state["speech_embedding.weight"]
    if generation.sos_row is None:  # CosyVoice2: sos and task_id follow the speech rows
        embedding[offset + rows : offset + rows + 2] = state["llm_embedding.weight"]
    head = torch.zeros(padded, hidden, dtype=dtype)
    head[offset : offset + rows] = state["llm_decoder.weight"]
    bias = np.full(padded, -np.inf, dtype=np.float32)
    decoder_bias = state.get("llm_decoder.bias")
    bias[offset : offset + rows] = 0.0 if decoder_bias is None else decoder_bias.float().numpy()
    weights["model.embed_tokens.weight"] = embedding
    weights["lm_head.weight"] = head

    dest.mkdir(parents=True, exist_ok=True)
    save_file({key: value.contiguous() for key, value in weights.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    config = json.loads((blank / "config.json").read_text())
    config.update(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=padded,
        tie_word_embeddings=False,
        eos_token_id=layout.stop_ids[0],
        pad_token_id=layout.stop_ids[0],
        bos_token_id=None,
        torch_dtype=str(dtype).removeprefix("torch."),
    )
    config.pop("dtype", None)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation_config = {"eos_token_id": list(layout.stop_ids), "pad_token_id": layout.stop_ids[0]}
    (dest / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    tokenizer.save_pretrained(str(dest))
    np.save(dest / SPEECH_BIAS_FILE, bias)
    (dest / LAYOUT_FILE).write_text(json.dumps(asdict(layout), indent=2) + "\n")
    return layout


def _llm_state(path: Path, generation: Generation) -> dict:
    """llm.pt's tensors, refused with the missing keys named when it is not this generation's LLM."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: pickle, zip and torch errors alike
        raise UsageError(f"cannot read {path} ({exc})", hint="download it again") from None
    needed = ["speech_embedding.weight", "llm_decoder.weight", "llm.model.model.embed_tokens.weight"]
    if generation.sos_row is None:  # CosyVoice2: sos/task_id table, head bias
        needed += ["llm_embedding.weight", "llm_decoder.bias"]
    missing = [key for key in needed if key not in state]
    if missing:
        raise UsageError(
            f"{path} is not a {generation.name} LLM (missing {', '.join(missing)})",
            hint="does the checkpoint's yaml name the right generation? download the checkpoint again",
        )
    rows = state["speech_embedding.weight"].shape[0]
    if rows != generation.speech_rows or state["llm_decoder.weight"].shape[0] != rows:
        raise UsageError(
            f"{path} has {rows} speech-table rows where {generation.name} has {generation.speech_rows}: does the yaml "
            "name the right generation?"
        )
    return state
