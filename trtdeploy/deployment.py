"""A deployment folder (``deployments/<model>/<point>/``) and its ``manifest.json``."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

from .errors import BuildError, NotFoundError, TrtDeployWarning
from .fsutil import atomic_write_text
from .manifest import COMPLETE, MANIFEST, REBUILD, load_complete, manifest_status
from .spec import BuildPoint

#: ``serve``'s measurements of how long the deployment takes to load, beside its manifest.
LOAD_TIMES = "load_times.json"
#: How many of the latest measurements it keeps.
LOAD_TIMES_KEPT = 10


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
        manifest = load_complete(path)
        deployment = cls(path=path.resolve(), manifest=manifest)
        try:  # everything serve and perf read, read once here: a damaged manifest is refused as a whole
            deployment.point, deployment.entry_model, deployment.models, deployment.llm_dir  # noqa: B018
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise BuildError(
                f"{manifest_path} is damaged ({type(exc).__name__}: {exc})",
                hint=REBUILD,
            ) from None
        return deployment

    @cached_property
    def point(self) -> BuildPoint:
        data = dict(self.manifest["point"])
        data["options"] = tuple(sorted(data.get("options", {}).items()))
        data["engine_options"] = tuple(sorted(data.get("engine_options", {}).items()))
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

    @property
    def load_times(self) -> list[dict[str, Any]]:
        """The latest load times ``serve`` measured (oldest first): ``{"at", "seconds"}`` each; none when never
        served (or the file is unreadable: it is only a measurement)."""
        try:
            records = json.loads((self.path / LOAD_TIMES).read_text(encoding="utf-8"))["loads"]
            return [record for record in records if isinstance(record.get("seconds"), (int, float))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []

    def record_load_time(self, seconds: float) -> None:
        """Add a measured load time (seconds from starting tritonserver to every model ready), keeping the latest
        :data:`LOAD_TIMES_KEPT`; a folder that cannot be written is a warning, never a failed serve."""
        record = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seconds": round(seconds, 2)}
        loads = [*self.load_times, record][-LOAD_TIMES_KEPT:]
        try:
            atomic_write_text(self.path / LOAD_TIMES, json.dumps({"loads": loads}, indent=2) + "\n")
        except OSError as exc:
            warnings.warn(
                f"cannot record the load time in {self.path / LOAD_TIMES}: {exc.strerror or exc}",
                TrtDeployWarning,
                stacklevel=2,
            )


def iter_manifests(root: Path) -> list[Path]:
    """Every manifest.json in ``root`` or up to four folders below it: from a deployment folder,
    ``deployments/<model>/``, ``deployments/`` or the project holding it, each finds the deployments under it."""
    return [path for depth in range(5) for path in root.glob("*/" * depth + MANIFEST)]


def find_latest(root: Path | None = None) -> Deployment:
    """The most recently finished complete deployment under ``root`` (default: the current folder)."""
    root = Path(root or os.getcwd())
    complete = [path for path in iter_manifests(root) if manifest_status(path) == COMPLETE]
    if not complete:
        raise NotFoundError(
            f"no complete deployment found under {root}",
            hint="build one with `trtdeploy build MODEL`, or pass the deployment folder",
        )
    return Deployment.load(max(complete, key=lambda path: path.stat().st_mtime).parent)
