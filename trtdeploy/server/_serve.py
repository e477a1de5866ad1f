"""Serving a deployment folder: what ``trtdeploy serve`` does between parsing its options and printing."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from ..deployment import Deployment
from ..errors import ServerError
from ._process import RunningServer, launch
from ._state import ServerInfo, register, writable_servers_dir

LOG_NAME = "tritonserver.log"


def serve_deployment(
    deployment: Deployment,
    *,
    http_port: int | None = None,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    tritonserver: Path | None = None,
    log_file: Path | None = None,
    log_verbose: int = 0,
    timeout: float = 180.0,
    background: bool = False,
) -> tuple[RunningServer, ServerInfo]:
    """Start tritonserver on a deployment's model repository, wait for its models, and write its state file.

    A TRT-LLM engine deployment built for TP x PP > 1 runs as that many MPI ranks under mpirun (one GPU each).

    The log goes to ``<deployment>/logs/tritonserver.log`` unless ``log_file`` is given.
    """
    writable_servers_dir()
    extra = [f"--log-verbose={log_verbose}"] if log_verbose else []
    server = launch(
        deployment.model_repo,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        tritonserver=tritonserver,
        log_file=log_file or deployment.logs_dir / LOG_NAME,
        timeout=timeout,
        models=deployment.models,
        extra_args=extra,
        world_size=deployment.server_ranks,
        env=deployment.server_env,
        llm_models=[deployment.llm_model_name],
    )
    try:
        info = register(server, deployment=deployment.path, entry_model=deployment.entry_model, background=background)
    except BaseException:
        server.stop()
        raise
    return server, info


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Within this block SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, so cleanup runs for all three.

    The server runs in a session of its own and gets none of these signals itself: whoever holds it must stop it.
    Only the main thread can own signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_foreground(server: RunningServer) -> str:
    """Block while the server runs; a line saying how it ended.

    Ctrl-C (or SIGTERM/SIGHUP under :func:`stop_signals_as_interrupt`) stops the whole process group; a server
    stopped by ``trtdeploy stop`` (its state file gone) ends quietly too. A server that dies on its own raises
    ServerError with the log tail.
    """
    try:
        code = server.wait()
    except KeyboardInterrupt:
        server.stop()
        return "tritonserver stopped"
    stopped_elsewhere = server.state_file is not None and not server.state_file.exists()
    server.stop()
    if stopped_elsewhere:
        return "tritonserver was stopped by `trtdeploy stop`"
    tail = server.log_tail()
    raise ServerError(
        f"tritonserver exited on its own with status {code}",
        hint=f"full log: {server.log_file}",
        details=f"--- last lines of {server.log_file} ---\n{tail}" if tail else None,
    )
