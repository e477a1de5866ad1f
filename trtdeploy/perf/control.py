"""Triton's control plane, every call with a deadline: URL checks, liveness, model configuration and metadata,
statistics, Prometheus metrics, and one-line reasons for failed calls. The load and the ASR scoring share it.
(An OpenAI-compatible server's is :class:`~trtdeploy.perf.openai_api.OpenAIControl`.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, Literal, TypeVar

from ..errors import NotFoundError, ServerError, UsageError
from .workload import ModelInfo, TensorSpec

#: How the load reaches the server: Triton's gRPC or HTTP endpoint, or an OpenAI-compatible server's HTTP API.
Protocol = Literal["grpc", "http", "openai"]
#: Seconds any control call may take before it counts as failed.
CONTROL_TIMEOUT_S = 10.0
SERVE_HINT = "start one with `trtdeploy serve --background`, or pass --url HOST:PORT of a running Triton"
_T = TypeVar("_T")


async def within(call: Awaitable[_T], timeout_s: float) -> _T:
    """Await ``call`` for at most ``timeout_s`` seconds (then cancel it and raise ``asyncio.TimeoutError``).

    Unlike ``asyncio.wait_for`` before Python 3.12, a cancellation of the caller (Ctrl-C) is never lost when the call
    completes at the same moment.
    """
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise asyncio.TimeoutError
    return task.result()


def check_url(
    url: str,
    *,
    flag: str = "--url",
    schemes: tuple[str, ...] = ("grpc", "http", "https"),
    example: str = "e.g. --url localhost:8001 (gRPC), or --url localhost:8000 --protocol http",
) -> str:
    """``HOST:PORT`` of ``url`` (``SCHEME://HOST:PORT[/]`` is accepted too, for one of ``schemes``); UsageError
    naming the option ``flag`` if it is not one."""
    scheme, sep, rest = url.strip().partition("://")
    address = (rest if sep else scheme).rstrip("/")
    host, _, port = address.rpartition(":")
    if (sep and scheme not in schemes) or not host or "/" in address or not port.isdigit():
        raise UsageError(f"{flag} {url!r} is not HOST:PORT", hint=example)
    if not 0 < int(port) < 65536:
        raise UsageError(f"{flag} {url!r}: port {port} is not between 1 and 65535")
    return address


def short(exc: BaseException) -> str:
    """The first line of an exception's text (its type name when it has none)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def failure_reason(exc: BaseException) -> str:
    """One line saying why a call to Triton failed (the server's message, or a timeout)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, InferenceServerException):
        return short(Exception(exc.message()))
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time"
    return short(exc)


def _kserve_type(config_type: str) -> str:
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _tensor_specs(entries: list[dict[str, Any]]) -> dict[str, TensorSpec]:
    return {
        entry["name"]: TensorSpec(
            name=entry["name"],
            datatype=_kserve_type(entry.get("data_type", "")),
            dims=tuple(int(d) for d in entry.get("dims", [])),
            optional=bool(entry.get("optional", False)),
        )
        for entry in entries
    }


def model_info_from_config(config: dict[str, Any]) -> ModelInfo:
    """A :class:`ModelInfo` from a model configuration as JSON (gRPC or HTTP flavour)."""
    return ModelInfo(
        name=config["name"],
        inputs=_tensor_specs(config.get("input", [])),
        outputs=_tensor_specs(config.get("output", [])),
        max_batch_size=int(config.get("max_batch_size", 0)),
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
        parameters={key: str(value.get("string_value", "")) for key, value in config.get("parameters", {}).items()},
    )


class ControlClient:
    """Health, model configuration, metadata and statistics through tritonclient's aio client of ``protocol``.

    Every call gives up after ``timeout_s`` (raising ``asyncio.TimeoutError``), so no control call can hang a run.
    ``headers`` go with every call: the header that opens the restricted APIs of a server trtdeploy started.
    """

    def __init__(
        self,
        protocol: Protocol,
        url: str,
        *,
        timeout_s: float = CONTROL_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.protocol = protocol
        self.url = url
        self.timeout_s = timeout_s
        self.headers = dict(headers or {}) or None
        if protocol == "grpc":
            import tritonclient.grpc.aio as client_module
        else:
            import tritonclient.http.aio as client_module
        self._client = client_module.InferenceServerClient(url)
        self._json = {"as_json": True} if protocol == "grpc" else {}

    async def close(self) -> None:
        await self._client.close()

    async def _call(self, call: Awaitable[_T]) -> _T:
        return await within(call, self.timeout_s)

    async def is_live(self) -> bool:
        """Whether the server answers live; raises (a timeout, a refused connection) when it does not answer."""
        return bool(await self._call(self._client.is_server_live(headers=self.headers)))

    async def check_live(self) -> None:
        """Raise ServerError (one line, with a hint) unless the server answers live."""
        try:
            live = await self.is_live()
        except Exception as exc:
            raise ServerError(f"cannot reach Triton at {self.url}: {failure_reason(exc)}", hint=SERVE_HINT) from None
        if not live:
            raise ServerError(f"Triton at {self.url} is not live", hint=SERVE_HINT)

    async def model_states(self) -> dict[str, dict[str, Any]] | None:
        """The repository index (model name → its entry with ``state`` and ``reason``), or None when the server
        refuses it (trtdeploy's servers restrict the model-repository API)."""
        from tritonclient.utils import InferenceServerException

        try:
            index = await self._call(self._client.get_model_repository_index(headers=self.headers, **self._json))
        except (InferenceServerException, asyncio.TimeoutError):
            return None
        entries = index.get("models", []) if isinstance(index, dict) else index
        return {entry["name"]: entry for entry in entries}

    async def model_info(self, name: str) -> ModelInfo:
        """The configuration of model ``name``: NotFoundError if the server has none, ServerError if not ready."""
        from tritonclient.utils import InferenceServerException

        try:
            config = await self._call(self._client.get_model_config(name, headers=self.headers, **self._json))
        except InferenceServerException as exc:
            if "unknown model" not in exc.message().lower():
                raise self._config_error(name, exc) from None
            await self._raise_unavailable(name)
        except Exception as exc:
            raise self._config_error(name, exc) from None
        try:
            ready = await self._call(self._client.is_model_ready(name, headers=self.headers))
        except Exception as exc:
            raise ServerError(f"cannot tell whether {name!r} is ready at {self.url}: {failure_reason(exc)}") from None
        if not ready:
            await self._raise_unavailable(name)
        return model_info_from_config(config["config"] if "config" in config else config)

    def _config_error(self, name: str, exc: BaseException) -> ServerError:
        return ServerError(f"cannot read the configuration of {name!r} at {self.url}: {failure_reason(exc)}")

    async def _raise_unavailable(self, name: str) -> None:
        """NotFoundError when the server has no model ``name``, ServerError when it has one that is not ready."""
        states = await self.model_states()
        if states is not None and name in states:
            reason = states[name].get("reason") or states[name].get("state") or "not loaded"
            raise ServerError(f"model {name!r} is not ready on Triton at {self.url} ({reason})")
        if states is None:  # the model list is restricted: not there, or there but not loaded
            raise NotFoundError(
                f"Triton at {self.url} has no ready model {name!r}",
                hint="choose the model with --model (the server's log lists what it loaded)",
            )
        raise NotFoundError(
            f"Triton at {self.url} has no model {name!r}",
            hint=f"its models: {', '.join(sorted(states)) or 'none'} (choose one with --model)",
        )

    async def metadata(self, name: str) -> dict[str, Any]:
        """Model ``name``'s metadata (inputs and outputs with their KServe data types) as JSON."""
        return dict(await self._call(self._client.get_model_metadata(name, headers=self.headers, **self._json)))

    async def statistics(self) -> list[dict[str, Any]]:
        """Every model's inference statistics (``/v2/models/stats``) as JSON."""
        stats = await self._call(self._client.get_inference_statistics(headers=self.headers, **self._json))
        return list(stats.get("model_stats", []))


async def fetch_metrics(url: str, timeout_s: float = 5.0) -> str | None:
    """The Prometheus text at ``url``, or None when it cannot be read within ``timeout_s``."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(url) as response:
                return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
