"""Small helpers for the Python models that run inside Triton's python backend (plugins' ``model.py`` files)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

#: Spellings of true and false in config parameters and ``-o`` options.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class ModelParameters:
    """Typed access to the ``parameters { key … string_value … }`` of a model's config.pbtxt."""

    def __init__(self, args: Mapping[str, Any]) -> None:
        config = json.loads(args["model_config"])
        self.model_name: str = config.get("name", "")
        self.raw: dict[str, str] = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}

    def str(self, key: str, default: str | None = None) -> str:
        if key in self.raw and self.raw[key] != "":
            return self.raw[key]
        if default is None:
            raise KeyError(f"model {self.model_name!r}: parameter {key!r} is missing from config.pbtxt")
        return default

    def int(self, key: str, default: int | None = None) -> int:
        return int(self.str(key, None if default is None else str(default)))

    def float(self, key: str, default: float | None = None) -> float:
        return float(self.str(key, None if default is None else str(default)))

    def bool(self, key: str, default: bool | None = None) -> bool:
        return self.str(key, None if default is None else str(default)).lower() in TRUE_WORDS


class RequestError(ValueError):
    """The request cannot be served as sent (answered with INVALID_ARG)."""


def error_response(message: str, *, invalid: bool) -> Any:
    """An error response: INVALID_ARG for the client's mistake (``invalid``), INTERNAL for the server's."""
    import triton_python_backend_utils as pb_utils

    code = pb_utils.TritonError.INVALID_ARG if invalid else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def has_input(request: Any, name: str) -> bool:
    import triton_python_backend_utils as pb_utils

    return pb_utils.get_input_tensor_by_name(request, name) is not None


def row_tensor(name: str, value: Any, dtype: Any) -> Any:
    """A ``[1, n]`` tensor of ``value`` (one request's row), for a BLS call."""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    return pb_utils.Tensor(name, np.asarray(value, dtype=dtype).reshape(1, -1))


def bls_request(model: str, inputs: list, outputs: list[str], trace: Any = None) -> Any:
    """A BLS request to ``model``. ``trace``: the calling request's (``request.trace()``), so that Triton's trace
    (``--trace-config``) follows the request into the models it calls."""
    import triton_python_backend_utils as pb_utils

    traced = {} if trace is None else {"trace": trace}
    return pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, inputs=inputs, **traced)


def call_model(model: str, inputs: list, outputs: list[str], trace: Any = None) -> Any:
    """One BLS call to a non-decoupled model; RuntimeError naming the model when it fails. ``trace``: as for
    :func:`bls_request`."""
    response = bls_request(model, inputs, outputs, trace).exec()
    if response.has_error():
        raise RuntimeError(f"{model}: {response.error().message()}")
    return response


class CallAhead:
    """Runs a stream's next call (the LLM's next segment) on a thread of its own while the caller works on what the
    last one returned (turning its tokens into audio): a BLS call releases the GIL while it waits, so the two models
    work at once for one request. One call is in flight at a time; a model instance keeps one of these for each
    call it overlaps with its own work.

    ``drain`` (in a ``finally``) waits for a call still in flight, so that nothing runs on for a request that has
    ended, failed or been cancelled."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trtdeploy-call-ahead")
        self._pending: Future | None = None

    def start(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if self._pending is not None:
            raise RuntimeError("CallAhead.start: the call before is still in flight; take its result() first")
        self._pending = self._pool.submit(call, *args, **kwargs)

    def result(self) -> Any:
        """The call's answer (its exception raised here)."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("CallAhead.result: no call was started")
        return pending.result()

    def drain(self) -> None:
        """Wait for a call still in flight and drop its outcome."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.exception()


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings, as the LLM contract takes them."""

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float


def read_sampling(request: Any, defaults: Mapping[str, Any]) -> Sampling:
    """The request's ``temperature``, ``top_k``, ``top_p`` and ``repetition_penalty`` (``defaults``' where it sends
    none); RequestError naming the first one out of range."""
    found = Sampling(
        temperature=float(optional_scalar(request, "temperature", defaults["temperature"])),
        top_k=int(optional_scalar(request, "top_k", defaults["top_k"])),
        top_p=float(optional_scalar(request, "top_p", defaults["top_p"])),
        repetition_penalty=float(optional_scalar(request, "repetition_penalty", defaults["repetition_penalty"])),
    )
    valid = {
        "temperature": found.temperature >= 0,
        "top_k": found.top_k >= 0,
        "top_p": 0 <= found.top_p <= 1,
        "repetition_penalty": found.repetition_penalty > 0,
    }
    bad = [name for name, ok in valid.items() if not ok]
    if bad:
        raise RequestError(
            f"{bad[0]} {getattr(found, bad[0]):g} is out of range (temperature >= 0, top_k >= 0, 0 <= top_p <= 1, "
            "repetition_penalty > 0)"
        )
    return found


def optional_scalar(request: Any, name: str, default: Any = None) -> Any:
    """The first element of an optional input tensor, or ``default`` when the client did not send it."""
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    return array.reshape(-1)[0].item() if array.size else default


def decode_text(request: Any, name: str) -> str:
    """A BYTES input as text; raises ValueError naming the tensor when it is missing or not UTF-8."""
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"input {name!r} is missing")
    value = tensor.as_numpy().reshape(-1)[0]
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as exc:
        raise ValueError(f"input {name!r} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    return text


def reference_wav(request: Any, max_samples: int, sample_rate: int) -> Any:
    """A request's ``reference_wav`` (mono at ``sample_rate``) cut to ``reference_wav_len``, as float32; ValueError
    naming what is wrong (missing, empty, a length that does not fit, longer than ``max_samples``, NaN)."""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, "reference_wav")
    if tensor is None:
        raise ValueError("input 'reference_wav' is missing")
    wav = tensor.as_numpy().reshape(-1)
    length = int(optional_scalar(request, "reference_wav_len", wav.size))
    if wav.size == 0 or length == 0:
        raise ValueError(
            f"the reference audio is empty (0 samples): send the voice to clone, a few seconds of speech at "
            f"{sample_rate // 1000} kHz"
        )
    if not 0 < length <= wav.size:
        raise ValueError(f"reference_wav_len {length} does not fit reference_wav of {wav.size} samples")
    if length > max_samples:
        raise ValueError(
            f"reference audio is {length / sample_rate:.1f} s, longer than the {max_samples / sample_rate:g} s "
            "this deployment takes: use a shorter reference"
        )
    wav = np.array(wav[:length], dtype=np.float32)
    if not np.isfinite(wav).all():
        raise ValueError("reference_wav holds NaN or infinite samples")
    return wav


def first_sequence(output_ids: Any, sequence_length: Any = None) -> Any:
    """The first sequence of an ``output_ids`` array (``[batch, beam, tokens]`` or flatter), cut to its
    ``sequence_length`` when that is given; an empty array (nothing generated) is an empty sequence."""
    if output_ids.size == 0:
        return output_ids.reshape(-1)
    flat = output_ids.reshape(-1, output_ids.shape[-1])[0] if output_ids.ndim > 1 else output_ids.reshape(-1)
    if sequence_length is not None and sequence_length.size:
        flat = flat[: int(sequence_length.reshape(-1)[0])]
    return flat


_MASK64 = (1 << 64) - 1


def segment_seed(seed: int, segment: int) -> int:
    """The seed of call ``segment`` (from 0) of an answer asked for in segments, on an engine whose sampling noise
    restarts with each request: the request's seed for the first call, then distinct, well-mixed 64-bit seeds
    (SplitMix64 of the seed and the segment), so that no segment replays another's noise."""
    if segment == 0:
        return seed
    mixed = (seed + segment * 0x9E3779B97F4A7C15) & _MASK64
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mixed ^ (mixed >> 31)


def generate_segment(
    model: str,
    prompt: Any,
    max_tokens: int,
    *,
    sampling: Sampling,
    seed: int | None,
    seed_input: str,
    segment: int = 0,
    seed_per_segment: bool = False,
    extra: Sequence[Any] = (),
    trace: Any = None,
) -> Any:
    """The ids an LLM-contract model generates after ``prompt`` in one non-decoupled call: ``max_tokens`` of them,
    fewer when it ends. ``segment`` counts the calls of an answer asked for in segments; on an engine whose noise
    restarts with each request (``seed_per_segment``) each segment gets its own seed (:func:`segment_seed`).
    ``extra``: more input tensors (end and pad ids, stop words, a bias...); ``trace``: as for :func:`call_model`."""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    inputs = [
        row_tensor("input_ids", prompt, np.int32),
        row_tensor("input_lengths", [len(prompt)], np.int32),
        row_tensor("request_output_len", [max_tokens], np.int32),
        row_tensor("streaming", [False], np.bool_),
        row_tensor("temperature", [sampling.temperature], np.float32),
        row_tensor("runtime_top_k", [sampling.top_k], np.int32),
        row_tensor("runtime_top_p", [sampling.top_p], np.float32),
        row_tensor("repetition_penalty", [sampling.repetition_penalty], np.float32),
        *extra,
    ]
    if seed_per_segment and segment:  # the engine's default seed when none was asked for is 0
        seed = segment_seed(seed or 0, segment)
    if seed is not None:
        inputs.append(row_tensor(seed_input, [seed], np.uint64))
    response = call_model(model, inputs, ["output_ids", "sequence_length"], trace)
    lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length")
    ids = pb_utils.get_output_tensor_by_name(response, "output_ids").as_numpy()
    return first_sequence(ids, None if lengths is None else lengths.as_numpy()).astype(np.int64)
