"""Helpers for the server tests: tiny python-backend models, hand-written deployment folders, process checks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from trtdeploy.server import ephemeral_ports
from trtdeploy.server._process import _proc_stat, process_cmdline

from ..conftest import interruptible
from ..manifests import write_manifest

ECHO_MODEL = """
import ssl  # an extension module of the serving interpreter: its own libpython must be the one loaded

import tritonclient  # installed only in the serving environment: the stub must see its site-packages
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", data * 2)]))
        return responses
"""

BROKEN_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights are missing")

    def execute(self, requests):
        return []
"""

SLOW_MODEL = """
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(60)

    def execute(self, requests):
        return []
"""

TRACEBACK_MODEL = """
import json
import traceback


class TritonPythonModel:
    def initialize(self, args):
        try:
            json.loads("{truncated")
        except ValueError:
            traceback.print_exc()  # as a library reports what it caught, before the model fails in its own words
        raise RuntimeError("no weights index")

    def execute(self, requests):
        return []
"""

MODELS = {"echo": ECHO_MODEL, "broken": BROKEN_MODEL, "slow": SLOW_MODEL, "noisy": TRACEBACK_MODEL}


def off_default_ports() -> dict[str, int]:
    """launch() keywords that keep a long-lived test server off Triton's default ports (a test checks those)."""
    http, grpc, metrics = ephemeral_ports()
    return {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}


def write_model(repo: Path, name: str, source: str) -> None:
    """A python-backend model ``name`` with one FP32 input INPUT and one output OUTPUT."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]
        """)
    )
    (repo / name / "1" / "model.py").write_text(source)


def write_repo(repo: Path, *models: str) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    for name in models:
        write_model(repo, name, MODELS[name])
    return repo


def write_deployment(path: Path, *models: str, status: str = "complete", tp: int = 1) -> Path:
    """A deployment folder as ``trtdeploy build`` leaves it: manifest.json plus model_repo/."""
    write_repo(path / "model_repo", *models)
    return write_manifest(
        path, models=list(models), entry_model=models[0], model="echo_model", status=status, tp=tp, max_batch_size=1
    )


def listen_addresses(port: int) -> set[str]:
    """The addresses something listens on at TCP ``port``, from the socket tables (IPv4-mapped IPv6 as IPv4)."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, port_hex = local.rpartition(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                words = [bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8)]
                found.add(socket.inet_ntop(family, b"".join(words)).removeprefix("::ffff:"))
    return found


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def live_processes() -> dict[int, list[str]]:
    """Every live (non-zombie) process: pid -> its /proc stat fields after the name."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            if fields is not None and fields[0] not in ("Z", "X"):
                found[int(entry)] = fields
    return found


def leftovers(*, pgid: int | None = None, mentioning: Path | None = None) -> list[str]:
    """Live processes in process group ``pgid``, children of it, or whose command line mentions ``mentioning``."""
    left = []
    for pid, fields in live_processes().items():
        cmd = process_cmdline(pid)
        in_group = pgid is not None and (int(fields[2]) == pgid or int(fields[1]) == pgid or pid == pgid)
        if in_group or (mentioning is not None and str(mentioning) in cmd):
            left.append(f"{pid}: {cmd}")
    return left


def shm_regions(prefix: str) -> list[Path]:
    return list(Path("/dev/shm").glob(f"{prefix}*"))


def stubs_of(pid: int) -> list[int]:
    """Live python-backend stub processes whose parent is ``pid``."""
    return [
        p
        for p, fields in live_processes().items()
        if int(fields[1]) == pid and "triton_python_backend_stub" in process_cmdline(p)
    ]


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


CLI = [sys.executable, "-m", "trtdeploy"]


def run_cli(
    *args: str, timeout: float = 120.0, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env} if env else None
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env)


def start_cli(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, preexec_fn=interruptible
    )


def record_of(state_dir: Path, grpc_port: int) -> Path | None:
    """The record of the server on ``grpc_port``, if there is one."""
    return next(iter((state_dir / "servers").glob(f"{grpc_port}-*.json")), None)
