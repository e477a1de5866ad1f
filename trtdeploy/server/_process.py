"""Starting tritonserver as a process group, waiting until it is ready, and stopping every process of it."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

from ..errors import ServerError, UsageError
from ._binary import TritonBinary, resolve_tritonserver

#: Seconds between readiness polls.
POLL_INTERVAL = 0.2
#: Seconds tritonserver gives in-flight requests and open connections after SIGTERM (its default, 30, makes every
#: stop with a connected client take 30 s).
EXIT_TIMEOUT = 10
#: Starts tried when a port picked for us is taken before the server binds it.
PORT_ATTEMPTS = 3
#: Triton's own HTTP, gRPC and metrics ports, which every official client assumes.
DEFAULT_PORTS = (8000, 8001, 8002)
#: Where a server listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
#: The APIs only callers sending the server's header may use, unless opened (``allow_api``): shared memory is how
#: python-backend exploits reach the server; the others change what it loads, logs and traces.
RESTRICTABLE_APIS = ("shared-memory", "model-repository", "logging", "trace")
#: Seconds leftover processes of a dead server get between SIGTERM and SIGKILL (python-backend stubs ignore SIGTERM).
LEFTOVER_GRACE = 2.0
_LOAD_FAILURE = re.compile(r"failed to load '([^']+)'")
#: A glog line of severity E (error) or F (fatal), as Triton writes them: ``E1127 13:23:46.505596 18411 file.cc:642]
#: "message"`` (2.51 quotes and escapes the message; older releases do not).
_GLOG_ERROR = re.compile(r"^[EF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]*\] ?(.*)$")
#: Other lines that say what failed: TensorRT-LLM's errors, and tritonserver's last word before it exits.
_OTHER_ERROR = re.compile(r"\[TensorRT-LLM\]\[ERROR\]|^error: ")
#: Error lines Triton writes on every start on a machine without a GPU driver: never the cause.
_HARMLESS_ERRORS = ("CudaDriverHelper has not been initialized",)
#: Error lines a failure's details show at most (the first ones: later ones tend to follow from them).
MAX_ERROR_LINES = 20
#: Bytes of a run's log searched for its errors (its end, for a server that ran long).
ERROR_SEARCH_BYTES = 8 << 20
_PORT_TAKEN = re.compile(r"failed to start (\w+) service: .*Socket '[^']*:(\d+)' already in use")
_SERVICE_LABELS = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}
_PORT_HINT = "pass other ports (--http-port/--grpc-port/--metrics-port), or stop the server using it (`trtdeploy stop`)"


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (index 0 is the state), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Whether ``pid`` runs (zombies do not count); with ``start_ticks``, also that it is the same process."""
    fields = _proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid from the original)."""
    fields = _proc_stat(pid)
    return None if fields is None else int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_group(pgid: int, timeout: float = 30.0, *, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM every process of the group, wait up to ``timeout`` s for all of them to exit, then SIGKILL.

    ``leader`` is reaped when it is our child, so it does not linger as a zombie. A Ctrl-C while waiting kills the
    group at once.
    """
    try:
        _terminate_group(pgid, timeout, leader)
    except KeyboardInterrupt:
        _signal_group(pgid, signal.SIGKILL)
        raise


def _escalate(send: Callable[[signal.Signals], None], alive: Callable[[], bool], grace: float) -> None:
    """``send`` SIGTERM (and SIGCONT: a stopped, frozen process acts on SIGTERM only once it runs again), wait up to
    ``grace`` s for nothing to be ``alive``, then SIGKILL and wait up to 5 s more."""
    for signals, wait in (((signal.SIGTERM, signal.SIGCONT), grace), ((signal.SIGKILL,), 5.0)):
        for sig in signals:
            send(sig)
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive():
            return


def _terminate_group(pgid: int, timeout: float, leader: subprocess.Popen | None) -> None:
    def alive() -> bool:
        if leader is not None:
            leader.poll()  # reap it, or it lingers in the group as a zombie
        return bool(group_members(pgid))

    _escalate(lambda sig: _signal_group(pgid, sig), alive, timeout)
    if leader is not None:
        try:
            leader.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass


def process_cmdline(pid: int) -> str:
    """The process's arguments joined by spaces ("" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def leftover_processes(pgid: int, marks: Sequence[str]) -> dict[int, int]:
    """Live processes of group ``pgid`` whose command line holds one of ``marks``: pid -> start ticks.

    A dead server's group id may be reused by an unrelated group: only a process naming the server's shm prefix or
    model repository (a python-backend stub's arguments hold both) counts as the server's.
    """
    found = {}
    for pid in group_members(pgid):
        ticks = process_start_ticks(pid)
        if ticks is not None and any(mark in process_cmdline(pid) for mark in marks if mark):
            found[pid] = ticks
    return found


def kill_processes(processes: Mapping[int, int], grace: float = LEFTOVER_GRACE) -> None:
    """SIGTERM each process (pid -> start ticks), SIGKILL those still there after ``grace`` s; wait until gone."""

    def alive() -> list[int]:
        return [pid for pid, ticks in processes.items() if process_alive(pid, ticks)]

    def send(sig: signal.Signals) -> None:
        for pid in alive():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    _escalate(send, lambda: bool(alive()), grace)


def remove_shm_regions(prefix: str) -> int:
    """Remove the python-backend shared-memory regions named ``prefix...`` from /dev/shm; how many were removed."""
    shm = Path("/dev/shm")
    removed = 0
    if prefix and shm.is_dir():
        for region in shm.glob(f"{prefix}*"):
            try:
                region.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def client_host(bind_address: str) -> str:
    """The host a client on this machine uses for a server listening on ``bind_address``.

    127.0.0.1 for the loopback and wildcard addresses (never "localhost", which may resolve to ::1 first, where the
    server does not listen); an IPv6 address in brackets.
    """
    if bind_address in ("127.0.0.1", "0.0.0.0", "localhost", ""):
        return "127.0.0.1"
    if bind_address in ("::", "::1"):
        return "[::1]"
    return f"[{bind_address}]" if ":" in bind_address else bind_address


def ephemeral_ports(count: int = 3) -> list[int]:
    """``count`` distinct ports the system picks as free now, away from Triton's defaults: for servers that must not
    take 8000-8002 from the ones a user (or a test about them) starts."""
    chosen: list[int] = []
    while len(chosen) < count:
        with socket.socket() as sock:
            sock.bind((DEFAULT_HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in chosen:
            chosen.append(port)
    return chosen


def port_in_use(port: int, host: str = DEFAULT_HOST) -> bool:
    """Whether binding ``port`` on ``host`` fails (something listens there); UsageError if ``host`` is no address
    of this machine."""
    hint = "pass an address of this machine to --host (127.0.0.1, the default, or 0.0.0.0 for all)"
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on {host}: {exc.strerror}", hint=hint) from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a socket in TIME_WAIT is no obstacle
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UsageError(f"cannot listen on {host}: it is no address of this machine", hint=hint) from None
            raise
    return False


def _choose_ports(
    http: int | None, grpc: int | None, metrics: int | None, host: str
) -> tuple[tuple[int, int, int], bool]:
    """The (HTTP, gRPC, metrics) ports, and whether Triton's defaults were taken.

    Given ports must be free. The others are Triton's defaults (8000, 8001, 8002) if free, else the first free
    triple above them, in steps of 3 (8003-8005, ...).
    """
    given = [http, grpc, metrics]
    for index, (port, label) in enumerate(zip(given, ("HTTP", "gRPC", "metrics"), strict=True)):
        if port is None:
            continue
        if port in given[:index]:
            raise UsageError(f"port {port} is given twice", hint="give HTTP, gRPC and metrics different ports")
        if port_in_use(port, host):
            raise PortInUseError(port, label)
    for base in range(DEFAULT_PORTS[0], 65536 - 2, 3):
        picked = [port if port is not None else base + offset for offset, port in enumerate(given)]
        candidates = [p for p, port in zip(picked, given, strict=True) if port is None]
        if all(p not in given and not port_in_use(p, host) for p in candidates):
            return (picked[0], picked[1], picked[2]), base != DEFAULT_PORTS[0] and bool(candidates)
    raise ServerError(f"no free ports on {host} above {DEFAULT_PORTS[0]}", hint=_PORT_HINT)


def restricted_headers(key: tuple[str, str] | None, protocol: Literal["grpc", "http"]) -> dict[str, str]:
    """The headers a request to a server's restricted APIs carries (none when nothing is restricted): its
    ``(key, value)``, the key with Triton's ``triton-grpc-protocol-`` prefix for gRPC. Pass them as tritonclient's
    ``headers``."""
    if key is None:
        return {}
    name, value = key
    return {f"triton-grpc-protocol-{name}" if protocol == "grpc" else name: value}


def restriction_key() -> tuple[str, str]:
    """A fresh (header, value) pair that callers of a server's restricted APIs must send."""
    return f"trtdeploy-{secrets.token_hex(4)}", secrets.token_hex(16)


def check_allow_api(names: Sequence[str]) -> tuple[str, ...]:
    """The APIs that stay restricted when ``names`` (from RESTRICTABLE_APIS, or "all") are opened."""
    unknown = [name for name in names if name not in (*RESTRICTABLE_APIS, "all")]
    if unknown:
        raise UsageError(
            f"--allow-api: unknown API {', '.join(map(repr, unknown))}",
            hint=f"pick from {', '.join(RESTRICTABLE_APIS)}, or all",
        )
    return () if "all" in names else tuple(api for api in RESTRICTABLE_APIS if api not in names)


def repo_models(model_repo: Path) -> list[str]:
    """Every model folder of a Triton model repository (what the server loads at startup)."""
    return sorted(p.name for p in model_repo.iterdir() if p.is_dir() and not p.name.startswith("."))


def _read_end(path: Path, start: int, size: int) -> str:
    """The last ``size`` bytes of a (log) file after byte ``start``, or "" if it cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(start, fh.tell() - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_tail(path: Path, lines: int = 40, start: int = 0) -> str:
    """The last ``lines`` lines of a (log) file after byte ``start``, or "" if it cannot be read."""
    return "\n".join(_read_end(path, start, 64 * 1024).splitlines()[-lines:])


def error_lines(text: str) -> list[str]:
    """What a server log says went wrong, one line each, in the order written, without repeats: Triton's error lines
    (a python model's traceback in one cut to the exception and its innermost frame), TensorRT-LLM's errors,
    tritonserver's ``error:`` line, and the exception of each Python traceback printed (by a python model, or a
    process it started) with its innermost frame."""
    found: dict[str, None] = {}
    frame: str | None = None  # inside a traceback: its innermost frame so far ("" before the first)
    for line in text.splitlines():
        glog = _GLOG_ERROR.match(line)
        if glog:
            message = _short_error(_unquote(glog.group(1)))
            if not any(harmless in message for harmless in _HARMLESS_ERRORS):
                found[message] = None
        elif line.startswith("Traceback (most recent call last):"):
            frame = ""
        elif frame is not None and line.startswith(" "):
            if line.lstrip().startswith("File "):
                frame = line.strip()
        elif frame is not None:  # the first line after the frames: the exception
            found[f"{line.strip()} ({frame})" if frame else line.strip()] = None
            frame = None
        elif _OTHER_ERROR.search(line):
            found[line.strip()] = None
    return list(found)


def _unquote(message: str) -> str:
    """The text of a glog message Triton 2.51 wrote in quotes (newlines escaped); any other message as it is."""
    if len(message) < 2 or not (message.startswith('"') and message.endswith('"')):
        return message
    try:
        return str(json.loads(message))
    except ValueError:
        return message[1:-1].replace("\\n", "\n").replace('\\"', '"')


def _short_error(message: str) -> str:
    """One line of a Triton error: its first line, and where a python model raised it (the innermost frame of the
    ``At:`` list the python backend appends)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    if "At:" in lines[1:-1]:
        return f"{lines[0]} (at {lines[lines.index('At:') + 1]})"
    return lines[0]


class PortInUseError(ServerError):
    """tritonserver could not bind one of its ports (taken between the free-port check and the server's start)."""

    def __init__(self, port: int, label: str) -> None:
        super().__init__(f"port {port} ({label}) is in use", hint=_PORT_HINT)
        self.port = port


class LogScanner:
    """Reads a growing server log incrementally for model load failures and port-bind failures."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        #: model -> its "failed to load" line, in the order seen
        self.load_failures: dict[str, str] = {}
        #: (port, "HTTP" | "gRPC" | "metrics") that the server failed to bind
        self.port_taken: tuple[int, str] | None = None

    def scan(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a partial last line is read again next time
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            match = _LOAD_FAILURE.search(line)
            if match and match.group(1) not in self.load_failures:
                self.load_failures[match.group(1)] = line.strip()
            taken = _PORT_TAKEN.search(line)
            if taken and self.port_taken is None:
                self.port_taken = (int(taken.group(2)), _SERVICE_LABELS.get(taken.group(1).lower(), taken.group(1)))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _server_version(url: str) -> str | None:
    """The ``version`` of the server metadata at ``url`` (None if it does not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return str(json.load(response)["version"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None


class RunningServer:
    """A tritonserver started by :func:`launch`, in its own process group. A context manager that stops it."""

    def __init__(
        self,
        process: subprocess.Popen,
        *,
        binary: TritonBinary,
        host: str = DEFAULT_HOST,
        http_port: int,
        grpc_port: int,
        metrics_port: int,
        log_file: Path,
        log_offset: int = 0,
        model_repo: Path,
        models: list[str],
        shm_prefix: str,
        restricted_apis: Sequence[str] = (),
        restricted_key: tuple[str, str] | None = None,
        default_ports_taken: bool = False,
    ) -> None:
        self.process = process
        self.pid = process.pid
        #: The group every process of the server (python backend stubs included) belongs to.
        self.pgid = process.pid
        self.binary = binary
        #: The address it listens on.
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.metrics_port = metrics_port
        self.log_file = log_file
        #: Where this run starts in the log (several runs may append to one file).
        self.log_offset = log_offset
        self.model_repo = model_repo
        self.models = models
        self.shm_prefix = shm_prefix
        #: The APIs that answer only requests carrying ``restricted_key`` (header, value).
        self.restricted_apis = tuple(restricted_apis)
        self.restricted_key = restricted_key
        #: Triton's default ports were taken, so it listens on others.
        self.default_ports_taken = default_ports_taken
        #: The server's version, from its metadata once ready.
        self.version: str | None = None
        #: A state file (see :mod:`trtdeploy.server`) removed by :meth:`stop`.
        self.state_file: Path | None = None
        self._stopped = False

    @property
    def client_host(self) -> str:
        """The host clients on this machine connect to (see :func:`client_host`)."""
        return client_host(self.host)

    def restricted_headers(self, protocol: Literal["grpc", "http"]) -> dict[str, str]:
        """The headers that open this server's restricted APIs (see :func:`restricted_headers`)."""
        return restricted_headers(self.restricted_key, protocol)

    @property
    def http_url(self) -> str:
        """``HOST:PORT``, the form tritonclient.http takes."""
        return f"{self.client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``HOST:PORT``, the form tritonclient.grpc takes."""
        return f"{self.client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The full Prometheus metrics URL (``http://HOST:PORT/metrics``)."""
        return f"http://{self.client_host}:{self.metrics_port}/metrics"

    def poll(self) -> int | None:
        """The server's exit status, or None while it runs."""
        return self.process.poll()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines this run wrote to the log."""
        return read_tail(self.log_file, lines, self.log_offset)

    def log_errors(self) -> list[str]:
        """The error lines this run wrote to the log (see :func:`error_lines`)."""
        return error_lines(_read_end(self.log_file, self.log_offset, ERROR_SEARCH_BYTES))

    def log_report(self) -> str | None:
        """What this run's log says went wrong, for a failure's details: its error lines (the first
        :data:`MAX_ERROR_LINES`), or its last lines where it has none; None for an empty or unreadable log."""
        errors = self.log_errors()
        if errors:
            more = len(errors) - MAX_ERROR_LINES
            shown = errors[:MAX_ERROR_LINES] + ([f"... and {more} more error lines"] if more > 0 else [])
            return f"--- error lines of {self.log_file} ---\n" + "\n".join(shown)
        tail = self.log_tail()
        return f"--- last lines of {self.log_file} ---\n{tail}" if tail else None

    def is_ready(self, models: Sequence[str] | None = None) -> bool:
        """Whether the server and each of ``models`` (default: the models it waits for) answer ready."""
        base = f"http://{self.http_url}"
        if not _http_ok(f"{base}/v2/health/ready"):
            return False
        names = self.models if models is None else models
        return all(_http_ok(f"{base}/v2/models/{quote(name)}/ready") for name in names)

    def wait_ready(self, timeout: float) -> None:
        """Poll until ready; on exit, a failed model load or timeout stop everything and raise ServerError."""
        deadline = time.monotonic() + timeout
        log = LogScanner(self.log_file, self.log_offset)
        while True:
            code = self.poll()
            log.scan()
            if log.load_failures:
                self._fail(_load_failure_error(log.load_failures))
            if code is not None:
                if log.port_taken:
                    self._fail(PortInUseError(*log.port_taken))
                cause = next(iter(self.log_errors()), None)
                message = f"tritonserver exited with status {code} while starting"
                self._fail(ServerError(f"{message}: {cause}" if cause else message, hint=f"full log: {self.log_file}"))
            if self.is_ready():
                self.version = _server_version(f"http://{self.http_url}/v2")
                return
            if time.monotonic() > deadline:
                base = f"http://{self.http_url}"
                waiting = [m for m in self.models if not _http_ok(f"{base}/v2/models/{quote(m)}/ready")]
                what = f"models {', '.join(waiting)} not" if waiting else "server not"
                message = f"tritonserver not ready after {timeout:g} s ({what} ready)"
                self._fail(ServerError(message, hint="a slow model may need a longer --timeout"))
            time.sleep(POLL_INTERVAL)

    def _fail(self, error: ServerError) -> None:
        """Stop everything, then raise ``error`` with what the log says went wrong as its details."""
        self.stop()
        error.details = self.log_report()
        raise error

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the server process to exit; its exit status."""
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after ``timeout`` s; safe to call again."""
        if self._stopped:
            return
        terminate_group(self.pgid, timeout, leader=self.process)
        remove_shm_regions(self.shm_prefix)
        if self.state_file is not None:
            self.state_file.unlink(missing_ok=True)
        self._stopped = True

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RunningServer(pid={self.pid}, http={self.http_url}, grpc={self.grpc_url}, log={self.log_file})"


def _load_failure_error(failures: dict[str, str]) -> ServerError:
    """One line naming the models that failed and the first one's error, e.g. "Internal: RuntimeError: boom"."""
    names = ", ".join(repr(m) for m in failures)
    line = next(iter(failures.values()))
    reason = _LOAD_FAILURE.split(line, maxsplit=1)[-1]
    reason = re.sub(r"^ version \d+: ", "", reason.split("\\n", 1)[0]).strip().rstrip('"').strip()
    return ServerError(
        f"model {names} failed to load: {reason or line}",
        hint="fix the model (where it failed is in the log's error lines above), then start again",
    )


def launch(
    model_repo: Path,
    *,
    http_port: int | None = None,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    host: str = DEFAULT_HOST,
    allow_api: Sequence[str] = (),
    tritonserver: Path | None = None,
    log_file: Path | None = None,
    timeout: float = 180.0,
    models: list[str] | None = None,
    extra_args: Sequence[str] = (),
    world_size: int = 1,
    llm_models: Sequence[str] = ("tensorrt_llm",),
    env: Mapping[str, str] | None = None,
    orchestrator_gpus: Sequence[int] = (),
) -> RunningServer:
    """Start tritonserver on ``model_repo`` and wait until it and every model in ``models`` are ready.

    It listens on ``host`` only (default: 127.0.0.1, this machine), on Triton's default ports if free, else on the
    next free triple (see :func:`_choose_ports`); given ports must be free. The shared-memory, model-repository,
    logging and trace APIs answer only requests carrying the server's own header (``restricted_key``), except those
    named in ``allow_api`` ("all" opens them all). ``models`` defaults to every model folder of the repository. With
    ``world_size`` > 1 the server runs as that many MPI ranks, with ``orchestrator_gpus`` as the one MPI rank of
    TRT-LLM's orchestrator mode (see :func:`server_command`). On any failure (port in
    use, server exit, a model failing to load, timeout, Ctrl-C) every process started is stopped and
    :class:`~trtdeploy.errors.ServerError` is raised with the log's error lines (or its tail) in ``details`` (Ctrl-C
    re-raises).
    """
    model_repo = Path(model_repo).expanduser().absolute()
    if not model_repo.is_dir():
        raise ServerError(f"model repository {model_repo} does not exist")
    restricted = check_allow_api(allow_api)
    if host == "localhost":  # tritonserver may bind it on ::1 alone, where a client of 127.0.0.1 finds nothing
        host = DEFAULT_HOST
    binary = resolve_tritonserver(tritonserver)
    mpirun = _find_mpirun(world_size, orchestrated=bool(orchestrator_gpus))
    models = repo_models(model_repo) if models is None else list(models)
    if log_file is None:
        fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
        os.close(fd)
        log_file = Path(name)
    log_file = Path(log_file).expanduser().absolute()
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.touch()
    except OSError as exc:
        raise ServerError(f"cannot write the server log {log_file}: {exc.strerror or exc}") from None
    key = restriction_key() if restricted else None
    explicit = {p for p in (http_port, grpc_port, metrics_port) if p is not None}
    attempt = 0
    while True:
        attempt += 1
        ports, default_ports_taken = _choose_ports(http_port, grpc_port, metrics_port, host)
        shm_prefix = f"trtdeploy-{uuid.uuid4().hex[:12]}-"
        command = server_command(
            binary,
            model_repo,
            ports,
            shm_prefix,
            extra_args,
            host=host,
            restricted_apis=restricted,
            restricted_key=key,
            world_size=world_size,
            llm_models=llm_models,
            orchestrator_gpus=orchestrator_gpus,
        )
        if mpirun is not None:
            command = [mpirun, *command]
        process, log_offset = _start(command, binary, log_file, env or {}, secret=key[1] if key else None)
        server = RunningServer(
            process,
            binary=binary,
            host=host,
            http_port=ports[0],
            grpc_port=ports[1],
            metrics_port=ports[2],
            log_file=log_file,
            log_offset=log_offset,
            model_repo=model_repo,
            models=models,
            shm_prefix=shm_prefix,
            restricted_apis=restricted,
            restricted_key=key,
            default_ports_taken=default_ports_taken,
        )
        try:
            server.wait_ready(timeout)
        except PortInUseError as exc:
            if exc.port in explicit or attempt == PORT_ATTEMPTS:
                raise
            continue  # a port picked for us was taken meanwhile: pick again
        except BaseException:
            server.stop()
            raise
        return server


def _find_mpirun(world_size: int, *, orchestrated: bool = False) -> str | None:
    """mpirun for a multi-rank or orchestrated server (None for one plain rank); ServerError when it is missing."""
    if world_size <= 1 and not orchestrated:
        return None
    found = shutil.which("mpirun")
    if found is None:
        what = f"world size {world_size}" if world_size > 1 else "several TRT-LLM instances (orchestrator mode)"
        raise ServerError(
            f"serving a deployment of {what} needs mpirun, and none is on PATH",
            hint="serve inside the NGC -trtllm-python-py3 image (it has Open MPI), or install Open MPI",
        )
    return found


def server_command(
    binary: TritonBinary,
    model_repo: Path,
    ports: tuple[int, int, int],
    shm_prefix: str,
    extra_args: Sequence[str] = (),
    *,
    host: str = DEFAULT_HOST,
    restricted_apis: Sequence[str] = (),
    restricted_key: tuple[str, str] | None = None,
    world_size: int = 1,
    llm_models: Sequence[str] = ("tensorrt_llm",),
    orchestrator_gpus: Sequence[int] = (),
    mpi_options: Sequence[str] = (),
) -> list[str]:
    """The tritonserver command line; for ``world_size`` > 1 or ``orchestrator_gpus``, mpirun's arguments (without
    ``mpirun`` itself), ``mpi_options`` (where the ranks run, say) before the ranks.

    Several ranks follow TRT-LLM's launch_triton_server.py: rank 0 serves the whole repository on the ports (and
    alone has endpoints to bind and restrict); every other rank loads only the TRT-LLM model(s) in explicit mode,
    with its endpoints off (its model never finishes initialising: it works for rank 0's engine), and each rank has
    a python-backend shm prefix of its own. Orchestrator mode (``--multi-model``, several instances of a TRT-LLM
    model whose backend spawns their workers through MPI) is one rank under mpirun with no pinned memory pool, no
    peer access and a zero CUDA memory pool on each of ``orchestrator_gpus``, as that script runs Triton newer than
    24.06: the spawned workers, not the server, use the GPUs.
    """
    if orchestrator_gpus and world_size > 1:
        raise UsageError("orchestrator mode runs one tritonserver rank: its workers are spawned, not launched")
    http_port, grpc_port, metrics_port = ports
    endpoints = [
        f"--http-address={host}",
        f"--grpc-address={host}",
        f"--metrics-address={host}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
    ]
    if restricted_apis and restricted_key is not None:
        # tritonserver 2.51 parses "<apis>:<key>=<value>" (its --help shows a comma before the key, which fails);
        # gRPC callers send the key as "triton-grpc-protocol-<key>"
        rule = f"{','.join(restricted_apis)}:{restricted_key[0]}={restricted_key[1]}"
        endpoints += [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]

    orchestrator = (  # the server leaves the GPUs to the spawned workers
        [
            "--pinned-memory-pool-byte-size=0",
            "--enable-peer-access=false",
            *(f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in orchestrator_gpus),
        ]
        if orchestrator_gpus
        else []
    )

    def rank_args(rank: int) -> list[str]:
        prefix = f"{shm_prefix}rank{rank}_" if world_size > 1 else shm_prefix
        head = [str(binary.path), f"--model-repository={model_repo}"]
        tail = [
            f"--backend-config=python,shm-region-prefix-name={prefix}",
            "--disable-auto-complete-config",
            f"--exit-timeout-secs={EXIT_TIMEOUT}",
            *binary.args,
        ]
        if rank == 0:
            checks = ["--strict-readiness=true", "--exit-on-error=true"]
            return [*head, *endpoints, *checks, *orchestrator, *tail, *extra_args]
        loads = [f"--load-model={name}" for name in llm_models]
        quiet = ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
        return [*head, "--model-control-mode=explicit", *loads, *quiet, *tail]

    if world_size <= 1 and not orchestrator_gpus:
        return rank_args(0)
    command = ["--allow-run-as-root", *mpi_options]
    for rank in range(world_size):
        command += ["-n", "1", *rank_args(rank), ":"]
    return command[:-1]


def _start(
    command: list[str], binary: TritonBinary, log_file: Path, env: Mapping[str, str], *, secret: str | None
) -> tuple[subprocess.Popen, int]:
    """The server process, and where its run starts in the log (whose first line is the command, ``secret``
    masked)."""
    shown = " ".join(command)
    if secret:
        shown = shown.replace(secret, "***")
    with open(log_file, "ab") as log:  # appending: a second server on the same log never punches holes in it
        log_offset = log.tell()
        log.write(f"$ {shown}\n".encode())
        log.flush()
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **binary.env, **env},
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerError(f"cannot start {binary.path}: {exc.strerror or exc}") from None
    return process, log_offset
