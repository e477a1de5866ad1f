"""The torch engine's runtime: a continuous-batching generator over a Hugging Face causal LM's weights, or over
Whisper's (an encoder-decoder: :mod:`.whisper`).

:func:`load_generator` builds one from a checkpoint folder; the Triton model (``tensorrt_llm/1/model.py``) feeds it
requests and turns what its sinks receive into responses. Tests and benchmarks use it directly, without Triton.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ....backend_utils import ModelParameters
from ...contract import (
    NEVER_STOP,
    GenerationRequest,
    ResponseSink,
    SamplingParams,
    SequenceOutput,
    response_arrays,
    special_tokens,
)
from .. import unsupported_reason
from .generator import Generator, GeneratorConfig
from .kernels import uniform_noise
from .model import DecoderModel, SlotModel
from .sampling import SamplingPlan, SlotSampler
from .whisper import WhisperModel

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: The forward pass of each architecture that is not a plain causal LM (those run :class:`DecoderModel`).
MODEL_CLASSES: dict[str, type[SlotModel]] = {"WhisperForConditionalGeneration": WhisperModel}

__all__ = [
    "DTYPES",
    "NEVER_STOP",
    "DecoderModel",
    "GenerationRequest",
    "Generator",
    "GeneratorConfig",
    "MODEL_CLASSES",
    "ResponseSink",
    "SamplingParams",
    "SamplingPlan",
    "SequenceOutput",
    "SlotModel",
    "SlotSampler",
    "WhisperModel",
    "load_generator",
    "load_from_parameters",
    "response_arrays",
    "special_tokens",
    "uniform_noise",
]


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
    overlap_admission: bool | None = None,
    cancel_check_period: float = 0.1,
) -> Generator:
    """Load a checkpoint folder and start a generator over it (raises ValueError for a checkpoint it cannot serve).
    ``overlap_admission``: None keeps the model's own (:attr:`~.model.SlotModel.overlap_admission`)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    reason = unsupported_reason(config, max_seq_len)
    if reason:
        raise ValueError(f"cannot serve {model_dir}: {reason}")
    if precision not in DTYPES:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(DTYPES)}")
    model_class = MODEL_CLASSES.get(config["architectures"][0], DecoderModel)
    model = model_class.from_pretrained(
        str(model_dir),
        dtype=DTYPES[precision],
        device=device,
        max_slots=max_slots,
        max_seq_len=max_seq_len,
        cuda_graphs=cuda_graphs,
        overlap_admission=overlap_admission,
    )
    end_ids, _ = special_tokens(model_dir)
    limits = GeneratorConfig(
        max_input_len=min(max_input_len, max_seq_len - 1),
        max_num_tokens=max_num_tokens,
        end_ids=end_ids,
        cancel_check_period=cancel_check_period,
    )
    return Generator(model, limits)


def load_from_parameters(params: ModelParameters) -> Generator:
    """:func:`load_generator` with the settings of the Triton model's config.pbtxt (the engine's template)."""
    return load_generator(
        params.str("hf_model_dir"),
        precision=params.str("precision", "fp32"),
        device=params.str("device", "cpu"),
        max_slots=params.int("max_slots"),
        max_input_len=params.int("max_input_len"),
        max_seq_len=params.int("max_seq_len"),
        max_num_tokens=params.int("max_num_tokens", 8192),
        cuda_graphs=params.bool("cuda_graphs", True),
        overlap_admission=params.bool("overlap_admission") if "overlap_admission" in params.raw else None,
        cancel_check_period=params.int("cancellation_check_period_ms", 100) / 1000,
    )
