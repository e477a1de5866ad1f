"""The ``trtllm`` engine: TensorRT engines built by TensorRT-LLM 0.17.x to 1.2.x, served by the C++ backend.

The plan is exactly what an expert runs by hand (see :mod:`.commands`) for the release it targets; what differs
between releases (examples layout, the backend's tensor names, the architectures it converts) is one row per release
line in :mod:`.releases`. A dry run plans for any release (``--trtllm-version``) on any machine; building needs
TensorRT-LLM installed, in the serving image of the same release (engines do not move between releases or GPU
architectures).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...hookspecs import hookimpl
from ...memory import read_config
from ...spec import BuildContext
from ..base import BuildStep, sliding_window_problem
from . import whisper
from .commands import (
    AWQ_BLOCK_SIZE,
    QFORMATS,
    Recipe,
    awq_shard_problems,
    awq_tps,
    build_step,
    calibrates,
    calibration_samples,
    checkpoint_step,
    cleanup_step,
)
from .releases import FACTS, LAUNCH_SOURCE, RELEASES, Release
from .tensors import inputs, outputs, renamed
from .versions import TensorRTLLMEngine, TrtllmVersion, installed
from .whisper import ASSETS, MEL_FILTERS, TIKTOKEN

TEMPLATES = Path(__file__).parent / "templates"
#: The runtime scheduler never pauses a started request (no eviction), so streams keep their pace.
SCHEDULER_POLICY = "guaranteed_no_evict"
#: What launch_triton_server.py sets for several TRT-LLM model instances in one server (``--multi-model``): the
#: backend's orchestrator spawns each instance's workers (``serve`` adds the rest of that launch: see server/_serve).
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
#: Facts about GPU kernels: they refuse a point or get a note of their own, not the release-facts note.
GPU_FACTS = ("sm100_unsupported", "sm120_unpinned")
#: Facts only Whisper plans depend on.
WHISPER_FACTS = ("examples_layout", "whisper_model_names")


class TrtllmEngine(TensorRTLLMEngine):
    """TensorRT-LLM engines (convert/quantize + trtllm-build) behind NVIDIA's ``tensorrtllm`` Triton backend."""

    name = "trtllm"
    description = "TensorRT engines built with trtllm-build (TRT-LLM 0.17-1.2), C++ tensorrtllm backend"
    precisions = ("bf16", "fp16", "fp8", "int8_wo", "int4_wo", "int4_awq", "int8_sq")
    templates_dir = TEMPLATES
    rank = 30
    launches_ranks = True
    #: The engine options of ``trtdeploy build`` this engine honours (see build.ENGINE_OPTION_FLAGS).
    build_options = frozenset({"kv_cache_dtype", "calib_dataset", "calib_size"})

    def unavailable_reason(self) -> str | None:
        if installed() is None:
            return "tensorrt_llm is not installed (build inside the NGC -trtllm-python-py3 image: see the Dockerfile)"
        if shutil.which("trtllm-build") is None:
            return "trtllm-build is not on PATH"
        return None

    def default_encoder_decoder_precision(self, device: str) -> str:
        return whisper.PRECISIONS[0]  # the Whisper example builds fp16 activations only

    def release_of(self, text: str) -> TrtllmVersion:
        version = super().release_of(text)
        if version.line not in {release.line for release in RELEASES}:
            known = ", ".join(release.label for release in RELEASES)
            raise UsageError(f"TensorRT-LLM {version.text} is not a release line this engine knows ({known})")
        return version

    def validate(self, ctx: BuildContext) -> None:
        profile = ctx.gpu_profile
        if profile is None:
            raise UsageError("the trtllm engine builds for a GPU", hint="pass --gpu NAME (trtdeploy gpus lists them)")
        point, version = ctx.point, self.release(ctx)
        if ctx.encoder_decoder:
            whisper.validate(ctx)
            return
        if point.precision == "fp8" and profile.compute_capability >= (12, 0) and version.line < (0, 19):
            raise UsageError(f"fp8 on {profile.name} (SM120) needs TensorRT-LLM 0.19 or newer")
        unsupported = version.facts.sm100_unsupported
        if profile.compute_capability[0] == 10 and point.precision in unsupported:
            raise UsageError(
                f"{point.precision} on {profile.name} ({profile.sm}): TensorRT-LLM's engine builder has no kernel for "
                f"it there ({unsupported[point.precision]})",
                hint="use --precision fp8 or bf16, or --engine trtllm_pytorch",
            )
        self._check_kv_cache(ctx)
        config = read_config(ctx.llm_dir)
        # the engines are built with attention over the whole sequence (no max_attention_window_size)
        problem = sliding_window_problem(config or {}, point.max_seq_len, self.name)
        if problem:
            raise UsageError(problem)
        if point.precision == "int4_awq" and config:
            problems = awq_shard_problems(config, point.tp)
            if problems:
                working = [f"--tp {tp}" for tp in awq_tps(config, point.tp)]
                raise UsageError(
                    f"int4_awq at TP{point.tp}: {'; '.join(problems)} (ModelOpt refuses the export)",
                    hint=f"use {' or '.join(working)} (with --pp for more GPUs), or another precision"
                    if working
                    else "use another precision",
                )
        Recipe.of(ctx)  # an architecture without a converter in this release is refused here

    def _check_kv_cache(self, ctx: BuildContext) -> None:
        """``--kv-cache-dtype`` against the GPU and the precision's checkpoint writer."""
        point, profile = ctx.point, ctx.gpu_profile
        assert profile is not None
        if point.kv_cache_dtype == "fp8":
            if not profile.supports("fp8"):
                raise UsageError(
                    f"--kv-cache-dtype fp8 needs compute capability 8.9+ and the {profile.name} is {profile.sm}",
                    hint="use --kv-cache-dtype int8",
                )
            if point.precision not in QFORMATS:
                raise UsageError(
                    f"--kv-cache-dtype fp8 with {point.precision}: convert_checkpoint.py, which writes "
                    f"{point.precision} checkpoints, has only an INT8 KV cache (--int8_kv_cache)",
                    hint=f"use --kv-cache-dtype int8, or a precision quantize.py writes ({', '.join(QFORMATS)})",
                )

    def steps(self, ctx: BuildContext) -> list[BuildStep]:
        if ctx.encoder_decoder:
            return whisper.steps(ctx, self.release(ctx))
        recipe = Recipe.of(ctx)
        return [checkpoint_step(ctx, recipe), build_step(ctx, recipe), cleanup_step()]

    def server_env(self, ctx: BuildContext) -> dict[str, str]:
        return dict(ORCHESTRATOR_ENV) if ctx.point.replicas > 1 else {}

    def input_names(self, ctx: BuildContext) -> dict[str, str]:
        return renamed(self.release(ctx).facts)

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        point = ctx.point
        release = self.release(ctx).facts
        parameters: dict[str, Any] = {
            "max_beam_width": 1,
            "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
            "gpt_model_type": "inflight_fused_batching",
            "gpt_model_path": ctx.engine_dir,
            "batch_scheduler_policy": SCHEDULER_POLICY,
            **self.kv_cache_parameters(ctx),
            "exclude_input_in_output": "true",
            "enable_kv_cache_reuse": "true",
            "enable_chunked_context": "true",
        }
        if ctx.encoder_decoder:  # the official Whisper fill: two engines, a cross-attention cache, no reuse/chunks
            parameters.update(
                gpt_model_path=ctx.engine_dir / "decoder",
                encoder_model_path=ctx.engine_dir / "encoder",
                max_tokens_in_paged_kv_cache=whisper.kv_cache_tokens(ctx),
                cross_kv_cache_fraction=whisper.cross_kv_cache_fraction(ctx),
                enable_kv_cache_reuse="false",
                enable_chunked_context="false",
            )
        if point.replicas > 1:  # one instance per GPU group, each run by the orchestrator's spawned workers
            parameters["gpu_device_ids"] = ";".join(",".join(map(str, group)) for group in point.gpu_groups)
        return {
            "instances": point.replicas,
            "inputs": inputs(release, encoder_decoder=ctx.encoder_decoder),
            "outputs": outputs(release),
            "parameters": parameters,
        }

    def notes(self, ctx: BuildContext) -> list[str]:
        if ctx.encoder_decoder:
            return self._whisper_notes(ctx)
        point, recipe = ctx.point, Recipe.of(ctx)
        version = recipe.version
        release = version.facts
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
            f"TensorRT-LLM {release.label}: converters in examples/{release.examples_layout}<model>/, the backend "
            f"({release.backend_home}) reads {release.seed_input} and {release.min_tokens_input}, and "
            f"{release.stats_input} makes it write {', '.join(release.stats_outputs)} (declared as outputs)"
            + _token_counts(release),
        ]
        unconfirmed = [FACTS[name] for name in release.unconfirmed if name not in (*GPU_FACTS, "whisper_model_names")]
        if unconfirmed:
            lines.append(
                f"TensorRT-LLM {release.label}: {', '.join(unconfirmed)} not read at its own tag (from the releases "
                "around it, pull requests and untagged sources: trtdeploy/engines/trtllm/releases.py)"
            )
        if calibrates(ctx, recipe):
            dataset = point.calib_dataset or "its default dataset (cnn_dailymail) from the Hugging Face Hub"
            if point.precision in QFORMATS:
                samples = f"{calibration_samples(ctx)} samples"
            else:  # the INT8 KV cache of convert_checkpoint.py
                samples = "convert_checkpoint.py's own number of samples" + (
                    " (--calib-size unused: it takes none)" if point.calib_size else ""
                )
            lines.append(f"calibration on {dataset}, {samples}")
        elif point.calib_dataset or point.calib_size:
            lines.append(
                f"--calib-dataset/--calib-size unused: {point.precision} with this KV cache calibrates nothing"
            )
        profile = ctx.gpu_profile
        unpinned = release.sm120_unpinned.get(point.precision)
        if profile is not None and profile.compute_capability[0] == 12 and unpinned:
            lines.append(
                f"{point.precision} on {profile.name} ({profile.sm}): planned, though whether TensorRT-LLM "
                f"{version.text}'s engine builder has its kernel there rests on sources not pinned to a release "
                f"({unpinned}); if trtllm-build stops with 'Arch unsupported', use --precision fp8 or bf16, or "
                "--engine trtllm_pytorch"
            )
        if point.precision == "int4_awq":
            groups = f"every sharded input dimension is a whole number of {AWQ_BLOCK_SIZE}-wide AWQ groups"
            lines.append(
                f"int4_awq at TP{point.tp}: {groups} (checked before the build)"
                if read_config(ctx.llm_dir)
                else f"int4_awq at TP{point.tp}: that {groups} (else ModelOpt refuses the export) is checked once "
                "config.json is here: a build fetches it before the weights"
            )
        if recipe.kv_cache_dtype:
            lines.append(f"KV cache in {recipe.kv_cache_dtype} (the memory estimate counts 16-bit elements)")
        if point.precision == "fp8":
            fmha = " and FP8 context FMHA" if recipe.kv_cache_dtype == "fp8" else ""
            lines.append(f"fp8: gemm_plugin left disabled (TensorRT's own FP8 GEMMs){fmha}")
        if point.replicas > 1:
            lines.append(
                f"{point.replicas} instances of the engine behind one endpoint, on GPUs "
                f"{' / '.join(','.join(map(str, g)) for g in point.gpu_groups)} (gpu_device_ids), in the backend's "
                "orchestrator mode launched as launch_triton_server.py --multi-model does: TRTLLM_ORCHESTRATOR=1, "
                "tritonserver as one MPI rank (mpirun -n 1) whose backend spawns each instance's workers, no pinned "
                "memory pool, no peer access and a zero CUDA memory pool on every GPU (Triton newer than 24.06; "
                f"{LAUNCH_SOURCE})"
            )
        if point.world_size > 1 and point.replicas == 1:
            lines.append(
                f"serve runs {point.world_size} tritonserver ranks under mpirun (rank 0 serves the repository and "
                "the ports; the others load only tensorrt_llm, endpoints off)"
            )
        if recipe.load_on_cpu and point.precision not in QFORMATS:
            lines.append("--load_model_on_cpu: the 16-bit checkpoint does not fit one GPU while it is converted")
        if version.line >= (1, 0):
            lines.append(
                f"TensorRT-LLM {version.text}: trtllm-build and convert_checkpoint.py are legacy in the 1.x line "
                "(removed after 1.2); --engine trtllm_pytorch is the path forward"
            )
        return lines

    def _whisper_notes(self, ctx: BuildContext) -> list[str]:
        point, version = ctx.point, self.release(ctx)
        release = version.facts
        image, exact = version.triton_image
        dims = whisper.read_dims(ctx)
        name = whisper.model_name(dims, version)
        frames = whisper.encoder_frames(ctx)
        lines = [
            f"TensorRT-LLM {version.text}: build and serve inside {image}"
            + ("" if exact else f" (no NGC image ships exactly {version.text}; this is the nearest of its line)"),
            f"engines are bound to TensorRT-LLM {version.text} and {point.gpu}: the manifest records both, a change "
            "rebuilds; convert with the examples/ of the same release (a newer converter's weight names make an "
            "older trtllm-build fail with 'Required but not provided tensors')",
            f"Whisper on TensorRT-LLM {release.label}: engines only (the C++ runtime behind the tensorrtllm backend); "
            f"the converter is examples/{release.examples_layout}whisper/convert_checkpoint.py and reads "
            f"openai-whisper's checkpoint format, not Hugging Face's",
            f"{ASSETS}/{name}.pt: the Hugging Face weights under openai-whisper's names, written by trtdeploy (what "
            "the example's distil_whisper/convert_from_distil_whisper.py does); --model_name only picks the file, "
            "the converter reads the shape from its dims",
            f"{ASSETS}/{MEL_FILTERS} (mel_{dims.n_mels if dims else 'N'}: the Slaney mel filterbank of "
            f"openai-whisper's file) and {ASSETS}/{TIKTOKEN} (the checkpoint's byte-level vocabulary, rank = token "
            "id): the runtime assets of the official whisper_bls and run.py, which the converter does not read",
            f"fp16 activations (the Whisper example's support matrix: FP16, INT8/INT4 weight-only); encoder input "
            f"{frames} mel frames (30 s), output {frames // 2}: --max_input_len/--max_seq_len {frames} for the "
            f"encoder, --max_encoder_input_len {frames} for the decoder",
            f"decoder --max_input_len {ctx.llm_max_input_len} and --max_seq_len {point.max_seq_len} (the official "
            "recipe builds 14 and 114: a 50-token cap and no text prompt); max_beam_width 1 (the official build "
            "takes 4 and serves 1)",
            f"max_tokens_in_paged_kv_cache {whisper.kv_cache_tokens(ctx)} = max_batch_size x (max_seq_len + "
            f"{frames // 2} encoder outputs), cross_kv_cache_fraction {whisper.cross_kv_cache_fraction(ctx)} (the "
            "cross-attention share of that memory; the official fill takes 0.5): every request of the batch fits "
            "both caches at full length",
            "enable_kv_cache_reuse and enable_chunked_context false (the official Whisper fill), "
            "encoder_input_features in FP16 (what the official whisper_bls sends)",
            "the official whisper_bls builds its tokenizer with 100 languages (large-v3's layout): a 99-language "
            "checkpoint (v2 and older) shifts every id from <|translate|> on by one there",
            "--max_num_tokens not passed: trtllm-build's default, as in the official Whisper build",
        ]
        unconfirmed = [FACTS[name] for name in release.unconfirmed if name in WHISPER_FACTS]
        if unconfirmed:
            lines.append(
                f"TensorRT-LLM {release.label}: {', '.join(unconfirmed)} not read at its own tag (from the releases "
                "around it, issues and untagged sources: trtdeploy/engines/trtllm/releases.py)"
            )
        if version.line >= (1, 0):
            lines.append(
                f"TensorRT-LLM {version.text}: trtllm-build and convert_checkpoint.py are legacy in the 1.x line; "
                "its LLM API (PyTorch backend) has no Whisper through 1.2.x (TensorRT-LLM pull request 16141 adds "
                "it after 1.2), so --engine trtllm_pytorch refuses Whisper"
            )
        return lines


def _token_counts(release: Release) -> str:
    if not release.token_count_inputs:
        return ""
    return (
        f"; {' and '.join(release.token_count_inputs)} make it write {', '.join(release.token_count_outputs)} "
        "(declared as outputs)"
    )


@hookimpl
def register_engines(register) -> None:
    """Register the built-in ``trtllm`` engine."""
    register(TrtllmEngine())
