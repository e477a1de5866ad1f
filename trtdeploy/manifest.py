"""The ``manifest.json`` of a deployment folder: its one writer and its readers.

``build`` writes it (atomically, at every step); ``serve``, ``perf``, ``sweep`` and the next ``build`` read it, all
through this module, which refuses what is not a manifest, or one of another schema version, in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import BuildError, TrtDeployError, UsageError

MANIFEST = "manifest.json"
#: The manifest format's version: raise it whenever what readers expect of a manifest changes.
SCHEMA = 1
COMPLETE = "complete"
REBUILD = "rebuild with `trtdeploy build ... --force`"


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Write ``folder/manifest.json`` all at once (a reader sees the old one or the new one, never half)."""
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(folder / MANIFEST)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest file at ``path``: a JSON object of schema :data:`SCHEMA`.

    BuildError when it cannot be read or parsed; UsageError when it is not an object (not a manifest) or is of
    another schema version (naming both).
    """
    manifest = _read_object(path)
    _check_schema(path, manifest)
    return manifest


def load_complete(folder: Path) -> dict[str, Any]:
    """The manifest of the deployment ``folder`` (see :func:`read_manifest`); BuildError unless it is of a complete
    build (one that failed or is under way says why, and where its logs are, whatever its schema)."""
    path = folder / MANIFEST
    manifest = _read_object(path)
    status = manifest.get("status")
    if status != COMPLETE:
        reason = manifest.get("error") or "the build did not finish"
        raise BuildError(
            f"deployment {folder} is not a complete build (status {status!r}: {reason})",
            hint=f"see its logs in {folder / 'logs'}, then rerun `trtdeploy build ... --force`",
        )
    _check_schema(path, manifest)
    return manifest


def _read_object(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BuildError(f"{path} is unreadable ({exc})", hint=REBUILD) from None
    if not isinstance(manifest, dict):
        raise UsageError(
            f"{path} is not a deployment manifest (a JSON {type(manifest).__name__}, not an object)",
            hint="pass a deployment folder written by `trtdeploy build`",
        )
    return manifest


def _check_schema(path: Path, manifest: dict[str, Any]) -> None:
    schema = manifest.get("schema")
    if schema != SCHEMA:
        newer = isinstance(schema, int) and schema > SCHEMA
        raise UsageError(
            f"{path} is of manifest schema {schema}, and this trtdeploy reads schema {SCHEMA}",
            hint=REBUILD + (", or upgrade trtdeploy" if newer else ""),
        )


def reusable_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of the complete build at ``folder`` that this trtdeploy reads; None for anything else (no
    manifest, unreadable, another schema, an unfinished build): a build to do again."""
    try:
        return load_complete(folder)
    except TrtDeployError:
        return None


def manifest_status(path: Path) -> str | None:
    """The status the manifest file at ``path`` states, whatever its schema (None: no manifest, or not one), for
    choosing among deployments; the one chosen is then read with :func:`load_complete`, which checks the rest."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return manifest.get("status") if isinstance(manifest, dict) else None
