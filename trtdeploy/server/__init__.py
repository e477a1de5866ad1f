"""Finding, starting, health-checking and stopping tritonserver.

:func:`launch` starts a server on any model repository (on 127.0.0.1 and Triton's default ports unless told
otherwise, its shared-memory, model-repository, logging and trace APIs restricted); :func:`serve_deployment` serves a
deployment folder and records it, where :func:`servers_of`, :func:`choose_server` and :func:`current_server`
(``perf``) and :func:`servers_to_stop` (``stop``) find it.
"""

from ._binary import TritonBinary, cache_dir, check_numpy, find_tritonserver, resolve_tritonserver
from ._process import (
    DEFAULT_HOST,
    DEFAULT_PORTS,
    RESTRICTABLE_APIS,
    PortInUseError,
    RunningServer,
    ephemeral_ports,
    launch,
)
from ._serve import new_log_file, serve_deployment, startup_notes, stop_signals_as_interrupt, wait_foreground
from ._state import (
    ServerCleanupWarning,
    ServerInfo,
    choose_server,
    current_server,
    listing,
    register,
    resolved_path,
    running_servers,
    servers_of,
    servers_to_stop,
    servers_under,
    state_dir,
    stop_server,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORTS",
    "RESTRICTABLE_APIS",
    "PortInUseError",
    "RunningServer",
    "ServerCleanupWarning",
    "ServerInfo",
    "TritonBinary",
    "cache_dir",
    "check_numpy",
    "choose_server",
    "current_server",
    "ephemeral_ports",
    "find_tritonserver",
    "launch",
    "listing",
    "new_log_file",
    "register",
    "resolve_tritonserver",
    "resolved_path",
    "running_servers",
    "serve_deployment",
    "servers_of",
    "servers_to_stop",
    "servers_under",
    "startup_notes",
    "state_dir",
    "stop_server",
    "stop_signals_as_interrupt",
    "wait_foreground",
]
