"""The ``trtllm`` engine: TensorRT engines built by TensorRT-LLM 0.17.x to 1.2.x, served by the C++ backend.

The plan is exactly what an expert runs by hand (see :mod:`.commands`); the ``tensorrt_llm`` model's config.pbtxt
comes from a template per backend release family (the parameter sets of 0.17, 0.19 and 1.x differ). A dry run
plans for any release (``--trtllm-version``) on any machine; building needs TensorRT-LLM installed, in the serving
image of the same release (engines do not move between releases or GPU architectures).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...hookspecs import hookimpl
from ...spec import BuildContext
from ..base import BuildStep
from .commands import QFORMATS, Recipe, build_step, checkpoint_step, cleanup_step
from .tensors import OUTPUTS, inputs, renamed
from .versions import TensorRTLLMEngine, installed

TEMPLATES = Path(__file__).parent / "templates"
#: The runtime scheduler never pauses a started request (no eviction), so streams keep their pace.
SCHEDULER_POLICY = "guaranteed_no_evict"
#: Share of the KV-cache pool an encoder-decoder model keeps for cross attention.
CROSS_KV_CACHE_FRACTION = 0.5


class TrtllmEngine(TensorRTLLMEngine):
    """TensorRT-LLM engines (convert/quantize + trtllm-build) behind NVIDIA's ``tensorrtllm`` Triton backend."""

    name = "trtllm"
    description = "TensorRT engines built with trtllm-build (TRT-LLM 0.17-1.2), C++ tensorrtllm backend"
    precisions = ("bf16", "fp16", "fp8", "int8_wo", "int4_wo", "int4_awq", "int8_sq")
    templates_dir = TEMPLATES
    rank = 30
    launches_ranks = True

    def unavailable_reason(self) -> str | None:
        if installed() is None:
            return "tensorrt_llm is not installed (build inside the NGC -trtllm-python-py3 image: see the Dockerfile)"
        if shutil.which("trtllm-build") is None:
            return "trtllm-build is not on PATH"
        return None

    def validate(self, ctx: BuildContext) -> None:
        if ctx.gpu_profile is None:
            raise UsageError("the trtllm engine builds for a GPU", hint="pass --gpu NAME (trtdeploy gpus lists them)")
        version = self.release(ctx)
        if ctx.point.precision == "fp8" and ctx.gpu_profile.compute_capability >= (12, 0) and version.line < (0, 19):
            raise UsageError(f"fp8 on {ctx.gpu_profile.name} (SM120) needs TensorRT-LLM 0.19 or newer")
        Recipe.of(ctx)  # an architecture without a converter is refused here

    def steps(self, ctx: BuildContext) -> list[BuildStep]:
        recipe = Recipe.of(ctx)
        return [checkpoint_step(ctx, recipe), build_step(ctx, recipe), cleanup_step()]

    def server_env(self, ctx: BuildContext) -> dict[str, str]:
        # several instances of the model need the backend's orchestrator mode (it spawns each one's workers)
        return {"TRTLLM_ORCHESTRATOR": "1"} if ctx.point.replicas > 1 else {}

    def input_names(self, ctx: BuildContext) -> dict[str, str]:
        return renamed(self.release(ctx).config_family)

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        point = ctx.point
        family = self.release(ctx).config_family
        parameters: dict[str, Any] = {
            "max_beam_width": 1,
            "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
            "gpt_model_type": "inflight_fused_batching",
            "gpt_model_path": ctx.engine_dir,
            "batch_scheduler_policy": SCHEDULER_POLICY,
            **self.kv_cache_parameters(ctx),
            "exclude_input_in_output": "true",
            "enable_kv_cache_reuse": "false" if ctx.encoder_decoder else "true",
            "enable_chunked_context": "false" if ctx.encoder_decoder else "true",
        }
        if point.replicas > 1:  # one instance per GPU group, each run by the orchestrator's spawned workers
            parameters["gpu_device_ids"] = ";".join(",".join(map(str, group)) for group in point.gpu_groups)
        if ctx.encoder_decoder:
            parameters["encoder_model_path"] = ctx.engine_dir / "encoder"
            parameters["cross_kv_cache_fraction"] = CROSS_KV_CACHE_FRACTION
        return {
            "instances": point.replicas,
            "family": family,
            "inputs": inputs(family, encoder_decoder=ctx.encoder_decoder),
            "outputs": OUTPUTS,
            "parameters": parameters,
        }

    def notes(self, ctx: BuildContext) -> list[str]:
        point, recipe = ctx.point, Recipe.of(ctx)
        version = recipe.version
        image, exact = version.triton_image
        lines = [
            f"TensorRT-LLM {version.text}: build and serve inside {image}"
            + ("" if exact else f" (no NGC image ships exactly {version.text}; this is the nearest of its line)"),
            f"engines are bound to TensorRT-LLM {version.text} and {point.gpu} "
            f"({ctx.gpu_profile.sm if ctx.gpu_profile else '?'}): the manifest records both, a change rebuilds",
            f"max_input_len {ctx.llm_max_input_len}: trtllm-build's default 1024 would refuse longer prompts",
            f"max_tokens_in_paged_kv_cache {point.kv_cache_tokens} = max_batch_size x "
            f"max_seq_len: every sequence of the batch can reach full length, and the pool takes no more memory "
            f"than that (kv_cache_free_gpu_mem_fraction is the upper bound)",
            "enable_chunked_context: prompts longer than max_num_tokens are prefilled in chunks instead of refused",
            "enable_kv_cache_reuse: requests sharing a prompt prefix reuse its KV blocks (needs paged context FMHA)",
            f"batch_scheduler_policy {SCHEDULER_POLICY}: a started request is never paused to make room",
            "tokens_per_block left at the release's default (32 in the sources checked, 64 in older releases)",
        ]
        if point.precision in ("fp8", "int4_awq", "int8_sq"):
            lines.append(
                "quantize.py calibrates on its default dataset (cnn_dailymail) from the Hugging Face Hub: "
                "the build host needs Hub access or a local copy (--calib_dataset)"
            )
        if point.precision == "fp8":
            lines.append("fp8: gemm_plugin left disabled (TensorRT's own FP8 GEMMs), FP8 KV cache and FP8 context FMHA")
        if version.examples_layout_uncertain:
            lines.append(
                "examples path: examples/<model>/ up to 0.18, examples/models/core/<model>/ later; whether 0.19 "
                "already has the new layout is unverified (the build names the script it cannot find)"
            )
        if point.replicas > 1:
            lines.append(
                f"{point.replicas} instances of the engine behind one endpoint, on GPUs "
                f"{' / '.join(','.join(map(str, g)) for g in point.gpu_groups)} (gpu_device_ids), in the backend's "
                "orchestrator mode (TRTLLM_ORCHESTRATOR=1: it spawns each instance's workers; no mpirun)"
            )
        if point.world_size > 1 and point.replicas == 1:
            lines.append(
                f"serve runs {point.world_size} tritonserver ranks under mpirun (rank 0 serves the repository and "
                "the ports; the others load only tensorrt_llm, endpoints off)"
            )
        if recipe.load_on_cpu and point.precision not in QFORMATS:
            lines.append("--load_model_on_cpu: the 16-bit checkpoint does not fit one GPU while it is converted")
        if version.config_family == "1.x":
            lines.append(
                "config family 1.x: the backend reads `seed` and `min_tokens` (renamed from random_seed and "
                "min_length after 0.19.0; whether 0.20.0 already has the new names is unverified)"
            )
            lines.append(
                f"TensorRT-LLM {version.text}: trtllm-build and convert_checkpoint.py are legacy in the 1.x line "
                "(removed after 1.2); --engine trtllm_pytorch is the path forward"
            )
        return lines


@hookimpl
def register_engines(register) -> None:
    """Register the built-in ``trtllm`` engine."""
    register(TrtllmEngine())
