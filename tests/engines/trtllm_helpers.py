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

from trtdeploy import build
from trtdeploy.repo import render_repository

GOLDEN = Path(__file__).parent.parent / "golden" / "trtllm"
#: One release per line the trtllm engine supports (the newest NGC-shipped one of each).
VERSIONS = ("0.17.0.post1", "0.18.2", "0.19.0", "0.20.0", "0.21.0", "1.0.0", "1.1.0", "1.2.1")
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


def commands(found: build.Plan, checkpoint: Path) -> str:
    """The plan's commands as a shell would run them, with the checkpoint's path made stable."""
    lines = [shlex.join(step.argv) for step in found.steps if step.argv]
    return "\n".join(lines).replace(str(checkpoint), "<checkpoint>")


def rendered_config(found: build.Plan, dest: Path) -> str:
    """The tensorrt_llm model's config.pbtxt this plan renders (validated against Triton's protobuf)."""
    configs = render_repository(found.templates, dest)
    return re.sub(r"/\S+/engines", "<deployment>/engines", configs["tensorrt_llm"].read_text())


def check_golden(name: str, text: str) -> None:
    """Compare with tests/golden/trtllm/<name>; TRTDEPLOY_UPDATE_GOLDEN=1 rewrites the file instead."""
    path = GOLDEN / name
    if os.environ.get("TRTDEPLOY_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path} (run with TRTDEPLOY_UPDATE_GOLDEN=1 to write it)"
    assert text == path.read_text(), f"{name} differs from its golden file (TRTDEPLOY_UPDATE_GOLDEN=1 rewrites it)"


#: Spark-TTS-0.5B's LLM/: Qwen2.5-0.5B with the BiCodec tokens added to its vocabulary.
SPARK_LLM = {**QWEN25_05B, "vocab_size": 166000}
