"""Deployment folders as `trtdeploy build` writes them, for the exports the tests render, without TensorRT-LLM or a
GPU here: the build's own plan (a dry run, which plans for any machine), the manifest the build writes of it, and
the model repository rendered from the real templates; the checkpoint is the Hub's at a commit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trtdeploy import build
from trtdeploy.manifest import COMPLETE, write_manifest
from trtdeploy.repo import render_repository

#: The checkpoint the manifests name: qwen_llm's Hub repository at a commit.
SOURCE = {
    "repo_id": "Qwen/Qwen2.5-0.5B-Instruct",
    "revision": None,
    "commit": "7ae557604adf67be50417f59c2c2f167def9a775",
}
#: Stand-ins for the versions build records, so that the golden files do not change with this checkout's version.
VERSIONS = {"trtdeploy": "0.1.0", "trtdeploy_qwen_llm": "0.1.0"}


def write_deployment(
    path: Path, checkpoint: Path, *, engine: str, gpu: str, tp: int = 1, pp: int = 1, **request: object
) -> Path:
    """A complete qwen_llm deployment at ``path`` (streaming, with a model option set), as build writes it."""
    planned = build.plan(
        build.BuildRequest(
            model="qwen_llm",
            engine=engine,
            gpu=gpu,
            tp=tp,
            pp=pp,
            model_dir=checkpoint,
            **{"options": {"preprocessing_instances": "2"}, **request},
        ),  # fmt: skip
        dry_run=True,
    )
    planned.context = dataclasses.replace(planned.context, deployment_dir=path)
    manifest = build._manifest(planned, "0" * 64)
    manifest.update(status=COMPLETE, source=SOURCE, versions={**manifest["versions"], **VERSIONS})
    path.mkdir(parents=True)
    render_repository(planned.templates, path / "model_repo")
    write_manifest(path, manifest)
    return path
