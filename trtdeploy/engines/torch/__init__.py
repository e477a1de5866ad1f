"""The ``torch`` engine: trtdeploy's own Triton python model around a Hugging Face causal LM (or Whisper), on the CPU
or one GPU.

It serves the TRT-LLM inflight-batcher tensor contract (docs/writing-plugins.md, "The LLM contract", and
:mod:`trtdeploy.engines.contract`) from a continuous batch run by :mod:`trtdeploy.engines.torch.runtime`, with
TensorRT-LLM's semantics for every input the official ensemble passes on: sampling, penalties, stop and bad words,
minimum length, several return sequences, the prompt in the output, log probabilities and logits, embedding bias.
It decodes one beam and keeps no perf metrics: ``beam_width`` > 1, a ``len_penalty`` and ``return_perf_metrics`` are
refused by name. A Whisper checkpoint is served with TensorRT-LLM's encoder-decoder inputs (log-mel features and
the decoder prompt, :func:`~trtdeploy.engines.contract.encoder_decoder_inputs`); its sequences are bounded by the
decoder's learned positions (``max_target_positions``). There is no build step: the deployment serves the checkpoint
as it is. torch and transformers are
imported only when a model is served, so the CLI starts without them.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...hookspecs import hookimpl
from ...spec import BuildContext
from ..base import PYTHON_TEMPLATES, Engine, sliding_window_problem
from ..contract import INPUTS, OUTPUTS, encoder_decoder_inputs

#: Hugging Face encoder-decoder architectures whose layers the runtime's own forward pass reproduces.
ENCODER_DECODER_ARCHITECTURES = ("WhisperForConditionalGeneration",)
#: Every Hugging Face architecture whose layers the runtime's own forward pass reproduces.
SUPPORTED_ARCHITECTURES = (
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",  # Llama's layers; its sliding window is refused where it would matter
    *ENCODER_DECODER_ARCHITECTURES,
)
#: transformers' default ``max_target_positions`` of a Whisper config.
WHISPER_TARGET_POSITIONS = 448


@dataclass(frozen=True)
class TorchOptions:
    """The torch engine's ``-o`` settings (``build -o cuda_graphs=false``); None: the default."""

    #: Replay decode steps, padded prefills, sampling and Whisper's encoder as CUDA graphs (default: on a GPU).
    cuda_graphs: bool | None = None
    #: Run admission (prefill, Whisper's encoder) on a stream of its own beside the decode steps instead of between
    #: them: shorter stalls of the running streams when a long prompt enters, slower steps meanwhile (default: on
    #: for Whisper, off for decoder LMs; needs CUDA graphs).
    overlap_admission: bool | None = None


def unsupported_reason(config: dict[str, Any], max_seq_len: int) -> str | None:
    """Why the runtime cannot serve a checkpoint with this ``config.json`` content, or None when it can."""
    architectures = config.get("architectures") or []
    if not architectures or architectures[0] not in SUPPORTED_ARCHITECTURES:
        found = ", ".join(architectures) or "none given"
        return f"architecture {found} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
    if architectures[0] in ENCODER_DECODER_ARCHITECTURES:
        limit = config.get("max_target_positions", WHISPER_TARGET_POSITIONS)
        if max_seq_len > limit:
            return (
                f"max_seq_len {max_seq_len} exceeds the decoder's {limit} positions (max_target_positions): lower "
                f"--max-input-len/--max-output-len to sum to at most {limit}"
            )
        if config.get("scale_embedding"):  # no released checkpoint scales them; the runtime's decoder does not
            return "scale_embedding (decoder embeddings scaled by sqrt(d_model)) is not supported"
        return None
    return sliding_window_problem(config, max_seq_len, "torch")


class TorchEngine(Engine):
    """Serves a Hugging Face Qwen2/Qwen3/Llama/Mistral or Whisper checkpoint with trtdeploy's own decode loop (CUDA
    graphs on GPU)."""

    name = "torch"
    description = "trtdeploy's own PyTorch continuous-batching model (Qwen2/Qwen3/Llama/Mistral, Whisper), CPU or GPU"
    precisions = ("fp32", "fp16", "bf16")
    templates_dir = PYTHON_TEMPLATES
    runs_on_cpu = True
    noise_keyed_by_position = True  # a counter-based hash of (seed, position, token): see runtime/sampling.py
    Options = TorchOptions

    def unavailable_reason(self) -> str | None:
        missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
        if missing:
            return f"{' and '.join(missing)} not installed (pip install 'trtdeploy[torch]')"
        return None

    def default_precision(self, device: str) -> str:
        return "bf16" if device == "cuda" else "fp32"

    def validate(self, ctx: BuildContext) -> None:
        point = ctx.point
        if point.world_size > 1:
            raise UsageError("torch engine serves one GPU; use --engine trtllm for TP/PP")
        given = dict(point.engine_options)
        if point.device == "cpu" and (given.get("cuda_graphs") or given.get("overlap_admission")):
            raise UsageError(
                "-o cuda_graphs and overlap_admission work on a GPU only, and this build is for the CPU",
                hint="leave them out, or build for a GPU (--gpu)",
            )
        if given.get("overlap_admission") and given.get("cuda_graphs") is False:
            raise UsageError(
                "-o overlap_admission=true needs CUDA graphs, which -o cuda_graphs=false turns off",
                hint="leave one of them out",
            )
        config_path = Path(ctx.llm_dir) / "config.json"
        if not config_path.is_file():  # not downloaded yet: the runtime checks again when it loads the model
            return
        try:
            config = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{config_path} is unreadable ({exc})") from None
        reason = unsupported_reason(config, point.max_seq_len)
        if reason:
            raise UsageError(f"torch engine cannot serve {ctx.llm_dir}: {reason}")
        architecture = config["architectures"][0]
        if (architecture in ENCODER_DECODER_ARCHITECTURES) != ctx.encoder_decoder:
            expected = "an encoder-decoder" if ctx.encoder_decoder else "a decoder-only"
            raise UsageError(
                f"torch engine cannot serve {ctx.llm_dir}: this model needs {expected} checkpoint, and it holds a "
                f"{architecture}"
            )

    def encoder_features_dtype(self, ctx: BuildContext) -> str:
        """fp32 features for an fp32 model, else fp16 (the runtime casts them to its own precision)."""
        return "TYPE_FP32" if ctx.point.precision == "fp32" else "TYPE_FP16"

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        point = ctx.point
        given = dict(point.engine_options)
        parameters = {
            "generator_factory": "trtdeploy.engines.torch.runtime:load_from_parameters",
            "hf_model_dir": ctx.llm_dir,
            "precision": point.precision,
            "device": point.device,
            "max_slots": point.max_batch_size,
            "max_input_len": ctx.llm_max_input_len,
            "max_seq_len": point.max_seq_len,
            "max_num_tokens": max(point.max_num_tokens, ctx.llm_max_input_len),
            "exclude_input_in_output": "true",
            "cuda_graphs": str(given.get("cuda_graphs", point.device == "cuda")).lower(),
            "cancellation_check_period_ms": 100,
            "encoder_decoder": str(ctx.encoder_decoder).lower(),
        }
        if "overlap_admission" in given:
            parameters["overlap_admission"] = str(given["overlap_admission"]).lower()
        gpus = [group[0] for group in point.gpu_groups] if point.replicas > 1 else []
        inputs = encoder_decoder_inputs(ctx.encoder_features_dtype) if ctx.encoder_decoder else INPUTS
        return {"parameters": parameters, "inputs": inputs, "outputs": OUTPUTS, "gpus": gpus}

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        found: dict[str, str] = {}
        for package in ("torch", "transformers"):
            try:
                found[package] = version(package)
            except PackageNotFoundError:
                continue
        return found


@hookimpl
def register_engines(register) -> None:
    """Register the built-in ``torch`` engine."""
    register(TorchEngine())
