"""Hand-written deployment manifests, for tests that serve or load model repositories of their own."""

from __future__ import annotations

import json
from pathlib import Path

from trtdeploy.manifest import SCHEMA
from trtdeploy.spec import BuildPoint


def write_manifest(
    path: Path,
    *,
    models: list[str],
    entry_model: str,
    model: str = "test_model",
    mode: str = "offline",
    llm_dir: Path | None = None,
    status: str = "complete",
    **point: object,
) -> Path:
    """``path/manifest.json`` as `trtdeploy build` writes it; ``point`` overrides BuildPoint fields."""
    fields = {
        "model": model, "engine": "torch", "precision": "fp32", "max_batch_size": 8, "mode": mode, "gpu": "cpu",
        "max_input_len": 256, "max_output_len": 64, **point,
    }  # fmt: skip
    llm = str(llm_dir or path / "checkpoint")
    manifest = {
        "schema": SCHEMA,
        "status": status,
        "point": BuildPoint(**fields).as_dict(),
        "entry_model": entry_model,
        "triton_models": models,
        "llm_model_name": "tensorrt_llm",
        "paths": {"checkpoint": llm, "llm": llm},
    }
    if status != "complete":
        manifest["error"] = "trtllm-build exited with status 1"
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return path
