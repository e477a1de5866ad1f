"""The torch engine's runtime: a continuous-batching generator over a Hugging Face causal LM's weights.

:func:`load_generator` builds one from a checkpoint folder; the Triton model (``tensorrt_llm/1/model.py``) feeds it
requests and turns what its sinks receive into responses. Tests and benchmarks use it directly, without Triton.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import unsupported_reason
from .generator import (
    NEVER_STOP,
    GenerationRequest,
    Generator,
    GeneratorConfig,
    ResponseSink,
    output_arrays,
)
from .model import DecoderModel
from .sampling import SamplingParams, SamplingPlan, SlotSampler, uniform_noise

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

__all__ = [
    "DTYPES",
    "NEVER_STOP",
    "DecoderModel",
    "GenerationRequest",
    "Generator",
    "GeneratorConfig",
    "ResponseSink",
    "SamplingParams",
    "SamplingPlan",
    "SlotSampler",
    "load_generator",
    "output_arrays",
    "special_tokens",
    "uniform_noise",
]


def special_tokens(model_dir: str | Path) -> tuple[frozenset[int], int]:
    """The checkpoint's end-of-sequence ids and its pad id, from ``generation_config.json`` and ``config.json``."""
    folder = Path(model_dir)
    sources = [
        json.loads(path.read_text())
        for name in ("generation_config.json", "config.json")
        if (path := folder / name).is_file()
    ]

    def first(key: str) -> int | list[int] | None:
        return next((source[key] for source in sources if source.get(key) is not None), None)

    eos = first("eos_token_id")
    end_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
    pad = first("pad_token_id")
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    if pad is None:
        pad = min(end_ids) if end_ids else 0
    return end_ids, pad


def load_generator(
    model_dir: str | Path,
    *,
    precision: str = "fp32",
    device: str = "cpu",
    max_slots: int = 8,
    max_input_len: int = 2048,
    max_seq_len: int = 4096,
    max_num_tokens: int = 8192,
    cuda_graphs: bool = True,
    cancel_check_period: float = 0.1,
) -> Generator:
    """Load a checkpoint folder and start a generator over it (raises ValueError for a checkpoint it cannot serve)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    reason = unsupported_reason(config, max_seq_len)
    if reason:
        raise ValueError(f"cannot serve {model_dir}: {reason}")
    if precision not in DTYPES:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(DTYPES)}")
    model = DecoderModel.from_pretrained(
        str(model_dir),
        dtype=DTYPES[precision],
        device=device,
        max_slots=max_slots,
        max_seq_len=max_seq_len,
        cuda_graphs=cuda_graphs,
    )
    end_ids, pad_id = special_tokens(model_dir)
    limits = GeneratorConfig(
        max_input_len=min(max_input_len, max_seq_len - 1),
        max_num_tokens=max_num_tokens,
        end_ids=end_ids,
        cancel_check_period=cancel_check_period,
        pad_id=pad_id,
    )
    return Generator(model, limits)
