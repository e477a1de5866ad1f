"""Records of the servers trtdeploy started, so that ``perf`` and ``stop`` in another shell can find them.

One JSON file per server: ``$TRTDEPLOY_STATE_DIR/servers/<grpc_port>-<pid>.json`` (default state dir
``~/.local/state/trtdeploy``; the folder is private to its user: a record holds the server's restricted-API key).
A record whose server died is swept when seen: what is left of the server is killed and removed first.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..errors import ServerError, TrtDeployWarning, UsageError
from ._process import (
    RunningServer,
    kill_processes,
    leftover_processes,
    process_alive,
    process_start_ticks,
    remove_shm_regions,
    restricted_headers,
    terminate_group,
)

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]"}


class ServerCleanupWarning(TrtDeployWarning):
    """What was left of a server that died (processes, shared memory) was cleaned up."""


def state_dir() -> Path:
    """``$TRTDEPLOY_STATE_DIR``, default ``~/.local/state/trtdeploy``."""
    return Path(os.environ.get("TRTDEPLOY_STATE_DIR") or Path.home() / ".local" / "state" / "trtdeploy").expanduser()


def servers_dir() -> Path:
    return state_dir() / "servers"


def writable_servers_dir() -> Path:
    """The servers' record folder (mode 0700), created if need be; checked before a server starts, not after."""
    folder = servers_dir()
    try:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        folder.chmod(0o700)
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
    """A server as ``perf`` and ``stop`` see it: a record of one trtdeploy started, or a URL given by hand."""

    #: Where clients connect (127.0.0.1 for a server listening on 127.0.0.1 or 0.0.0.0).
    host: str = "127.0.0.1"
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
    #: The address the server listens on.
    bind_address: str | None = None
    #: The tritonserver binary that runs, its version, and whether it is the one bundled in nvidia-pytriton.
    tritonserver: Path | None = None
    triton_version: str | None = None
    bundled: bool = False
    #: The APIs that answer only requests carrying the server's header (see :meth:`restricted_headers`).
    restricted_apis: list[str] = field(default_factory=list)
    #: (header, value) those requests carry: kept in the record, left out of :meth:`to_dict` unless asked for.
    restricted_key: tuple[str, str] | None = field(default=None, repr=False)
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

    def restricted_headers(self, protocol: Literal["grpc", "http"]) -> dict[str, str]:
        """The headers that open this server's restricted APIs (none for a server known only by URL)."""
        return restricted_headers(self.restricted_key, protocol)

    def is_alive(self) -> bool:
        """Whether the server process still runs (always True for a server known only by URL)."""
        return self.pid is None or process_alive(self.pid, self.start_ticks)

    def to_dict(self, *, secrets: bool = False) -> dict[str, Any]:
        """JSON-ready: every field (the restricted-API key only with ``secrets``), plus the three URLs."""
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        if not secrets:
            del data["restricted_key"]
        data.update(http_url=self.http_url, grpc_url=self.grpc_url, metrics_url=self.metrics_url)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerInfo:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        for key in ("deployment", "model_repo", "log_file", "tritonserver", "state_file"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        if values.get("restricted_key") is not None:
            values["restricted_key"] = tuple(values["restricted_key"])
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
    """Write the record (mode 0600) of a server :func:`launch` started; ``server.stop()`` removes it again."""
    path = writable_servers_dir() / f"{server.grpc_port}-{server.pid}.json"
    info = ServerInfo(
        host=server.client_host,
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
        bind_address=server.host,
        tritonserver=server.binary.path,
        triton_version=server.version,
        bundled=server.binary.bundled,
        restricted_apis=list(server.restricted_apis),
        restricted_key=server.restricted_key,
        state_file=path,
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)  # mode 0600
    with os.fdopen(fd, "w") as fh:
        json.dump(info.to_dict(secrets=True), fh, indent=2)
    os.replace(tmp, path)
    server.state_file = path
    return info


def _records() -> list[ServerInfo]:
    """Every readable record, the most recently written first; unreadable ones are removed."""
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
        found.append((stamp, info))
    found.sort(key=lambda item: item[0], reverse=True)
    return [info for _, info in found]


def _plural(count: int, noun: str, plural: str) -> str:
    return f"{count} {noun if count == 1 else plural}"


def _forget_dead(info: ServerInfo) -> None:
    """Kill what is left of a server whose leader died, remove its shared memory, then its record.

    python-backend stubs outlive a tritonserver killed while its parent does not reap it, and ignore SIGTERM.
    A :class:`ServerCleanupWarning` says that the server had died, and what was cleaned.
    """
    marks = [info.shm_prefix or "", str(info.model_repo) if info.model_repo else ""]
    leftovers = leftover_processes(info.pgid, marks) if info.pgid is not None else {}
    kill_processes(leftovers)
    removed = remove_shm_regions(info.shm_prefix or "")
    if info.state_file is not None:
        info.state_file.unlink(missing_ok=True)
    cleaned = (
        f": killed {_plural(len(leftovers), 'leftover process', 'leftover processes')}, removed "
        f"{_plural(removed, 'shared-memory region', 'shared-memory regions')}"
        if leftovers or removed
        else ""
    )
    warnings.warn(
        f"the server on gRPC port {info.grpc_port} ({info.deployment or 'no deployment'}) had died; its record is "
        f"removed{cleaned}",
        ServerCleanupWarning,
        stacklevel=3,
    )


def running_servers() -> list[ServerInfo]:
    """Servers with a record whose process still runs, the most recently started first.

    Records of servers that died are swept (see :func:`_forget_dead`).
    """
    live = []
    for info in _records():
        if info.pid is not None and info.is_alive():
            live.append(info)
        else:
            _forget_dead(info)
    return live


def resolved_path(path: Path) -> Path:
    """``path`` with symlinks and ``..`` resolved, to compare one folder named two ways."""
    try:
        return Path(path).resolve()
    except OSError:
        return Path(path).absolute()


def serving(servers: Iterable[ServerInfo], deployment: Path) -> list[ServerInfo]:
    """Those of ``servers`` that serve the deployment folder ``deployment``."""
    target = resolved_path(deployment)
    return [s for s in servers if s.deployment is not None and resolved_path(s.deployment) == target]


def _under(servers: Iterable[ServerInfo], folder: Path) -> list[ServerInfo]:
    root = resolved_path(folder)
    return [s for s in servers if s.deployment is not None and resolved_path(s.deployment).is_relative_to(root)]


def listing(servers: Iterable[ServerInfo]) -> str:
    """``gRPC URL (pid N, deployment)`` for each server."""
    return "; ".join(f"{s.grpc_url} (pid {s.pid}, {s.deployment or 'no deployment'})" for s in servers)


def servers_of(deployment: Path) -> list[ServerInfo]:
    """Running servers that serve the deployment folder ``deployment``."""
    return serving(running_servers(), deployment)


def servers_under(folder: Path) -> list[ServerInfo]:
    """Running servers whose deployment lies under ``folder`` (or is ``folder``)."""
    return _under(running_servers(), folder)


def _several(servers: list[ServerInfo], folder: Path, hint: str) -> UsageError:
    return UsageError(f"{len(servers)} servers run for deployments under {folder}: {listing(servers)}", hint=hint)


def choose_server(folder: Path | None = None) -> ServerInfo:
    """The one running server of a deployment under ``folder`` (default: the current folder).

    ServerError if there is none (naming those that run elsewhere), UsageError if there are several: nothing
    guesses among servers.
    """
    folder = Path(folder) if folder is not None else Path(os.getcwd())
    servers = running_servers()
    here = _under(servers, folder)
    if len(here) > 1:
        raise _several(here, folder, hint="name the deployment, or pass --url HOST:PORT")
    if not here:
        elsewhere = f"; running elsewhere: {listing(servers)}" if servers else ""
        raise ServerError(
            f"no server runs for a deployment under {folder}",
            hint=f"start one with `trtdeploy serve --background`, or pass --url HOST:PORT{elsewhere}",
        )
    return here[0]


def current_server(url: str) -> ServerInfo:
    """The server at ``url``: a local URL (or one on a recorded server's address) whose port matches a record gives
    that server's full record; any other is taken as given (see :meth:`ServerInfo.from_url`)."""
    rest = url.partition("://")[2] or url
    host, _, port = rest.rstrip("/").split("/", 1)[0].rpartition(":")
    if port.isdigit():
        for info in running_servers():
            if host in _LOCAL_HOSTS | {info.host} and int(port) in (info.grpc_port, info.http_port):
                return info
    return ServerInfo.from_url(url)


def servers_to_stop(
    *, deployment: Path | None = None, port: int | None = None, all: bool = False, folder: Path | None = None
) -> tuple[list[ServerInfo], str]:
    """The servers ``trtdeploy stop`` acts on, and, when there are none, a line saying so.

    The server of ``deployment``, the one using ``port``, every one (``all``), or else the one of a deployment under
    ``folder`` (default: the current folder): UsageError if several are there, as nothing guesses.
    """
    if sum((deployment is not None, port is not None, all)) > 1:
        raise UsageError("give one of DEPLOYMENT, --port and --all", hint="they pick the servers in different ways")
    servers = running_servers()
    if all:
        chosen, missing = servers, "no trtdeploy server runs"
    elif port is not None:
        chosen = [s for s in servers if port in (s.http_port, s.grpc_port, s.metrics_port)]
        missing = f"no trtdeploy server uses port {port}"
    elif deployment is not None:
        chosen, missing = serving(servers, deployment), f"no trtdeploy server runs for {deployment}"
    else:
        folder = Path(folder) if folder is not None else Path(os.getcwd())
        chosen = _under(servers, folder)
        if len(chosen) > 1:
            raise _several(
                chosen, folder, hint="say which: `trtdeploy stop --port P`, `trtdeploy stop DEPLOYMENT`, or `--all`"
            )
        missing = f"no trtdeploy server runs for a deployment under {folder}"
    if chosen:
        return chosen, ""
    elsewhere = f"; running elsewhere: {listing(servers)} (stop one with `trtdeploy stop DEPLOYMENT` or `--port P`)"
    return [], f"nothing to stop: {missing}{elsewhere if servers else ''}"


def stop_server(info: ServerInfo, timeout: float = 30.0) -> None:
    """Stop a recorded server: its whole process group and its shared memory, and forget it.

    A live server's record goes first: a foreground ``serve`` whose server stops takes a missing record as "stopped
    on purpose". One that died meanwhile is swept instead.
    """
    if info.pgid is None or not info.is_alive():
        _forget_dead(info)
        return
    if info.state_file is not None:
        info.state_file.unlink(missing_ok=True)
    terminate_group(info.pgid, timeout)
    if info.shm_prefix:
        remove_shm_regions(info.shm_prefix)
