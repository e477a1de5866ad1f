"""The commands a TensorRT-LLM expert runs by hand for one build point, for the release the plan targets.

``convert_checkpoint.py`` (16-bit, weight-only) or ModelOpt's ``quantize.py`` (fp8, int4_awq, int8_sq) writes a
TRT-LLM checkpoint sharded for TP x PP; ``trtllm-build`` turns it into one engine per rank.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ...memory import ModelShape, read_config
from ...spec import BuildContext
from ..base import BuildStep
from .releases import first_with
from .versions import TrtllmVersion

#: Where the ``examples/`` folder of the matching TensorRT-LLM release is: where NVIDIA's TensorRT-LLM images keep
#: it, and where our Dockerfile puts it in the Triton image; ``TRTDEPLOY_TRTLLM_EXAMPLES`` overrides it.
DEFAULT_EXAMPLES = "/app/tensorrt_llm/examples"
#: Hugging Face architecture -> the examples folder of its converter (each release's row says which it has).
FAMILIES = {
    "Qwen2ForCausalLM": "qwen",
    "Qwen3ForCausalLM": "qwen",
    "Qwen3MoeForCausalLM": "qwen",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
}
#: Precisions written by ModelOpt's quantize.py (``--qformat``), the rest by convert_checkpoint.py.
QFORMATS = {"fp8": "fp8", "int4_awq": "int4_awq", "int8_sq": "int8_sq"}
WEIGHT_ONLY = {"int8_wo": "int8", "int4_wo": "int4"}
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: quantize.py's calibration samples: its default, and the fewer the INT4-AWQ examples of the model READMEs use.
CALIBRATION_SAMPLES = 512
AWQ_CALIBRATION_SAMPLES = 32
AWQ_BLOCK_SIZE = 128
#: Scratch folder of the TRT-LLM checkpoint inside the deployment being built (removed once the engines exist).
CHECKPOINT = "trtllm_checkpoint"
ENGINES = "engines"


def examples_dir() -> str:
    return os.environ.get("TRTDEPLOY_TRTLLM_EXAMPLES", DEFAULT_EXAMPLES)


@dataclass(frozen=True)
class Recipe:
    """What one build point needs from TensorRT-LLM, derived from its context and the checkpoint's config.json."""

    version: TrtllmVersion
    family: str
    dtype: str  # activation dtype given to the converter
    kv_cache_dtype: str | None  # None: the activation dtype
    load_on_cpu: bool

    @classmethod
    def of(cls, ctx: BuildContext) -> Recipe:
        point = ctx.point
        assert point.engine_version is not None
        version = TrtllmVersion.parse(point.engine_version)
        config = read_config(ctx.llm_dir)
        architectures = (config or {}).get("architectures") or []
        architecture = architectures[0] if architectures else "Qwen2ForCausalLM"  # unknown before the download
        _check_converter(architecture, version)
        profile = ctx.gpu_profile
        shape = ModelShape.from_config(config) if config else None
        if point.precision in DTYPES:
            dtype = DTYPES[point.precision]
        else:  # quantized weights: activations in the checkpoint's 16-bit type where the GPU has it (a float32
            # checkpoint, such as CosyVoice's llm.pt, gets bfloat16: its range, not float16's)
            stored = (config or {}).get("torch_dtype") or (config or {}).get("dtype") or "bfloat16"
            bf16 = stored in ("bfloat16", "float32") and (profile is None or profile.supports("bf16"))
            dtype = "bfloat16" if bf16 else "float16"
        # converters load the Hugging Face model on one GPU unless told otherwise
        load_on_cpu = bool(shape and profile and shape.params * 2 > profile.memory_gib * 0.8 * 2**30)
        return cls(
            version=version,
            family=FAMILIES[architecture],
            dtype=dtype,
            kv_cache_dtype=point.kv_cache_dtype or ("fp8" if point.precision == "fp8" else None),
            load_on_cpu=load_on_cpu,
        )

    @property
    def script_dir(self) -> str:
        return f"{examples_dir()}/{self.version.facts.examples_layout}{self.family}"


def _check_converter(architecture: str, version: TrtllmVersion) -> None:
    """Refuse an architecture this release's engine flow cannot convert, naming the release that can."""
    if architecture in version.facts.architectures:
        return
    first = first_with(architecture) if architecture in FAMILIES else None
    if first is None:
        raise UsageError(
            f"the trtllm engine has no converter for {architecture} (supported: {', '.join(FAMILIES)})",
            hint="use --engine trtllm_pytorch or --engine torch",
        )
    raise UsageError(
        f"TensorRT-LLM {version.text} cannot build {architecture} engines (its MODEL_MAP has it from {first.label})",
        hint=f"plan for --trtllm-version {first.label}.0 or newer, or use --engine trtllm_pytorch",
    )


def awq_shard_problems(config: dict, tp: int, block: int = AWQ_BLOCK_SIZE) -> list[str]:
    """Why int4_awq cannot be exported at ``tp``: each weight AWQ quantizes is scaled in groups of ``block`` input
    channels, so every shard of an input dimension must be a whole number of groups. Column-parallel layers (QKV,
    gate/up) split their outputs and keep the whole hidden size as input; row-parallel layers (the attention output
    projection, the MLP's and the experts' down projection) split their input by ``tp``."""
    text = config.get("text_config", config)
    hidden = text["hidden_size"]
    heads = text["num_attention_heads"]
    inputs = {
        "hidden_size (QKV and gate/up input)": (hidden, 1),
        "attention output projection input (heads x head_dim)": (heads * (text.get("head_dim") or hidden // heads), tp),
    }
    if text.get("moe_intermediate_size"):  # every layer's MLP is the experts (Qwen3-MoE)
        inputs["moe_intermediate_size (expert down projection input)"] = (text["moe_intermediate_size"], tp)
    else:
        inputs["intermediate_size (down projection input)"] = (text.get("intermediate_size") or 4 * hidden, tp)
    problems = []
    for name, (size, split) in inputs.items():
        if size % split:
            problems.append(f"{name} {size:,} does not split into {split} shards")
        elif (size // split) % block:
            shard = f"{size:,} / TP{split} = {size // split:,}" if split > 1 else f"{size:,}"
            problems.append(f"{name} {shard} is not a multiple of the AWQ block {block}")
    return problems


def awq_tps(config: dict, limit: int) -> list[int]:
    """The tensor-parallel sizes up to ``limit`` at which int4_awq can be exported."""
    return [tp for tp in range(1, limit + 1) if not awq_shard_problems(config, tp)]


def checkpoint_step(ctx: BuildContext, recipe: Recipe) -> BuildStep:
    """convert_checkpoint.py or quantize.py: the Hugging Face checkpoint -> a TRT-LLM checkpoint for TP x PP."""
    point = ctx.point
    parallel = ["--tp_size", str(point.tp), "--pp_size", str(point.pp)]
    common = ["--model_dir", str(ctx.llm_dir), "--output_dir", CHECKPOINT, "--dtype", recipe.dtype]
    dataset = ["--calib_dataset", point.calib_dataset] if point.calib_dataset else []
    if point.precision in QFORMATS:
        script = f"{examples_dir()}/quantization/quantize.py"
        argv = ["python3", script, *common]
        argv += ["--qformat", QFORMATS[point.precision]]
        if recipe.kv_cache_dtype:
            argv += ["--kv_cache_dtype", recipe.kv_cache_dtype]
        if point.precision == "int4_awq":
            argv += ["--awq_block_size", str(AWQ_BLOCK_SIZE)]
        argv += ["--calib_size", str(calibration_samples(ctx)), *dataset, *parallel]
        return BuildStep("quantize", f"quantize to {point.precision} with ModelOpt", tuple(argv), requires=(script,))
    script = f"{recipe.script_dir}/convert_checkpoint.py"
    argv = ["python3", script, *common, *parallel]
    if point.precision in WEIGHT_ONLY:
        argv += ["--use_weight_only", "--weight_only_precision", WEIGHT_ONLY[point.precision]]
    if recipe.kv_cache_dtype == "int8":  # calibrated on convert_checkpoint.py's dataset
        argv += ["--int8_kv_cache", *dataset]
    if recipe.load_on_cpu:
        argv.append("--load_model_on_cpu")
    return BuildStep("convert", f"convert to a TRT-LLM checkpoint ({point.precision})", tuple(argv), requires=(script,))


def calibrates(ctx: BuildContext, recipe: Recipe) -> bool:
    """Whether the checkpoint step calibrates on a dataset: ModelOpt's formats, or an INT8 KV cache."""
    return ctx.point.precision in QFORMATS or recipe.kv_cache_dtype == "int8"


def calibration_samples(ctx: BuildContext) -> int:
    """quantize.py's ``--calib_size``: ``--calib-size``, else fewer samples for AWQ than for the other formats."""
    default = AWQ_CALIBRATION_SAMPLES if ctx.point.precision == "int4_awq" else CALIBRATION_SAMPLES
    return ctx.point.calib_size or default


def build_step(ctx: BuildContext, recipe: Recipe) -> BuildStep:
    """trtllm-build: one engine per rank, for the point's batch, lengths and tokens per step."""
    point = ctx.point
    argv = [
        "trtllm-build",
        "--checkpoint_dir", CHECKPOINT,
        "--output_dir", ENGINES,
        "--max_batch_size", str(point.max_batch_size),
        "--max_input_len", str(ctx.llm_max_input_len),
        "--max_seq_len", str(point.max_seq_len),
        "--max_num_tokens", str(point.max_num_tokens),
        "--max_beam_width", "1",
        "--kv_cache_type", "paged",
        "--gpt_attention_plugin", "auto",
        "--remove_input_padding", "enable",
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable",
        "--multiple_profiles", "enable",
    ]  # fmt: skip
    if point.precision == "fp8":
        if recipe.kv_cache_dtype == "fp8":  # FP8 context attention reads and writes an FP8 KV cache
            argv += ["--use_fp8_context_fmha", "enable"]
    else:
        argv += ["--gemm_plugin", "auto"]
    workers = min(point.world_size, ctx.gpu_count or 1)
    if workers > 1:
        argv += ["--workers", str(workers)]
    return BuildStep("build", f"build {point.world_size} engine(s) with trtllm-build", tuple(argv))


def cleanup_step() -> BuildStep:
    def remove(log: Path) -> None:
        shutil.rmtree(log.parent.parent / CHECKPOINT, ignore_errors=True)
        log.write_text(f"removed {CHECKPOINT}/\n")

    return BuildStep("cleanup", f"remove {CHECKPOINT}/ (the engines are built)", run=remove)
