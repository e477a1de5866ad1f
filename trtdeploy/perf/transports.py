"""How requests reach Triton: gRPC (offline ``ModelInfer``, streaming ``ModelStreamInfer``) and HTTP (offline
``infer``; streaming through the generate extension's ``generate_stream``, whose server-sent events carry tensors as
JSON: text and token ids, for the LLM workloads); and (:mod:`trtdeploy.perf.openai_api`) an OpenAI-compatible server.

Everything a request needs is encoded before the load starts. On the hot path a gRPC request is one pre-serialized
protobuf (``bytes``) handed to a grpc.aio call whose serializers are the identity, and each response is kept as it
came, with its arrival time; decoding into numpy happens once the request is complete (:meth:`Transport.decode`).

The control plane (health, model configuration, statistics) is :mod:`trtdeploy.perf.control`.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .control import short
from .records import Record
from .workload import Request

if TYPE_CHECKING:
    import numpy as np

#: Sends one request and fills the record's times, responses or error; returns when the request is complete.
Caller = Callable[[Any, Record], Awaitable[None]]

_MAX_MESSAGE = 2**31 - 1


def _identity(data: bytes) -> bytes:
    return data


class Transport(ABC):
    """One connection to the server in one process, and the callers that send requests over it."""

    def __init__(self, url: str, model_name: str, *, timeout_s: float) -> None:
        self.url = url
        self.model_name = model_name
        self.timeout_s = timeout_s

    @abstractmethod
    async def open(self, slots: int) -> None:
        """Connect, sized for ``slots`` requests in flight (0: no limit)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def encode(self, request: Request, *, stream: bool) -> Any:
        """The request in the form this transport sends (built once per row, before the level that first sends
        it)."""

    @abstractmethod
    def caller(self, *, stream: bool) -> Caller:
        """A function that sends requests; with ``stream``, each caller has a stream of its own."""

    @abstractmethod
    def decode(self, raw: Any) -> dict[str, np.ndarray]:
        """The output tensors of one kept response."""

    @abstractmethod
    async def release(self) -> None:
        """Close the streams opened by :meth:`caller` (after each level)."""

    @abstractmethod
    def abort(self, message: str) -> None:
        """Fail every request in flight on a stream with ``message`` (the level is given up)."""


# --- gRPC ------------------------------------------------------------------------------------------------------


def _grpc_method(name: str) -> str:
    from tritonclient.grpc import service_pb2

    return f"/{service_pb2.DESCRIPTOR.services_by_name['GRPCInferenceService'].full_name}/{name}"


def _id_field(request_id: str) -> bytes:
    """The wire encoding of ``ModelInferRequest.id`` (field 3); appended to a serialized request it sets the id.

    Protobuf keeps the last occurrence of a singular field, so the pre-serialized request needs no re-encoding.
    Ids here are short decimal strings: their length fits the one-byte varint.
    """
    data = request_id.encode()
    return b"\x1a" + bytes((len(data),)) + data


def encode_grpc_request(model_name: str, request: Request, *, stream: bool) -> bytes:
    """A serialized ``ModelInferRequest`` (raw tensor contents; with ``stream``, asking for empty final responses)."""
    import numpy as np
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

    message = service_pb2.ModelInferRequest(model_name=model_name)
    for name, array in request.inputs.items():
        datatype = np_to_triton_dtype(array.dtype)
        message.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if datatype == "BYTES":
            content = serialize_byte_tensor(array).item() if array.size else b""
        else:
            content = np.ascontiguousarray(array).tobytes()
        message.raw_input_contents.append(content)
    for name in request.outputs:
        message.outputs.add(name=name)
    if stream:
        message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message.SerializeToString()


#: gRPC status codes of a call the server did not answer (the others carry the server's own error).
_UNANSWERED = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN"}


def _rpc_error(exc: Any) -> str:
    return f"{exc.code().name}: {exc.details()}"


class GrpcTransport(Transport):
    def __init__(self, url: str, model_name: str, *, timeout_s: float) -> None:
        super().__init__(url, model_name, timeout_s=timeout_s)
        self._channel: Any = None
        self._sessions: list[StreamSession] = []

    async def open(self, slots: int) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        options = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]
        self._channel = grpc.aio.insecure_channel(self.url, options=options)
        self._unary = self._channel.unary_unary(
            _grpc_method("ModelInfer"), request_serializer=_identity, response_deserializer=_identity
        )
        self._stream = self._channel.stream_stream(
            _grpc_method("ModelStreamInfer"),
            request_serializer=_identity,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        self._rpc_error_type = grpc.aio.AioRpcError

    async def close(self) -> None:
        await self.release()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def encode(self, request: Request, *, stream: bool) -> bytes:
        return encode_grpc_request(self.model_name, request, stream=stream)

    def caller(self, *, stream: bool) -> Caller:
        if not stream:
            return self._infer
        session = StreamSession(self._stream, self.timeout_s, self._rpc_error_type)
        self._sessions.append(session)
        return session.infer

    async def release(self) -> None:
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.close()

    def abort(self, message: str) -> None:
        for session in self._sessions:
            session.abort(message)

    async def _infer(self, payload: bytes, rec: Record) -> None:
        rec.send_ns = time.perf_counter_ns()
        try:
            raw = await self._unary(payload, timeout=self.timeout_s)
        except self._rpc_error_type as exc:
            if exc.code().name in _UNANSWERED:
                rec.fail(_rpc_error(exc), time.perf_counter_ns())
            else:  # the server answered with an error
                rec.end_ns = time.perf_counter_ns()
                rec.error = _rpc_error(exc)
            return
        rec.end_ns = now = time.perf_counter_ns()
        rec.chunk_ns.append(now)
        rec.raw.append(raw)

    def decode(self, raw: Any) -> dict[str, np.ndarray]:
        from tritonclient.grpc import InferResult, service_pb2

        response = service_pb2.ModelInferResponse.FromString(raw) if isinstance(raw, bytes) else raw
        result = InferResult(response)
        return {output.name: result.as_numpy(output.name) for output in response.outputs}


class _Stream:
    """One ``ModelStreamInfer`` call, the requests sent on it (by request id) and the task reading its responses."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.pending: dict[str, tuple[Record, asyncio.Future[None]]] = {}
        self.reader: asyncio.Task[None] | None = None


class StreamSession:
    """A bidirectional ``ModelStreamInfer`` stream; responses are matched to requests by request id.

    A request is complete at its response flagged ``triton_final_response`` (requests carry
    ``triton_enable_empty_final_response``, so a model that sends the final flag alone is seen too), at an error
    response, or when it has waited ``timeout_s``. When the stream breaks, the requests sent on it fail and the next
    request opens a new stream: each stream has its own table of pending requests and its own reader, so the end of
    an old stream never fails a request sent on the new one.
    """

    def __init__(self, method: Any, timeout_s: float, rpc_error: type[Exception]) -> None:
        self._method = method
        self._timeout_ns = int(timeout_s * 1e9)
        self._rpc_error = rpc_error
        self._stream: _Stream | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()

    def _open(self) -> _Stream:
        stream = _Stream(self._method())
        stream.reader = asyncio.ensure_future(self._read(stream))
        self._stream = stream
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        return stream

    async def infer(self, payload: bytes, rec: Record) -> None:
        stream = self._stream or self._open()
        key = str(rec.seq)
        done = asyncio.get_running_loop().create_future()
        stream.pending[key] = (rec, done)
        message = payload + _id_field(key)
        async with self._write_lock:
            rec.send_ns = time.perf_counter_ns()
            try:
                await stream.call.write(message)
            except Exception as exc:  # the stream broke: fail its requests; the next request opens a new one
                reason = _rpc_error(exc) if isinstance(exc, self._rpc_error) else short(exc)
                self._end(stream, f"stream closed: {reason}")
        await done

    async def _read(self, stream: _Stream) -> None:
        import grpc

        pending = stream.pending
        reason = "the server closed the stream"
        try:
            while True:
                response = await stream.call.read()
                if response is grpc.aio.EOF:
                    break
                now = time.perf_counter_ns()
                infer_response = response.infer_response
                entry = pending.get(infer_response.id)
                if entry is None:
                    if not (response.error_message and len(pending) == 1):
                        continue  # a request that timed out, answering late
                    # an error the server could not tie to a request id: it belongs to the only one in flight
                    entry = pending[next(iter(pending))]
                    infer_response.id = str(entry[0].seq)
                rec = entry[0]
                if response.error_message:
                    rec.error = response.error_message
                else:
                    if infer_response.outputs:
                        rec.chunk_ns.append(now)
                        rec.raw.append(infer_response)
                    final = infer_response.parameters.get("triton_final_response")
                    if final is not None and not final.bool_param:
                        continue
                del pending[infer_response.id]
                rec.end_ns = now
                entry[1].set_result(None)
        except self._rpc_error as exc:
            reason = _rpc_error(exc)
        self._end(stream, reason)

    def _end(self, stream: _Stream, message: str) -> None:
        """Fail the requests of ``stream`` with ``message``, stop its reader and forget it."""
        if self._stream is stream:
            self._stream = None
        now = time.perf_counter_ns()
        for rec, done in stream.pending.values():
            rec.fail(message, now)
            if not done.done():
                done.set_result(None)
        stream.pending.clear()
        stream.call.cancel()
        if stream.reader is not None and stream.reader is not asyncio.current_task():
            stream.reader.cancel()

    def abort(self, message: str) -> None:
        """Fail the requests in flight on the current stream with ``message``."""
        if self._stream is not None:
            self._end(self._stream, message)

    async def _sweep(self) -> None:
        """Fail requests that have waited longer than the timeout (checked about four times per timeout)."""
        interval = min(1.0, self._timeout_ns / 4e9)
        while True:
            await asyncio.sleep(interval)
            if self._stream is None:
                continue
            pending = self._stream.pending
            now = time.perf_counter_ns()
            expired = [key for key, (rec, _) in pending.items() if rec.send_ns and now - rec.send_ns > self._timeout_ns]
            for key in expired:
                rec, done = pending.pop(key)
                rec.fail(f"timed out after {self._timeout_ns / 1e9:g} s", now)
                done.set_result(None)

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        tasks = [self._sweeper]
        if stream is not None:
            self._end(stream, "the stream was closed")
            tasks.append(stream.reader)
        for task in tasks:
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._sweeper = None


# --- HTTP ------------------------------------------------------------------------------------------------------


def encode_generate_request(request: Request) -> bytes:
    """The JSON body of a ``generate_stream`` request: each input by name, one value when it holds one element, else
    a list (text as strings); the generate extension asks for no outputs (it returns them all)."""
    import json

    body = {}
    for name, array in request.inputs.items():
        values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
        body[name] = values[0] if len(values) == 1 else values
    return json.dumps(body).encode()


#: Keys of a generate_stream event that are not outputs.
_EVENT_KEYS = frozenset({"model_name", "model_version", "id", "parameters"})


def decode_generate_event(data: bytes) -> dict[str, np.ndarray]:
    """The output tensors of one ``generate_stream`` event (text as bytes objects, numbers as numbers)."""
    import json

    import numpy as np

    outputs = {}
    for name, value in json.loads(data).items():
        if name in _EVENT_KEYS:
            continue
        values = value if isinstance(value, list) else [value]
        if values and all(isinstance(v, str) for v in values):
            outputs[name] = np.array([v.encode("utf-8") for v in values], dtype=np.object_)
        else:
            outputs[name] = np.asarray(values)
    return outputs


def _event_error(data: bytes) -> str:
    import json

    try:
        return str(json.loads(data).get("error") or data.decode(errors="replace"))
    except (ValueError, AttributeError):
        return data.decode(errors="replace")


class HttpTransport(Transport):
    """Offline ``infer`` through tritonclient.http.aio, with the request's InferInput objects built once; streaming
    through ``generate_stream`` (aiohttp), with the request's JSON body built once."""

    def __init__(self, url: str, model_name: str, *, timeout_s: float) -> None:
        super().__init__(url, model_name, timeout_s=timeout_s)
        self._client: Any = None
        self._session: Any = None

    async def open(self, slots: int) -> None:
        import aiohttp
        import tritonclient.http.aio as httpclient

        self._client = httpclient.InferenceServerClient(self.url, conn_limit=slots, conn_timeout=self.timeout_s)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=slots), timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        )
        self._generate_url = f"http://{self.url}/v2/models/{self.model_name}/generate_stream"

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def encode(self, request: Request, *, stream: bool) -> Any:
        if stream:
            return encode_generate_request(request)
        import tritonclient.http as httpclient
        from tritonclient.utils import np_to_triton_dtype

        inputs = []
        for name, array in request.inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return inputs, [httpclient.InferRequestedOutput(name) for name in request.outputs]

    def caller(self, *, stream: bool) -> Caller:
        return self._generate if stream else self._infer

    async def release(self) -> None:
        """Nothing to release: HTTP requests hold no streams open between them."""

    def abort(self, message: str) -> None:
        """Nothing to fail here: HTTP requests hold no streams (the load cancels the requests in flight)."""

    async def _infer(self, payload: tuple[list[Any], list[Any]], rec: Record) -> None:
        from tritonclient.utils import InferenceServerException

        inputs, outputs = payload
        rec.send_ns = time.perf_counter_ns()
        try:
            result = await self._client.infer(self.model_name, inputs, outputs=outputs or None)
        except InferenceServerException as exc:
            rec.error = exc.message()
        except asyncio.TimeoutError:
            rec.fail(f"timed out after {self.timeout_s:g} s", time.perf_counter_ns())
        except Exception as exc:  # aiohttp's: connection refused or reset
            rec.fail(f"{type(exc).__name__}: {short(exc)}", time.perf_counter_ns())
        else:
            rec.chunk_ns.append(time.perf_counter_ns())
            rec.raw.append(result)
        rec.end_ns = rec.end_ns or time.perf_counter_ns()

    async def _generate(self, body: bytes, rec: Record) -> None:
        """One ``generate_stream`` request: each event's data kept with its arrival time; an error event (or
        status) is the server's answer."""
        rec.send_ns = time.perf_counter_ns()
        try:
            async with self._session.post(self._generate_url, data=body) as response:
                if response.status != 200:
                    rec.error = _event_error(await response.read())
                else:
                    async for line in response.content:
                        if not line.startswith(b"data:"):
                            continue
                        now, data = time.perf_counter_ns(), line[5:].strip()
                        if data.startswith(b'{"error"'):
                            rec.error = _event_error(data)
                            break
                        rec.chunk_ns.append(now)
                        rec.raw.append(data)
        except asyncio.TimeoutError:
            rec.fail(f"timed out after {self.timeout_s:g} s", time.perf_counter_ns())
        except Exception as exc:  # aiohttp's: connection refused or reset
            rec.fail(f"{type(exc).__name__}: {short(exc)}", time.perf_counter_ns())
        rec.end_ns = rec.end_ns or time.perf_counter_ns()

    def decode(self, raw: Any) -> dict[str, np.ndarray]:
        if isinstance(raw, bytes):
            return decode_generate_event(raw)
        return {output["name"]: raw.as_numpy(output["name"]) for output in raw.get_response().get("outputs", [])}
