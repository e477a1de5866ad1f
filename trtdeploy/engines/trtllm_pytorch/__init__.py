"""The ``trtllm_pytorch`` engine: TensorRT-LLM 1.x's PyTorch backend behind the LLM contract, with no build step.

The deployment's ``tensorrt_llm`` model is trtdeploy's python model around ``tensorrt_llm.LLM`` (see
:mod:`.llmapi`): prompt token ids in, streamed token ids out. Build-time knobs of the engine flow become ``LLM()``
arguments (batch, lengths, tokens per step, TP/PP, KV-cache pool); quantized weights come from a checkpoint
exported by NVIDIA ModelOpt (``hf_quant_config.json`` or a ``quantization_config`` of method ``modelopt``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...hookspecs import hookimpl
from ...memory import read_config
from ...spec import BuildContext
from ..base import PYTHON_TEMPLATES
from ..contract import INPUTS, OUTPUTS
from ..trtllm.versions import TensorRTLLMEngine, TrtllmVersion, installed

OLDEST = (1, 0)
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: ModelOpt's ``quant_algo`` values -> the precision names of ``--precision``.
QUANT_ALGOS = {
    "FP8": "fp8",
    "FP8_PER_CHANNEL_PER_TOKEN": "fp8",
    "NVFP4": "nvfp4",
    "W4A16_AWQ": "int4_awq",
    "W8A8_SQ_PER_CHANNEL": "int8_sq",
}


def checkpoint_precision(model_dir: Path) -> str | None:
    """The quantized precision of a ModelOpt-exported checkpoint (None: not quantized, or unreadable)."""
    folder = Path(model_dir)
    try:
        exported = json.loads((folder / "hf_quant_config.json").read_text())
        algo = (exported.get("quantization") or {}).get("quant_algo")
    except (OSError, ValueError):
        config = (read_config(folder) or {}).get("quantization_config") or {}
        algo = config.get("quant_algo") if config.get("quant_method") == "modelopt" else None
    if algo is None:
        return None
    return QUANT_ALGOS.get(str(algo).upper(), str(algo).lower())


class TrtllmPytorchEngine(TensorRTLLMEngine):
    """TensorRT-LLM's LLM API (PyTorch backend) in trtdeploy's Triton python model."""

    name = "trtllm_pytorch"
    #: The LLM API of TensorRT-LLM 1.0-1.2.x has no Whisper (its pull request 16141 adds one after 1.2).
    serves_encoder_decoder = False
    description = "TensorRT-LLM >= 1.0 PyTorch backend (LLM API) in trtdeploy's python model; ModelOpt checkpoints"
    precisions = ("bf16", "fp16", "fp8", "nvfp4", "int4_awq", "int8_sq")
    templates_dir = PYTHON_TEMPLATES
    rank = 20
    oldest = OLDEST
    newest = None

    def unavailable_reason(self) -> str | None:
        found = installed()
        if found is None:
            return "tensorrt_llm is not installed (serve inside the NGC -trtllm-python-py3 image, 25.10 or newer)"
        if TrtllmVersion.parse(found, newest=None).line < OLDEST:
            return f"TensorRT-LLM {found} predates the PyTorch backend's LLM API (1.0)"
        return None

    def validate(self, ctx: BuildContext) -> None:
        if ctx.gpu_profile is None:
            raise UsageError("the trtllm_pytorch engine serves on GPUs", hint="pass --gpu NAME (trtdeploy gpus)")
        if ctx.encoder_decoder:
            raise UsageError(
                "the trtllm_pytorch engine cannot serve Whisper: the LLM API (PyTorch backend) of TensorRT-LLM "
                "1.0-1.2.x has no Whisper model (TensorRT-LLM pull request 16141 adds one after 1.2)",
                hint="use --engine trtllm (TensorRT engines) or --engine torch",
            )
        if ctx.point.replicas > 1:
            raise UsageError(
                "the trtllm_pytorch engine runs one LLM per deployment",
                hint="build one deployment per GPU group, or use --engine trtllm or torch for --replicas",
            )
        if not (Path(ctx.llm_dir) / "config.json").is_file():
            return  # not downloaded yet: checked again after the download
        stored = checkpoint_precision(ctx.llm_dir)
        asked = ctx.point.precision
        if stored is None and asked not in DTYPES:
            raise UsageError(
                f"trtllm_pytorch serves {asked} weights from a checkpoint quantized by NVIDIA ModelOpt, and "
                f"{ctx.llm_dir} is not one",
                hint="export one with ModelOpt (hf_quant_config.json), or use --engine trtllm, which quantizes",
            )
        if stored is not None and stored != asked:
            raise UsageError(
                f"{ctx.llm_dir} holds {stored} weights (ModelOpt)", hint=f"build it with --precision {stored}"
            )

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        point = ctx.point
        parameters = {
            "generator_factory": "trtdeploy.engines.trtllm_pytorch.llmapi:load_from_parameters",
            "hf_model_dir": ctx.llm_dir,
            "dtype": DTYPES.get(point.precision, "auto"),
            "tensor_parallel_size": point.tp,
            "pipeline_parallel_size": point.pp,
            "max_batch_size": point.max_batch_size,
            "max_input_len": ctx.llm_max_input_len,
            "max_seq_len": point.max_seq_len,
            "max_num_tokens": point.max_num_tokens,
            **self.kv_cache_parameters(ctx),
            "enable_kv_cache_reuse": "true",
            "exclude_input_in_output": "true",
            "cancellation_check_period_ms": 100,
        }
        return {"parameters": parameters, "inputs": INPUTS, "outputs": OUTPUTS, "gpus": []}

    def notes(self, ctx: BuildContext) -> list[str]:
        version = self.release(ctx)
        image, exact = version.triton_image
        return [
            f"TensorRT-LLM {version.text} (PyTorch backend): serve inside {image}"
            + ("" if exact else " (the nearest image we know of; check NGC for this release)"),
            "no build step: the LLM API loads the Hugging Face checkpoint when the model loads (first start warms "
            "up CUDA graphs and kernels)",
            f"TP {ctx.point.tp} x PP {ctx.point.pp}: the LLM API starts its own workers inside one tritonserver "
            "(no mpirun ranks)",
            "KV-cache pool of max_batch_size x max_seq_len tokens at most (KvCacheConfig.max_tokens), block reuse "
            "on, chunked prefill on",
            "LLM() argument names follow TensorRT-LLM 1.0-1.2 (max_input_len, skip_tokenizer_init, "
            "KvCacheConfig.max_tokens); not run here: no TensorRT-LLM on the machines this was written on",
        ]


@hookimpl
def register_engines(register) -> None:
    """Register the built-in ``trtllm_pytorch`` engine."""
    register(TrtllmPytorchEngine())
