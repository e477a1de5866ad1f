"""Checkpoints for planning TensorRT-LLM builds: a real model's config.json over tiny random weights.

Planning reads only config.json (shape, dtype, architecture), so the published configs of Qwen2.5-0.5B, Qwen2-72B
and the Spark-TTS LLM stand in for their weights; golden files hold the exact commands and configs planned.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from trtdeploy import build
from trtdeploy.repo import render_repository

GOLDEN = Path(__file__).parent.parent / "golden" / "trtllm"
#: One release per line the trtllm engine supports (the newest NGC-shipped one of each), and the golden file of its
#: commands: converters in examples/<model>/ up to 0.19, in examples/models/core/<model>/ from 0.20.
COMMANDS_GOLDEN = {
    "0.17.0.post1": "0.17-0.19.sh",
    "0.18.2": "0.17-0.19.sh",
    "0.19.0": "0.17-0.19.sh",
    "0.20.0": "0.20-1.2.sh",
    "0.21.0": "0.20-1.2.sh",
    "1.0.0": "0.20-1.2.sh",
    "1.1.0": "0.20-1.2.sh",
    "1.2.1": "0.20-1.2.sh",
}
VERSIONS = tuple(COMMANDS_GOLDEN)
PRECISIONS = ("bf16", "fp16", "fp8", "int8_wo", "int4_wo", "int4_awq", "int8_sq")

QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
QWEN2_72B = {
    **QWEN25_05B,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
QWEN3_8B = {
    **QWEN25_05B,
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
}
#: Qwen3-30B-A3B: 128 experts of intermediate size 768.
QWEN3_30B_A3B = {
    **QWEN3_8B,
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
}


def with_config(llm_dir: Path, config: dict) -> None:
    """Give the tiny checkpoint in ``llm_dir`` a real model's sizes (its weights are never read by a plan)."""
    path = llm_dir / "config.json"
    merged = {**json.loads(path.read_text()), **config}
    merged.pop("layer_types", None)  # per-layer lists of the tiny model: transformers re-derives them
    path.write_text(json.dumps(merged, indent=2))


def real_sized(trtdeploy_checkpoint, tmp_path_factory, model: str, config: dict, llm_subfolder: str = "") -> Path:
    """A copy of ``model``'s tiny test checkpoint whose LLM has ``config``'s sizes."""
    folder = tmp_path_factory.mktemp(model) / "checkpoint"
    shutil.copytree(trtdeploy_checkpoint(model), folder)
    with_config(folder / llm_subfolder if llm_subfolder else folder, config)
    return folder


def plan(checkpoint: Path, root: Path, **changes) -> build.Plan:
    request = build.BuildRequest(model="qwen_llm", engine="trtllm", model_dir=checkpoint, output_root=root)
    return build.plan(replace(request, **changes), dry_run=True)


def commands(found: build.Plan, checkpoint: Path, placeholder: str = "<checkpoint>") -> str:
    """The plan's commands as a shell would run them, with the checkpoint's path (or a converted LLM's) made stable."""
    lines = [shlex.join(step.argv) for step in found.steps if step.argv]
    return "\n".join(lines).replace(str(checkpoint), placeholder)


def rendered_config(found: build.Plan, dest: Path) -> str:
    """The tensorrt_llm model's config.pbtxt this plan renders (validated against Triton's protobuf)."""
    configs = render_repository(found.templates, dest)
    text = re.sub(r"/\S+/engines", "<deployment>/engines", configs["tensorrt_llm"].read_text())
    return text.replace(f"TensorRT-LLM {found.point.engine_version}.", "TensorRT-LLM <release>.", 1)


#: The line that ends a golden file's header: above it, what the plan was checked against (upstream files at tags).
HEADER_END = "# ---\n"
CHECKED = "# checked against: "


def under_ci() -> bool:
    """Whether the tests run in CI (the CI variable that CI services set; .ci/run sets it too)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with the body of tests/golden/trtllm/<name>, below its header of upstream sources.

    TRTDEPLOY_UPDATE_GOLDEN=1 rewrites the body instead (keeping the header) and skips the test, so that the diff
    is reviewed by hand; it refuses to run under CI, where a check must be able to fail.
    """
    path = GOLDEN / name
    header = body = ""
    if path.is_file():
        stored = path.read_text()
        header, found, body = stored.partition(HEADER_END)
        assert found, f"{name} has no header ending in {HEADER_END!r} (what it was checked against)"
        header += HEADER_END
    if os.environ.get("TRTDEPLOY_UPDATE_GOLDEN"):
        if under_ci():
            pytest.fail("TRTDEPLOY_UPDATE_GOLDEN=1 rewrites golden files: refused under CI (CI is set)")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((header or f"{CHECKED}TODO\n{HEADER_END}") + text)
        pytest.skip(f"rewrote {name}: review the diff")
    assert path.is_file(), f"no golden file {path} (TRTDEPLOY_UPDATE_GOLDEN=1 writes it outside CI)"
    sources = [line for line in header.splitlines() if line.startswith(CHECKED)]
    assert sources and not any("TODO" in line for line in sources), f"{name}'s header names no upstream source"
    assert text == body, f"{name} differs from its golden file (TRTDEPLOY_UPDATE_GOLDEN=1 rewrites it outside CI)"


#: Spark-TTS-0.5B's LLM/: Qwen2.5-0.5B with the BiCodec tokens added to its vocabulary.
SPARK_LLM = {**QWEN25_05B, "vocab_size": 166000}


#: openai/whisper-large-v3's config.json sizes (large-v3-turbo differs in its 4 decoder layers).
WHISPER_LARGE_V3 = {
    "model_type": "whisper",
    "num_mel_bins": 128,
    "d_model": 1280,
    "encoder_layers": 32,
    "decoder_layers": 32,
    "encoder_attention_heads": 20,
    "decoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "decoder_ffn_dim": 5120,
    "vocab_size": 51866,
    "max_source_positions": 1500,
    "max_target_positions": 448,
}
