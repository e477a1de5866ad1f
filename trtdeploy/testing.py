"""pytest fixtures for trtdeploy and its plugins' test suites (installed as the ``pytest11`` plugin ``trtdeploy``).

They build real deployments from random-weight checkpoints in the real layout and serve them with the real
tritonserver, on the CPU and without the Hub::

    def test_my_model(trtdeploy_deploy, trtdeploy_serve):
        deployment = trtdeploy_deploy("my_model", mode="offline")
        server = trtdeploy_serve(deployment)   # started once per deployment, kept for later tests
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .deployment import Deployment
    from .engines.contract import SequenceOutput
    from .server import RunningServer


@pytest.fixture(scope="session")
def trtdeploy_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``checkpoint(model)``: a random-weight checkpoint written by the model's plugin (one per model and session)."""
    from .plugins import get_model

    made: dict[str, Path] = {}

    def checkpoint(model: str) -> Path:
        if model not in made:
            dest = tmp_path_factory.mktemp(f"{model}-checkpoint") / "random"
            get_model(model).write_random_checkpoint(dest)
            made[model] = dest
        return made[model]

    return checkpoint


@pytest.fixture(scope="session")
def trtdeploy_deploy(
    tmp_path_factory: pytest.TempPathFactory, trtdeploy_checkpoint: Callable[[str], Path]
) -> Callable[..., Deployment]:
    """``deploy(model, **build_options)``: a CPU deployment of the model's random checkpoint (cached per options)."""
    from .build import BuildRequest, run

    root = tmp_path_factory.mktemp("deployments")
    built: dict[tuple[Any, ...], Deployment] = {}

    def deploy(model: str, **options: Any) -> Deployment:
        key = (model, tuple(sorted((k, repr(v)) for k, v in options.items())))
        if key not in built:
            options.setdefault("gpu", "cpu")
            options.setdefault("max_batch_size", 4)
            # a folder per option set: points that differ only in what their names leave out (lengths) must not
            # rebuild each other's folder while a server runs on it
            output_root = root / str(len(built))
            request = BuildRequest(
                model=model, model_dir=trtdeploy_checkpoint(model), output_root=output_root, **options
            )
            built[key] = run(request).deployment
        return built[key]

    return deploy


class ServedDeployments:
    """``serve(deployment)``: the real tritonserver on that deployment, started once and kept for later tests.

    Every server holds its models' memory (a speech model's about a gigabyte on the CPU), so at most
    :attr:`keep` run at once besides those the current test module asked for: starting another stops the one asked
    for longest ago by an earlier module (started again if a later test asks for it). The rest stop with the session.
    """

    #: Servers kept running from earlier test modules.
    keep = 4

    def __init__(self) -> None:
        self._running: dict[Path, RunningServer] = {}
        self._asked: dict[Path, int] = {}  # deployment -> the module that last asked for it, oldest first
        self._module = 0

    def __call__(self, deployment: Deployment) -> RunningServer:
        from .server import ephemeral_ports, launch

        server = self._running.get(deployment.path)
        if server is None or server.poll() is not None:
            self._make_room()
            http, grpc, metrics = ephemeral_ports()  # Triton's 8000-8002 stay free for the user's own servers
            server = launch(
                deployment.model_repo,
                http_port=http,
                grpc_port=grpc,
                metrics_port=metrics,
                models=deployment.models,
                log_file=deployment.logs_dir / f"tritonserver-{os.getpid()}.log",
            )
            self._running[deployment.path] = server
        self._asked.pop(deployment.path, None)
        self._asked[deployment.path] = self._module
        return server

    def next_module(self) -> None:
        self._module += 1

    def _make_room(self) -> None:
        earlier = [path for path, module in self._asked.items() if module < self._module and path in self._running]
        while earlier and len(self._running) >= self.keep:
            self._running.pop(earlier.pop(0)).stop()

    def stop_all(self) -> None:
        for server in self._running.values():
            server.stop()
        self._running.clear()


@pytest.fixture(scope="session")
def trtdeploy_serve() -> Iterator[ServedDeployments]:
    """``serve(deployment)``: the real tritonserver on that deployment, started once and kept for later tests (at
    most :attr:`ServedDeployments.keep` from earlier test modules: see :class:`ServedDeployments`)."""
    served = ServedDeployments()
    yield served
    served.stop_all()


@pytest.fixture(scope="module", autouse=True)
def _trtdeploy_serve_module(trtdeploy_serve: ServedDeployments) -> None:
    """Tells :class:`ServedDeployments` that a test module starts."""
    trtdeploy_serve.next_module()


@pytest.fixture
def trtdeploy_triton_interpreter() -> Callable[..., None]:
    """``run(test_file, *pytest_args)``: run a test file again in a subprocess under Triton's interpreter
    (``TRITON_INTERPRET=1``, where Triton kernels run on CPU tensors), and fail with its output unless every test it
    selects passed. How a plugin's GPU kernels are tested on a machine without a GPU: the file's kernel tests run where
    the kernels compile or are interpreted, and skip elsewhere."""

    def run(test_file: str, *pytest_args: str) -> None:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, *pytest_args]
        done = subprocess.run(
            command, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600
        )
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0 or " passed" not in summary or "skipped" in summary:
            pytest.fail(f"under Triton's interpreter: {summary}\n{done.stdout[-4000:]}{done.stderr[-2000:]}")

    return run


class RecordingSink:
    """A generator's ``ResponseSink`` (:mod:`trtdeploy.engines.contract`) that keeps every call, and lets a test
    wait for the end of the request: for tests that drive an engine's generator directly."""

    def __init__(self, cancel_after: int | None = None):
        self.streamed: list[SequenceOutput] = []
        self.outputs: list[SequenceOutput] | None = None
        self.error: str | None = None
        self.cancelled_error = False
        self.finals = 0
        self.cancel_after = cancel_after
        self.done = threading.Event()

    def send_tokens(self, tokens: SequenceOutput) -> None:
        assert not self.done.is_set(), "tokens after the end of the request"
        self.streamed.append(tokens)

    def send_final(self, outputs: list[SequenceOutput] | None) -> None:
        assert not self.done.is_set(), "two final responses"
        self.outputs = outputs
        self.finals += 1
        self.done.set()

    def send_error(self, message: str, cancelled: bool = False) -> None:
        assert not self.done.is_set(), "an error after the end of the request"
        self.error = message
        self.cancelled_error = cancelled
        self.done.set()

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.streamed) >= self.cancel_after

    def wait(self, timeout: float = 60.0) -> RecordingSink:
        assert self.done.wait(timeout), "the request did not finish"
        return self

    @property
    def tokens(self) -> list[int]:
        """Everything this request produced (streamed tokens, or the first sequence's output)."""
        if self.outputs is not None:
            return self.outputs[0]
        return [token for chunk in self.streamed for token in chunk]
