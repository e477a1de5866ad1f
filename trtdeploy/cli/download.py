"""``trtdeploy download``: fetch a model's checkpoint, or write a random-weight one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import download as hub
from ..errors import UsageError
from ..plugins import get_model
from ._options import JsonOpt, ModelArg
from ._output import emit_json, err, out


def download(
    model: ModelArg,
    *,
    revision: Annotated[str | None, typer.Option(help="Branch, tag or commit of the Hub repository.")] = None,
    local_dir: Annotated[
        Path | None, typer.Option(help="Download into this folder instead of the Hugging Face cache.")
    ] = None,
    repo_id: Annotated[
        str | None, typer.Option(help="Download this Hub repository instead of the model's default one.")
    ] = None,
    random_weights: Annotated[
        bool,
        typer.Option(
            "--random-weights",
            help="Write a small random-weight checkpoint of the real architecture and layout into --local-dir "
            "(for tests and offline trials; it generates noise).",
        ),
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Download MODEL's checkpoint from the Hugging Face Hub (use the folder later with `build --model-dir`)."""
    spec = get_model(model)
    if random_weights:
        if local_dir is None:
            raise UsageError("--random-weights needs --local-dir to write into")
        if revision is not None or repo_id is not None:
            raise UsageError("--random-weights writes a checkpoint; --revision and --repo-id pick a download")
        path, source = hub.write_random(spec, local_dir).path, "random weights"
    else:
        repo = repo_id or spec.default_repo
        err.print(f"Downloading [bold]{repo}[/] ...")
        checkpoint = hub.download(repo, revision=revision, local_dir=local_dir)
        spec.validate_checkpoint(checkpoint.path)
        path, source = checkpoint.path, f"hf://{repo}"
    if json:
        emit_json({"model": model, "path": str(path), "source": source})
    else:
        out.print(f"{model} checkpoint ({source}) in {path}")
