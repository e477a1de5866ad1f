"""OpenAI-compatible servers (trtllm-serve, vLLM, SGLang, ``transformers serve``, ...): ``/v1/completions`` and
``/v1/chat/completions``, streamed as server-sent events or answered whole, loaded with the same levels, metrics
and reports as Triton (``trtdeploy perf --endpoint openai``).

On the hot path a request is one pre-serialized JSON body posted with aiohttp, and each event of the answer is kept
as it came (its ``data`` bytes) with its arrival time; the workload reads them once the request is complete. Only an
event that may be an error is parsed while the answer streams.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from ..errors import NotFoundError, ServerError, UsageError
from .control import CONTROL_TIMEOUT_S, short, within
from .llm import _LLMWorkload, load_tokenizer
from .records import Record
from .transports import Caller, Transport
from .workload import Chunk, InputRow, ModelInfo, Request, RequestOptions, Result

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: ``--api``: the legacy text completions (the prompt as it is) or chat completions (the prompt as one user turn,
#: wrapped in the chat template by the server), and the path each is posted to.
Api = Literal["completions", "chat"]
API_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
#: Where an OpenAI-compatible server lists its models; it answers liveness probes too (every such server has it).
MODELS_PATH = "/v1/models"
#: The request sent before the load to learn whether the server takes the run's fields.
PROBE_ROW = InputRow(input="Hello", max_tokens=1)
EXAMPLE = "e.g. --url http://localhost:8000 (HOST:PORT, or a base URL such as https://HOST/v1)"
_JSON = {"Content-Type": "application/json"}
#: Seconds an idle connection is kept for the next request: less than the keep-alive of uvicorn (5 s), which serves
#: vLLM, SGLang and most others, so that no request goes out on a connection the server is closing.
KEEPALIVE_S = 2.0


def base_url(url: str, *, flag: str = "--url") -> str:
    """``http(s)://HOST[:PORT][/PREFIX]`` of ``url`` (``HOST:PORT``, or an ``http``/``https`` URL, whose ``/v1``
    ending, the base URL OpenAI clients take, is dropped: the API paths add it); UsageError naming ``flag`` if it
    is not one."""
    text = url.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"{flag} {url!r}: the port is not a number between 1 and 65535", hint=EXAMPLE) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UsageError(f"{flag} {url!r} is not HOST:PORT or an http(s) URL", hint=EXAMPLE)
    if port == 0:
        raise UsageError(f"{flag} {url!r}: port 0 is not a port to connect to", hint=EXAMPLE)
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/').removesuffix('/v1')}"


def error_message(payload: bytes) -> str:
    """One line from an error answer: OpenAI's ``{"error": {"message"}}``, ``{"message"}`` (vLLM, trtllm-serve),
    FastAPI's ``{"detail"}``, or the text itself."""
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        found = error or data.get("message") or data.get("detail")
        if found:
            return short(Exception(found if isinstance(found, str) else json.dumps(found)))
    text = payload.decode("utf-8", errors="replace").strip()
    return short(Exception(text[:300])) if text else "no message"


def _stream_error(event: bytes) -> str | None:
    """The message of an error event in a stream (``{"error": ...}`` or ``{"object": "error", ...}``), else None.
    Cheap for the other events: an error's key is ``"error"`` in quotes, which generated text (escaped) never is."""
    if b'"error"' not in event:
        return None
    try:
        data = json.loads(event)
    except ValueError:
        return None
    if isinstance(data, dict) and (data.get("error") or data.get("object") == "error"):
        return error_message(event)
    return None


class OpenAIControl:
    """What the load asks an OpenAI-compatible server besides requests: liveness and its models
    (``/v1/models``), and one probe request. Every call gives up after ``timeout_s``. The server keeps no
    per-model statistics in Triton's form: :meth:`statistics` has none (its Prometheus ``/metrics``, where it
    has one, is read as Triton's is)."""

    def __init__(self, url: str, *, timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._session: Any = None

    def _client(self) -> Any:
        import aiohttp

        if self._session is None:  # made inside the running loop
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _models(self) -> list[dict[str, Any]]:
        async with self._client().get(self.url + MODELS_PATH) as response:
            payload = await response.read()
            if response.status != 200:
                raise ServerError(f"{self.url}{MODELS_PATH} answered HTTP {response.status}: {error_message(payload)}")
        data = json.loads(payload).get("data")
        if not isinstance(data, list):
            raise ServerError(f"{self.url}{MODELS_PATH} has no list of models: not an OpenAI-compatible server?")
        return [entry for entry in data if isinstance(entry, dict) and "id" in entry]

    async def models(self) -> list[dict[str, Any]]:
        """The served models (``id``, ``owned_by``, ...); ServerError when the server cannot be reached or read."""
        try:
            return await within(self._models(), self.timeout_s)
        except ServerError:
            raise
        except Exception as exc:
            reason = "no answer in time" if isinstance(exc, asyncio.TimeoutError) else short(exc)
            raise ServerError(
                f"cannot reach an OpenAI-compatible server at {self.url}: {reason}",
                hint="start the server (trtllm-serve, vllm serve, ...), or pass its --url",
            ) from None

    async def is_live(self) -> bool:
        """Whether the server lists its models; raises (a timeout, a refused connection) when it does not answer."""
        async with self._client().get(self.url + MODELS_PATH) as response:
            await response.read()
            return response.status == 200

    async def check_live(self) -> None:
        await self.models()

    async def model_info(self, name: str) -> ModelInfo:
        """Model ``name`` as the load sees it (no tensors); NotFoundError naming the served ones if it is not."""
        served = [entry["id"] for entry in await self.models()]
        if name not in served:
            raise NotFoundError(
                f"the server at {self.url} serves no model {name!r}",
                hint=f"its models: {', '.join(served) or 'none'} (choose one with --model)",
            )
        return ModelInfo(name=name, inputs={}, outputs={})

    async def statistics(self) -> list[dict[str, Any]]:
        """No model statistics in Triton's form (see the class)."""
        return []

    async def check_request(self, request: Request, *, timeout_s: float) -> None:
        """Send ``request`` (one token's worth), waiting for it at most ``timeout_s`` (a request's, not a control
        call's: the first request may be slow), and raise when the server refuses it: UsageError for a request it
        calls bad (a field it does not take, such as --ignore-eos's ``ignore_eos``), ServerError otherwise."""
        import aiohttp

        assert request.path is not None
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._client().post(self.url + request.path, json=request.body, timeout=timeout) as response:
                payload = await response.read()
        except Exception as exc:
            reason = "no answer in time" if isinstance(exc, asyncio.TimeoutError) else short(exc)
            raise ServerError(f"a first request to {self.url}{request.path} failed: {reason}") from None
        if response.status == 200:
            return
        message = f"the server at {self.url} refused a request to {request.path}: HTTP {response.status}: "
        message += error_message(payload)
        if response.status == 404:
            raise NotFoundError(message, hint="does it serve this API? choose the other with --api chat|completions")
        if 400 <= response.status < 500:
            raise UsageError(
                message,
                hint="leave out the option that sets the field it names (--ignore-eos: ignore_eos, --top-k: top_k), "
                "or give the server's own field with --extra-body",
            )
        raise ServerError(message)


class OpenAITransport(Transport):
    """Requests posted over one aiohttp session; a ``text/event-stream`` answer is read event by event, any other
    as one JSON response.

    A stream ends at its ``[DONE]`` event (read to the end of the body all the same, so that the connection is kept)
    or at the end of the body (servers that send no ``[DONE]``). An error event fails the request with its message;
    an HTTP error status fails it with the status and the server's message.
    """

    def __init__(self, url: str, model_name: str, *, timeout_s: float) -> None:
        super().__init__(url, model_name, timeout_s=timeout_s)
        self._session: Any = None

    async def open(self, slots: int) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=slots, keepalive_timeout=KEEPALIVE_S),  # limit 0: none (open loop)
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            headers=_JSON,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def encode(self, request: Request, *, stream: bool) -> tuple[str, bytes]:
        assert request.path is not None and request.body is not None, "not a request for an OpenAI-compatible server"
        return self.url + request.path, json.dumps(request.body).encode()

    def caller(self, *, stream: bool) -> Caller:
        return self._post

    async def release(self) -> None:
        """Nothing to release: each request is one HTTP exchange."""

    def abort(self, message: str) -> None:
        """Nothing to fail here: the load cancels the requests in flight."""

    async def _post(self, payload: tuple[str, bytes], rec: Record) -> None:
        import aiohttp

        url, body = payload
        rec.send_ns = time.perf_counter_ns()
        try:
            async with await self._answer(url, body) as response:
                if response.status != 200:
                    message = error_message(await response.read())
                    rec.end_ns = time.perf_counter_ns()
                    rec.error = f"HTTP {response.status}: {message}"
                elif response.content_type == "text/event-stream":
                    await read_events(response.content.iter_any(), rec)
                else:
                    rec.raw.append(await response.read())
                    rec.end_ns = now = time.perf_counter_ns()
                    rec.chunk_ns.append(now)
        except asyncio.TimeoutError:
            rec.fail(f"timed out after {self.timeout_s:g} s", time.perf_counter_ns())
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, or the stream cut
            rec.fail(f"{type(exc).__name__}: {short(exc)}", time.perf_counter_ns())
        rec.end_ns = rec.end_ns or time.perf_counter_ns()

    async def _answer(self, url: str, body: bytes) -> Any:
        """The response to a post, once its headers are in. A connection that breaks before any answer is a kept
        one the server had closed (uvicorn closes a connection after an unhandled error, just after its answer,
        too late for the client to see before the next request): the request is sent again, once, on a new one."""
        import aiohttp

        try:
            return await self._session.post(url, data=body)
        except aiohttp.ClientConnectorError:  # no connection could be made: nothing to retry
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            return await self._session.post(url, data=body)

    def decode(self, raw: Any) -> dict[str, Any]:
        return json.loads(raw)


async def read_events(blocks: AsyncIterable[bytes], rec: Record) -> None:
    """Keep in ``rec`` the ``data`` of each server-sent event in ``blocks`` (the body as it comes) with the time
    its last byte came; ``[DONE]`` is the end (what follows it is read, not kept), an error event fails ``rec``."""
    pending = b""
    data: list[bytes] = []
    done = False

    def dispatch(now: int) -> None:
        nonlocal done
        event = b"\n".join(data)
        data.clear()
        if done or rec.error is not None:
            return
        if event == b"[DONE]":
            done = True
            rec.end_ns = now
            return
        message = _stream_error(event)
        if message is not None:
            rec.error, rec.end_ns = message, now
            return
        rec.chunk_ns.append(now)
        rec.raw.append(event)

    async for block in blocks:
        now = time.perf_counter_ns()
        *lines, pending = (pending + block).split(b"\n")
        for line in lines:
            line = line.removesuffix(b"\r")
            if not line:  # a blank line ends an event
                if data:
                    dispatch(now)
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
    if pending.startswith(b"data:"):  # the body ended without the event's blank line
        data.append(pending[5:].lstrip(b" "))
    if data:
        dispatch(time.perf_counter_ns())


class OpenAIWorkload(_LLMWorkload):
    """A text LLM behind an OpenAI-compatible API: each input row is one completion (``api="completions"``, the
    prompt as it is) or chat completion (``api="chat"``, the prompt as one user turn).

    Requests: ``model``, ``prompt`` or ``messages``, ``max_tokens``, ``temperature`` (0, greedy, unless the run sets
    one: Triton deployments decode greedily by default, and so is the same workload here), ``top_p``, ``top_k`` and
    ``seed`` when set, ``ignore_eos`` with ignore_eos, ``stream`` with ``stream_options.include_usage`` when
    streaming, then ``extra_body`` over all of them. Token counts: the server's ``usage`` when it reports it, else
    the text re-tokenized with ``tokenizer`` (a folder or Hub name; also what counts the prompts and makes
    synthetic ones). A chat answer's reasoning text (``reasoning_content`` or ``reasoning``) counts as output.
    """

    def __init__(
        self,
        model_name: str,
        *,
        api: Api = "completions",
        tokenizer: Path | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(model_name, chat_template=api == "chat")
        self.api = api
        self.tokenizer_dir = tokenizer
        self.extra_body = dict(extra_body or {})

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            if self.tokenizer_dir is None:
                raise UsageError(
                    f"counting the tokens of {self.model_name!r} needs its tokenizer",
                    hint="pass --tokenizer (the model's Hugging Face tokenizer folder or Hub name)",
                )
            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer

    def make_request(self, row: InputRow, options: RequestOptions, model: ModelInfo) -> Request:
        text = str(row.input)
        body: dict[str, Any] = {"model": self.model_name}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        body["max_tokens"] = row.max_tokens or options.max_tokens or self.max_tokens
        body["temperature"] = 0.0 if options.temperature is None else options.temperature
        body.update(
            (key, getattr(options, key)) for key in ("top_p", "top_k", "seed") if getattr(options, key) is not None
        )
        if options.ignore_eos:
            body["ignore_eos"] = True
        if options.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body.update(self.extra_body)
        input_tokens = len(self.prompt_ids(text)) if self.tokenizer_dir is not None else None
        return Request(
            inputs={},
            path=API_PATHS[self.api],
            body=body,
            reference=row.reference,
            input_tokens=input_tokens,
        )

    def parse_chunk(self, outputs: Mapping[str, Any], request: Request) -> Chunk:
        """A streamed event carries a piece of the text (its tokens are counted in :meth:`finish`); an answer that
        is not streamed, the whole text and its token count."""
        choices = outputs.get("choices") or [{}]
        choice = choices[0]
        if self.api == "chat":
            message = choice.get("delta") or choice.get("message") or {}
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            text = reasoning + (message.get("content") or "")
        else:
            text = choice.get("text") or ""
        usage = outputs.get("usage") or None
        streamed = bool(request.body and request.body.get("stream"))
        tokens = None if streamed or usage is None else usage.get("completion_tokens")
        return Chunk(tokens=tokens, text=text, usage=usage)

    def finish(self, request: Request, chunks: Sequence[Chunk]) -> Result:
        """Output tokens: the ``completion_tokens`` of the server's usage, else the text re-tokenized. Tokens in the
        first chunk: its usage's ``completion_tokens`` when it has one (a server reporting usage on every event,
        or the only chunk), else its text re-tokenized (at least 1, at most the whole answer), else 1."""
        if not chunks:  # nothing generated (end-of-sequence first)
            return Result(output_tokens=0, text="")
        text = "".join(chunk.text for chunk in chunks)
        usage = chunks[-1].usage or {}
        counted = self.tokenizer_dir is not None
        total = usage.get("completion_tokens")
        source = "server" if total is not None else "retokenized" if counted else None
        if total is None and counted:
            total = self.count_text_tokens(text)
        first = (chunks[0].usage or {}).get("completion_tokens")
        if first is None and total is not None:
            first = min(max(self.count_text_tokens(chunks[0].text), 1), total) if counted else 1
        return Result(
            input_tokens=usage.get("prompt_tokens"),
            output_tokens=total,
            first_chunk_tokens=first,
            token_source=source,
            text=text,
        )
