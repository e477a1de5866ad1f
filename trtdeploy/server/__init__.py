"""Finding, starting, health-checking and stopping tritonserver.

:func:`launch` starts a server on any model repository; :func:`serve_deployment` serves a deployment folder and
records it in a state file, where :func:`current_server` (``perf``) and :func:`stop_servers` (``stop``) find it.
"""

from ._binary import TritonBinary, cache_dir, check_numpy, find_tritonserver, resolve_tritonserver
from ._process import PortInUseError, RunningServer, launch
from ._serve import serve_deployment, stop_signals_as_interrupt, wait_foreground
from ._state import ServerInfo, current_server, register, running_servers, state_dir, stop_servers

__all__ = [
    "PortInUseError",
    "RunningServer",
    "ServerInfo",
    "TritonBinary",
    "cache_dir",
    "check_numpy",
    "current_server",
    "find_tritonserver",
    "launch",
    "register",
    "resolve_tritonserver",
    "running_servers",
    "serve_deployment",
    "state_dir",
    "stop_servers",
    "stop_signals_as_interrupt",
    "wait_foreground",
]
