"""Serving a deployment folder: what ``trtdeploy serve`` does between parsing its options and printing."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from .. import gpus
from ..deployment import Deployment
from ..errors import ServerError
from ._process import DEFAULT_HOST, DEFAULT_PORTS, RunningServer, launch
from ._state import ServerInfo, listing, register, resolved_path, running_servers, serving, writable_servers_dir

#: The link in a deployment's logs/ folder to the newest server log.
LOG_NAME = "tritonserver.log"


def serve_deployment(
    deployment: Deployment,
    *,
    http_port: int | None = None,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    host: str = DEFAULT_HOST,
    allow_api: Sequence[str] = (),
    tritonserver: Path | None = None,
    log_file: Path | None = None,
    log_verbose: int = 0,
    timeout: float = 180.0,
    background: bool = False,
) -> tuple[RunningServer, ServerInfo]:
    """Start tritonserver on a deployment's model repository, wait for its models, and record it.

    Refused (ServerError) while the deployment is served already, or ``log_file`` is a running server's log. Ports,
    ``host`` and ``allow_api`` as for :func:`~trtdeploy.server.launch`. A TRT-LLM engine deployment built for
    TP x PP > 1 runs as that many MPI ranks under mpirun (one GPU each), one with several instances of the engine as
    the one MPI rank of the backend's orchestrator mode (:func:`orchestrator_gpus`). The log goes to a new
    ``<deployment>/logs/tritonserver-<YYYYmmdd-HHMMSS>.log`` (see :func:`new_log_file`) unless ``log_file`` is given.
    """
    with _starting(deployment.path):
        servers = running_servers()
        served = serving(servers, deployment.path)
        if served:
            info = served[0]
            raise ServerError(
                f"{deployment.path} is served already: gRPC {info.grpc_url}, HTTP {info.http_url}, pid {info.pid}, "
                f"log {info.log_file}",
                hint=f"use that server, or stop it first: `trtdeploy stop {deployment.path}`",
            )
        if log_file is not None:
            for info in servers:
                if info.log_file is not None and resolved_path(info.log_file) == resolved_path(log_file):
                    raise ServerError(
                        f"{log_file} is the log of the running server {listing([info])}",
                        hint="pass another --log-file, or none: each server gets its own in <deployment>/logs/",
                    )
        extra = [f"--log-verbose={log_verbose}"] if log_verbose else []
        started = time.monotonic()
        server = launch(
            deployment.model_repo,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            host=host,
            allow_api=allow_api,
            tritonserver=tritonserver,
            log_file=log_file or new_log_file(deployment.logs_dir),
            timeout=timeout,
            models=deployment.models,
            extra_args=extra,
            env=deployment.server_env,
            **rank_layout(deployment),
        )
        deployment.record_load_time(time.monotonic() - started)
        try:
            info = register(
                server, deployment=deployment.path, entry_model=deployment.entry_model, background=background
            )
        except BaseException:
            server.stop()
            raise
    return server, info


def rank_layout(deployment: Deployment, gpu_count: int | None = None) -> dict[str, Any]:
    """How the deployment's tritonserver ranks are laid out, as :func:`~trtdeploy.server.launch` and
    :func:`~trtdeploy.server._process.server_command` take it (``world_size``, ``llm_models``,
    ``orchestrator_gpus``): ``serve`` here, and the pods ``export k8s`` writes, which see ``gpu_count`` GPUs."""
    return {
        "world_size": deployment.server_ranks,
        "llm_models": [deployment.llm_model_name],
        "orchestrator_gpus": orchestrator_gpus(deployment, gpu_count),
    }


def orchestrator_gpus(deployment: Deployment, gpu_count: int | None = None) -> tuple[int, ...]:
    """The GPUs whose memory pools an orchestrator-mode server leaves to the spawned workers (none when the build did
    not ask for that mode): every GPU there is (``gpu_count``; default: what nvidia-smi lists, as
    launch_triton_server.py counts them), and at least the deployment's own."""
    if deployment.server_env.get("TRTLLM_ORCHESTRATOR") != "1":
        return ()
    if gpu_count is None:
        detected = gpus.detect()
        gpu_count = detected.count if detected else 0
    return tuple(range(max(gpu_count, deployment.point.gpus_needed)))


@contextmanager
def _starting(deployment: Path) -> Iterator[None]:
    """Held while a server for ``deployment`` starts, until it is recorded: a second ``serve`` of it meanwhile is
    refused instead of starting a second server."""
    digest = hashlib.sha256(str(deployment).encode()).hexdigest()[:16]
    with open(writable_servers_dir() / f".starting-{digest}", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerError(
                f"a server for {deployment} is being started (by another `trtdeploy serve`)",
                hint="wait until it is ready and use it",
            ) from None
        yield


def new_log_file(logs_dir: Path) -> Path:
    """A new, empty ``tritonserver-<YYYYmmdd-HHMMSS>[-N].log`` in ``logs_dir``, and ``tritonserver.log`` there
    pointing at it (replaced atomically; a plain ``tritonserver.log`` of an older trtdeploy is kept under a stamped
    name)."""
    link = logs_dir / LOG_NAME
    try:
        logs_dir.mkdir(parents=True, exist_ok=True)
        if link.exists() and not link.is_symlink():
            os.replace(link, _unique_log(logs_dir, time.localtime(link.stat().st_mtime)))
        log = _unique_log(logs_dir, time.localtime())
        scratch = logs_dir / f".{LOG_NAME}-{uuid.uuid4().hex}"
        scratch.symlink_to(log.name)
        os.replace(scratch, link)
    except OSError as exc:
        raise ServerError(f"cannot write the server log in {logs_dir}: {exc.strerror or exc}") from None
    return log


def _unique_log(folder: Path, when: time.struct_time) -> Path:
    """Create ``tritonserver-<stamp>.log`` in ``folder``, or ``-2``, ``-3`` ... if taken (two starts in a second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", when)
    count = 1
    while True:
        path = folder / (f"tritonserver-{stamp}.log" if count == 1 else f"tritonserver-{stamp}-{count}.log")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            count += 1
            continue
        return path


def startup_notes(server: RunningServer) -> list[str]:
    """Lines for whoever started ``server``: which tritonserver runs, and why it is not on Triton's default ports."""
    binary = f"tritonserver {server.version or '(version unknown)'}: {server.binary.path}"
    if server.binary.bundled:
        release = ".".join(server.version.split(".")[:2]) if server.version else "of unknown version"
        binary += f" (bundled Triton {release}: for development and benchmarks; production runs the NGC image's current"
        binary += " Triton)"
    notes = [binary]
    if server.default_ports_taken:
        holders = [
            info
            for info in running_servers()
            if info.pid != server.pid and set(DEFAULT_PORTS) & {info.http_port, info.grpc_port, info.metrics_port}
        ]
        by = f" by the trtdeploy server{'s' * (len(holders) > 1)} {listing(holders)}" if holders else ""
        notes.append(
            f"Triton's default ports {DEFAULT_PORTS[0]}-{DEFAULT_PORTS[2]} are taken{by}: this server uses HTTP "
            f"{server.http_port}, gRPC {server.grpc_port}, metrics {server.metrics_port}"
        )
    return notes


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Within this block SIGTERM and SIGHUP act as Ctrl-C does, so cleanup runs for all three: they go to the SIGINT
    handler of the moment (inside ``asyncio.run``, the one that cancels the main task, so the interrupt lands at an
    await, not anywhere), or raise KeyboardInterrupt where SIGINT is ignored.

    The server runs in a session of its own and gets none of these signals itself: whoever holds it must stop it.
    Only the main thread can own signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        on_ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(on_ctrl_c):
            raise KeyboardInterrupt
        on_ctrl_c(signal.SIGINT, frame)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_foreground(server: RunningServer, announce: Callable[[], None] | None = None) -> str:
    """Call ``announce`` (printing the endpoints, say), then block while the server runs; a line saying how it ended.

    Ctrl-C (or SIGTERM/SIGHUP under :func:`stop_signals_as_interrupt`), during ``announce`` too, stops the whole
    process group; a server stopped by ``trtdeploy stop`` (its state file gone) ends quietly too. A server that dies
    on its own raises ServerError with the log's error lines (or its tail).
    """
    try:
        if announce is not None:
            announce()
        code = server.wait()
    except KeyboardInterrupt:
        server.stop()
        return "tritonserver stopped"
    stopped_elsewhere = server.state_file is not None and not server.state_file.exists()
    server.stop()
    if stopped_elsewhere:
        return "tritonserver was stopped by `trtdeploy stop`"
    raise ServerError(
        f"tritonserver exited on its own with status {code}",
        hint=f"full log: {server.log_file}",
        details=server.log_report(),
    )
