"""A deployment folder (``deployments/<model>/<point>/``) and its ``manifest.json``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from .errors import BuildError, NotFoundError
from .spec import BuildPoint

MANIFEST = "manifest.json"
SCHEMA = 1
COMPLETE = "complete"


@dataclass(frozen=True)
class Deployment:
    """A finished build: read-only view of a deployment folder, as ``serve`` and ``perf`` see it."""

    path: Path
    manifest: dict[str, Any]

    @classmethod
    def load(cls, path: Path | str) -> Deployment:
        """Load a deployment folder (or its manifest.json); refuse one that is not a complete build."""
        path = Path(path).expanduser()
        if path.name == MANIFEST:
            path = path.parent
        manifest_path = path / MANIFEST
        if not path.is_dir():
            raise NotFoundError(f"deployment folder {path} does not exist", hint="build one with `trtdeploy build`")
        if not manifest_path.is_file():
            raise NotFoundError(
                f"{path} is not a deployment folder (no {MANIFEST})", hint="pass a folder written by `trtdeploy build`"
            )
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise BuildError(
                f"{manifest_path} is unreadable ({exc})", hint="rebuild with `trtdeploy build --force`"
            ) from None
        status = manifest.get("status")
        if status != COMPLETE:
            reason = manifest.get("error") or "the build did not finish"
            raise BuildError(
                f"deployment {path} is not a complete build (status {status!r}: {reason})",
                hint=f"see its logs in {path / 'logs'}, then rerun `trtdeploy build ... --force`",
            )
        deployment = cls(path=path.resolve(), manifest=manifest)
        try:  # everything serve and perf read, read once here: a damaged manifest is refused as a whole
            deployment.point, deployment.entry_model, deployment.models, deployment.llm_dir  # noqa: B018
        except (KeyError, TypeError, ValueError) as exc:
            raise BuildError(
                f"{manifest_path} is damaged ({type(exc).__name__}: {exc})",
                hint="rebuild with `trtdeploy build ... --force`",
            ) from None
        return deployment

    @cached_property
    def point(self) -> BuildPoint:
        data = dict(self.manifest["point"])
        data["options"] = tuple(sorted(data.get("options", {}).items()))
        return BuildPoint(**data)

    @property
    def model(self) -> str:
        return str(self.manifest["point"]["model"])

    @property
    def model_repo(self) -> Path:
        return self.path / "model_repo"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def entry_model(self) -> str:
        return str(self.manifest["entry_model"])

    @property
    def llm_model_name(self) -> str:
        return str(self.manifest.get("llm_model_name", "tensorrt_llm"))

    @property
    def models(self) -> list[str]:
        """Every Triton model of the repository."""
        return list(self.manifest["triton_models"])

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.manifest["paths"]["checkpoint"])

    @property
    def llm_dir(self) -> Path:
        return Path(self.manifest["paths"]["llm"])

    @property
    def decoupled(self) -> bool:
        return self.point.mode == "streaming"

    @property
    def world_size(self) -> int:
        return self.point.world_size

    @property
    def server_env(self) -> dict[str, str]:
        """Environment variables the build asked tritonserver to run with."""
        return {str(k): str(v) for k, v in (self.manifest.get("server_env") or {}).items()}

    @property
    def server_ranks(self) -> int:
        """How many tritonserver processes (MPI ranks) serve this deployment."""
        return int(self.manifest.get("server_ranks", self.world_size))


def iter_manifests(root: Path) -> list[Path]:
    """Every manifest.json in ``root`` or up to four folders below it (``deployments/<model>/<point>/``)."""
    found: list[Path] = []
    for depth in ("*", "*/*", "*/*/*", "*/*/*/*"):
        found.extend(root.glob(f"{depth}/{MANIFEST}") if depth != "*" else root.glob(MANIFEST))
    return found


def find_latest(root: Path | None = None) -> Deployment:
    """The most recently finished complete deployment under ``root`` (default: the current folder)."""
    root = Path(root or os.getcwd())
    best: tuple[float, Path] | None = None
    for manifest_path in iter_manifests(root):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if manifest.get("status") != COMPLETE:
            continue
        stamp = manifest_path.stat().st_mtime
        if best is None or stamp > best[0]:
            best = (stamp, manifest_path.parent)
    if best is None:
        raise NotFoundError(
            f"no complete deployment found under {root}",
            hint="build one with `trtdeploy build MODEL`, or pass the deployment folder",
        )
    return Deployment.load(best[1])
