"""State files of the servers trtdeploy started, so that ``perf`` and ``stop`` in another shell can find them.

One JSON file per server: ``$TRTDEPLOY_STATE_DIR/servers/<grpc_port>.json`` (default state dir
``~/.local/state/trtdeploy``). A file whose process is gone is stale and removed when seen.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ServerError
from ._process import RunningServer, process_alive, process_start_ticks, remove_shm_regions, terminate_group

_NONE_HINT = "start one with `trtdeploy serve --background`, or pass `--url HOST:PORT`"
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]"}


def state_dir() -> Path:
    """``$TRTDEPLOY_STATE_DIR``, default ``~/.local/state/trtdeploy``."""
    return Path(os.environ.get("TRTDEPLOY_STATE_DIR") or Path.home() / ".local" / "state" / "trtdeploy").expanduser()


def servers_dir() -> Path:
    return state_dir() / "servers"


def writable_servers_dir() -> Path:
    """The servers' record folder, created if need be; checked before a server starts, not after."""
    folder = servers_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-")
        probe.close()
    except OSError as exc:
        raise ServerError(
            f"cannot write server records in {folder} ({exc.strerror or exc})",
            hint="set TRTDEPLOY_STATE_DIR to a writable folder",
        ) from None
    return folder


@dataclass(frozen=True)
class ServerInfo:
    """A server as ``perf`` and ``stop`` see it: a state file of one trtdeploy started, or a URL given by hand."""

    host: str = "localhost"
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    #: None for a server known only by its URL.
    pid: int | None = None
    pgid: int | None = None
    #: The process's start time in clock ticks (to tell a reused pid from the server).
    start_ticks: int | None = None
    deployment: Path | None = None
    model_repo: Path | None = None
    entry_model: str | None = None
    models: list[str] = field(default_factory=list)
    log_file: Path | None = None
    #: ISO 8601 local time the server became ready.
    started: str | None = None
    background: bool = False
    shm_prefix: str | None = None
    state_file: Path | None = None

    @property
    def http_url(self) -> str | None:
        """``HOST:PORT`` (the form tritonclient.http takes)."""
        return None if self.http_port is None else f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str | None:
        """``HOST:PORT`` (the form tritonclient.grpc takes)."""
        return None if self.grpc_port is None else f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str | None:
        """``http://HOST:PORT/metrics``."""
        return None if self.metrics_port is None else f"http://{self.host}:{self.metrics_port}/metrics"

    def is_alive(self) -> bool:
        """Whether the server process still runs (always True for a server known only by URL)."""
        return self.pid is None or process_alive(self.pid, self.start_ticks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, plus the three URLs."""
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        data.update(http_url=self.http_url, grpc_url=self.grpc_url, metrics_url=self.metrics_url)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerInfo:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        for key in ("deployment", "model_repo", "log_file", "state_file"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        return cls(**values)

    @classmethod
    def from_url(cls, url: str) -> ServerInfo:
        """A server known only by URL: ``http://HOST:PORT`` is its HTTP endpoint, anything else its gRPC one."""
        scheme, sep, rest = url.partition("://")
        if not sep:
            scheme, rest = "grpc", url
        host, _, port = rest.rstrip("/").rpartition(":")
        if not host or not port.isdigit():
            raise ServerError(f"bad server URL {url!r}", hint="pass HOST:PORT (gRPC) or http://HOST:PORT")
        if scheme in ("http", "https"):
            return cls(host=host, http_port=int(port))
        return cls(host=host, grpc_port=int(port))


def register(
    server: RunningServer,
    *,
    deployment: Path | None = None,
    entry_model: str | None = None,
    background: bool = False,
) -> ServerInfo:
    """Write the state file of a server :func:`launch` started; ``server.stop()`` removes it again."""
    path = writable_servers_dir() / f"{server.grpc_port}.json"
    info = ServerInfo(
        http_port=server.http_port,
        grpc_port=server.grpc_port,
        metrics_port=server.metrics_port,
        pid=server.pid,
        pgid=server.pgid,
        start_ticks=process_start_ticks(server.pid),
        deployment=deployment,
        model_repo=server.model_repo,
        entry_model=entry_model,
        models=list(server.models),
        log_file=server.log_file,
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        background=background,
        shm_prefix=server.shm_prefix,
        state_file=path,
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(info.to_dict(), fh, indent=2)
    os.replace(tmp, path)
    server.state_file = path
    return info


def running_servers() -> list[ServerInfo]:
    """Servers with a state file whose process still runs, the most recently started first; removes stale files."""
    found: list[tuple[float, ServerInfo]] = []
    folder = servers_dir()
    if not folder.is_dir():
        return []
    for path in folder.glob("*.json"):
        try:
            info = replace(ServerInfo.from_dict(json.loads(path.read_text())), state_file=path)
            stamp = path.stat().st_mtime
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if info.pid is None or not info.is_alive():
            path.unlink(missing_ok=True)
            continue
        found.append((stamp, info))
    found.sort(key=lambda item: item[0], reverse=True)
    return [info for _, info in found]


def _host_port(url: str) -> tuple[str, int | None]:
    rest = url.partition("://")[2] or url
    host, _, port = rest.rstrip("/").split("/", 1)[0].rpartition(":")
    return host, int(port) if port.isdigit() else None


def current_server(url: str | None = None) -> ServerInfo:
    """The server to talk to: the one at ``url``, else the most recently started one that still runs.

    A local ``url`` that matches a state file gives that server's full record; any other is taken as given
    (see :meth:`ServerInfo.from_url`).
    """
    if url is not None:
        host, port = _host_port(url)
        if host in _LOCAL_HOSTS and port is not None:
            for info in running_servers():
                if port in (info.grpc_port, info.http_port):
                    return info
        return ServerInfo.from_url(url)
    servers = running_servers()
    if not servers:
        raise ServerError("no running server found", hint=_NONE_HINT)
    return servers[0]


def stop_server(info: ServerInfo, timeout: float = 30.0) -> None:
    """Stop a server from its state file: its whole process group and its shared memory.

    The file goes first: a foreground ``serve`` whose server stops takes a missing file as "stopped on purpose".
    """
    if info.state_file is not None:
        info.state_file.unlink(missing_ok=True)
    if info.pgid is not None and info.is_alive():
        terminate_group(info.pgid, timeout)
    if info.shm_prefix:
        remove_shm_regions(info.shm_prefix)


def stop_servers(port: int | None = None, all: bool = False, timeout: float = 30.0) -> list[ServerInfo]:
    """Stop the server on ``port``, every server (``all``), or the most recently started one; those stopped."""
    servers = running_servers()
    if port is not None:
        servers = [s for s in servers if port in (s.http_port, s.grpc_port, s.metrics_port)]
        if not servers:
            raise ServerError(f"no running server on port {port}", hint="`trtdeploy stop` alone stops the latest one")
    elif not servers:
        raise ServerError("no running server found", hint="start one with `trtdeploy serve --background`")
    chosen = servers if all or port is not None else servers[:1]
    for info in chosen:
        stop_server(info, timeout)
    return chosen
