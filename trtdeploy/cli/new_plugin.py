"""``trtdeploy new-plugin``: write a ready model-plugin distribution to start a new model from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..scaffold import Kind, write_plugin
from ._options import JsonOpt
from ._output import emit_json, out


def new_plugin(
    name: Annotated[
        str,
        typer.Argument(
            help="The model name (`trtdeploy build NAME`): lower-case letters, digits and underscores; the "
            "distribution is trtdeploy-NAME, the module trtdeploy_NAME.",
            show_default=False,
        ),
    ],
    *,
    kind: Annotated[
        Kind,
        typer.Option(
            help="text-llm: a causal LM, text in and out, on trtdeploy's text-LLM pipeline; tts: speech synthesis "
            "(reference voice and text in, audio out); asr: speech recognition (audio in, text out).",
        ),
    ] = "text-llm",
    output_dir: Annotated[
        Path,
        typer.Option(help="Write the plugin into OUTPUT_DIR/NAME (a new or empty folder)."),
    ] = Path("."),
    json: JsonOpt = False,
) -> None:
    """Write a model plugin that installs, builds, serves and passes its own tests as written: pyproject with the
    entry point, the package with its spec, Triton model templates (tts, asr), a README saying what to change, and an
    end-to-end test on trtdeploy's pytest fixtures."""
    written = write_plugin(name, kind=kind, output_dir=output_dir)
    if json:
        emit_json({"path": str(written.path), "name": name, "kind": kind, "files": list(written.files)})
        return
    out.print(f"[green]✓[/] wrote {escape(written.names.distribution)} ({kind}) in {escape(str(written.path))}")
    out.print(f"  pip install -e {escape(str(written.path))} && pytest {escape(str(written.path))}", soft_wrap=True)
