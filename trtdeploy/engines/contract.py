"""The LLM contract's requests and results as plain data, shared by every engine's Triton model (no torch here).

A Triton model serving the contract (see :mod:`trtdeploy.engines.triton_model`) turns each request's tensors into a
:class:`GenerationRequest` (:func:`parse_request`) and hands it, with a :class:`ResponseSink`, to its engine's
generator; :func:`response_arrays` lays what comes back out as the contract's output tensors.

The tensors are those of TensorRT-LLM's ``tensorrt_llm`` model (tensorrtllm_backend ``inflight_batcher_llm``,
checked against v0.19.0's ``tensorrt_llm/1/model.py`` and ``inflight_batcher_llm/src/model_instance_state.cc``),
under the names before TensorRT-LLM 0.20 renamed ``random_seed``/``min_length`` to ``seed``/``min_tokens`` (the
trtllm engine maps them to its release's names). :data:`INPUTS` and :data:`OUTPUTS` are what the python models of
the torch and trtllm_pytorch engines declare; an encoder-decoder model (Whisper) declares
:func:`encoder_decoder_inputs`, TensorRT-LLM's encoder-decoder inputs beside them. A generator honours each input or
refuses the request with one line naming it (:func:`refusal`); it never ignores one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Tensor:
    """One input or output of a Triton model's config.pbtxt (dims without the batch dim)."""

    name: str
    data_type: str
    dims: tuple[int, ...] = (1,)
    optional: bool = True
    #: Per-request scalars arrive as [1] and the model reads them as scalars (the C++ backend's ``reshape``).
    reshape_scalar: bool = False
    ragged: bool = False


INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,), optional=False, ragged=True),
    Tensor("input_lengths", "TYPE_INT32", optional=False),
    Tensor("request_output_len", "TYPE_INT32", optional=False),
    *(
        Tensor(name, data_type)
        for name, data_type in (
            ("end_id", "TYPE_INT32"),
            ("pad_id", "TYPE_INT32"),
            ("streaming", "TYPE_BOOL"),
            ("exclude_input_in_output", "TYPE_BOOL"),
            ("temperature", "TYPE_FP32"),
            ("runtime_top_k", "TYPE_INT32"),
            ("runtime_top_p", "TYPE_FP32"),
            ("random_seed", "TYPE_UINT64"),
            ("repetition_penalty", "TYPE_FP32"),
            ("presence_penalty", "TYPE_FP32"),
            ("frequency_penalty", "TYPE_FP32"),
            ("min_length", "TYPE_INT32"),
            ("beam_width", "TYPE_INT32"),
            ("len_penalty", "TYPE_FP32"),
            ("num_return_sequences", "TYPE_INT32"),
            ("return_log_probs", "TYPE_BOOL"),
            ("return_context_logits", "TYPE_BOOL"),
            ("return_generation_logits", "TYPE_BOOL"),
            ("return_perf_metrics", "TYPE_BOOL"),
            ("return_num_input_tokens", "TYPE_BOOL"),
            ("return_num_output_tokens", "TYPE_BOOL"),
        )
    ),
    Tensor("stop_words_list", "TYPE_INT32", (2, -1), ragged=True),
    Tensor("bad_words_list", "TYPE_INT32", (2, -1), ragged=True),
    Tensor("embedding_bias", "TYPE_FP32", (-1,), ragged=True),
)


def encoder_decoder_inputs(features_dtype: str = "TYPE_FP16") -> tuple[Tensor, ...]:
    """The inputs of an encoder-decoder model: :data:`INPUTS` with ``input_ids`` optional (Whisper sends none),
    and TensorRT-LLM's encoder-decoder inputs, the features in ``features_dtype``.

    Per request: ``encoder_input_features`` ``[T, n_mels]`` log-mel frames, ``input_lengths`` T,
    ``encoder_output_lengths`` T // 2, ``decoder_input_ids`` the decoder prompt and ``decoder_input_lengths`` its
    length (optional: the whole row).
    """
    return (
        *(replace(tensor, optional=True) if tensor.name == "input_ids" else tensor for tensor in INPUTS),
        Tensor("encoder_input_features", features_dtype, (-1, -1), ragged=True),
        Tensor("encoder_output_lengths", "TYPE_INT32"),
        Tensor("decoder_input_ids", "TYPE_INT32", (-1,), ragged=True),
        Tensor("decoder_input_lengths", "TYPE_INT32"),
    )


#: The perf-metric outputs are declared so that an ensemble can pass them on as the official one does; the python
#: models never write them (they refuse ``return_perf_metrics``).
OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1, -1)),
    Tensor("sequence_length", "TYPE_INT32", (-1,)),
    Tensor("cum_log_probs", "TYPE_FP32", (-1,)),
    Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
    Tensor("context_logits", "TYPE_FP32", (-1, -1)),
    Tensor("generation_logits", "TYPE_FP32", (-1, -1, -1)),
    Tensor("batch_index", "TYPE_INT32"),
    Tensor("sequence_index", "TYPE_INT32"),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32"),
    Tensor("kv_cache_reused_blocks", "TYPE_INT32"),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32"),
    Tensor("arrival_time_ns", "TYPE_INT64"),
    Tensor("first_scheduled_time_ns", "TYPE_INT64"),
    Tensor("first_token_time_ns", "TYPE_INT64"),
    Tensor("last_token_time_ns", "TYPE_INT64"),
    Tensor("acceptance_rate", "TYPE_FP32"),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32"),
    Tensor("total_draft_tokens", "TYPE_INT32"),
    Tensor("num_input_tokens", "TYPE_INT32"),
    Tensor("num_output_tokens", "TYPE_INT32"),
)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, as the TRT-LLM contract names them.

    ``top_k`` 0 means no top-k limit and ``top_p`` 0 (or >= 1) no nucleus limit; with both off the row is greedy,
    as in TRT-LLM. ``temperature`` 0 is greedy too. The penalties follow TRT-LLM's penalty kernel: they apply to
    every token seen so far, prompt included, after the temperature: repetition divides a positive logit (multiplies
    a negative one), presence subtracts once, frequency subtracts once per occurrence.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1 or (self.top_k <= 0 and self.top_p <= 0)

    @property
    def uses_top_p(self) -> bool:
        return 0 < self.top_p < 1

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


#: ``end_id`` value meaning "never stop before ``request_output_len`` tokens" (benchmarks use it for exact lengths).
NEVER_STOP = -1

#: ``len_penalty`` values that ask for nothing: TRT-LLM's default (0) and the customary 1.
NEUTRAL_LENGTH_PENALTIES = (None, 0.0, 1.0)

Words = tuple[tuple[int, ...], ...]


class SequenceOutput(list):
    """One sequence's output token ids: a list of ints, as :class:`ResponseSink` has always been given, carrying where
    the sequence belongs and what the request asked to come with it.

    ``row``: the prompt it answers (``batch_index``); ``index``: which of that prompt's ``num_return_sequences``
    (``sequence_index``). ``prompt_tokens``: how many leading ids are the prompt (an offline answer with
    ``exclude_input_in_output`` false). ``log_probs`` (one per generated id), ``cum_log_prob`` (their sum so far),
    ``generation_logits`` ([generated ids, vocab]) and ``context_logits`` ([prompt ids, vocab], sent once per
    sequence) are None unless asked for.
    """

    __slots__ = ("row", "index", "prompt_tokens", "log_probs", "cum_log_prob", "generation_logits", "context_logits")

    def __init__(
        self,
        tokens: Sequence[int] = (),
        *,
        row: int = 0,
        index: int = 0,
        prompt_tokens: int = 0,
        log_probs: list[float] | None = None,
        cum_log_prob: float | None = None,
        generation_logits: np.ndarray | None = None,
        context_logits: np.ndarray | None = None,
    ):
        super().__init__(tokens)
        self.row = row
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.log_probs = log_probs
        self.cum_log_prob = cum_log_prob
        self.generation_logits = generation_logits
        self.context_logits = context_logits

    @property
    def generated(self) -> int:
        return len(self) - self.prompt_tokens

    @classmethod
    def joined(cls, pieces: Sequence[SequenceOutput]) -> SequenceOutput:
        """Consecutive streamed pieces of one sequence as one piece."""
        first = pieces[0]
        return cls(
            [token for piece in pieces for token in piece],
            row=first.row,
            index=first.index,
            log_probs=None if first.log_probs is None else [value for piece in pieces for value in piece.log_probs],
            cum_log_prob=pieces[-1].cum_log_prob,
            generation_logits=None
            if first.generation_logits is None
            else np.concatenate([piece.generation_logits for piece in pieces]),
            context_logits=first.context_logits,
        )


class ResponseSink(Protocol):
    """Where one request's results go. Called from the generator's sender thread, in order."""

    def send_tokens(self, tokens: SequenceOutput) -> None:
        """Streaming: one sequence's ids generated since its last piece (the latest step's, or several steps' when
        the sender fell behind)."""

    def send_final(self, outputs: list[SequenceOutput] | None) -> None:
        """The request is complete: every sequence, by row then index (offline), or None after streamed pieces."""

    def send_error(self, message: str, cancelled: bool = False) -> None:
        """The request failed (or was cancelled); nothing more is sent for it."""

    def is_cancelled(self) -> bool:
        """Whether the client gave up on the request (polled now and then by the decode thread)."""


@dataclass
class GenerationRequest:
    """One client request: one or more prompts (rows) that share the settings below.

    ``end_id``: None or a negative value other than :data:`NEVER_STOP` stops at the model's end-of-sequence
    token(s); :data:`NEVER_STOP` (-1) never stops early; any other value stops at that token. The end token is not
    part of the output, a stop word is (as in TRT-LLM: its stop criterion ends the sequence on the word's last
    token and keeps it). ``stop_words``/``bad_words`` are token sequences matched against the prompt and what
    follows; a bad word's last token is never generated after the rest of it. ``min_tokens``: no end token before
    that many tokens. ``num_return_sequences`` independent sequences per prompt, the i-th seeded ``seed + i`` (as
    TRT-LLM seeds its child requests). ``embedding_bias`` is added to the logits (``[vocab]``).

    An encoder-decoder request (Whisper) brings each row's ``encoder_features`` (``[T, n_mels]`` log-mel frames,
    float, in the data type they were sent in); ``input_ids`` then holds the decoder prompts.
    """

    input_ids: list[list[int]]
    max_new_tokens: int
    encoder_features: list[np.ndarray] | None = None
    end_id: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    streaming: bool = False
    exclude_input: bool = True
    num_return_sequences: int = 1
    stop_words: Words = ()
    bad_words: Words = ()
    min_tokens: int = 0
    embedding_bias: np.ndarray | None = None
    beam_width: int = 1
    length_penalty: float | None = None
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False

    def stop_ids(self, defaults: frozenset[int]) -> frozenset[int]:
        """The tokens that end this request's sequences, given the checkpoint's end-of-sequence ids."""
        if self.end_id == NEVER_STOP:
            return frozenset()
        if self.end_id is None or self.end_id < 0:
            return defaults
        return frozenset((self.end_id,))


@dataclass(frozen=True)
class Capabilities:
    """What an engine's generator honours beyond the core of the contract; :func:`refusal` names the rest."""

    engine: str
    #: Stop and bad words of several tokens (else single tokens only).
    multi_token_words: bool = True
    #: Several return sequences of a greedy request (identical copies, as TRT-LLM's executor returns them).
    greedy_return_sequences: bool = True


def refusal(request: GenerationRequest, capabilities: Capabilities) -> str | None:
    """Why ``capabilities.engine`` cannot serve ``request`` as asked, in one line naming the input, or None."""
    engine = capabilities.engine
    if request.beam_width > 1:
        return f"beam_width {request.beam_width}: the {engine} engine decodes one beam (beam_width 1)"
    if request.length_penalty not in NEUTRAL_LENGTH_PENALTIES:
        return (
            f"length_penalty (len_penalty) {request.length_penalty:g}: it scores beam search, and the {engine} "
            "engine decodes one beam"
        )
    if request.return_perf_metrics:
        return f"return_perf_metrics true: the {engine} engine keeps no per-request KV-cache or timing metrics"
    if not capabilities.multi_token_words:
        for name, words in (("stop_words", request.stop_words), ("bad_words", request.bad_words)):
            longer = next((word for word in words if len(word) > 1), None)
            if longer is not None:
                return (
                    f"{name}: the {engine} engine takes single-token words only, and {list(longer)} has "
                    f"{len(longer)} tokens"
                )
    if request.num_return_sequences > 1 and request.sampling.greedy and not capabilities.greedy_return_sequences:
        return (
            f"num_return_sequences {request.num_return_sequences} with greedy decoding: the {engine} engine returns "
            "one greedy sequence; sample (top_k or top_p) to get several"
        )
    return None


def encoder_mismatch(has_features: bool, encoder_decoder: bool) -> str | None:
    """Why a request with (or without) encoder features does not fit a model that is (or is not) an
    encoder-decoder, in one line, or None."""
    if encoder_decoder and not has_features:
        return (
            "encoder_input_features missing: this is an encoder-decoder model (Whisper), send each request's "
            "log-mel features with the decoder prompt in decoder_input_ids"
        )
    if not encoder_decoder and has_features:
        return "encoder_input_features: this is a decoder-only model, it takes input_ids alone"
    return None


def word_list(array: np.ndarray) -> Words:
    """The words of one row of TensorRT-LLM's word-list layout ``[2, n]``: row 0 holds the words' token ids one
    after the other, row 1 each word's end offset into them, padded with -1 (empty words are dropped)."""
    ids, ends = array[0].tolist(), array[1].tolist()
    words, start = [], 0
    for end in ends:
        if end < 0:
            continue
        if end < start or end > len(ids):
            raise ValueError(f"malformed word list: offset {end} after {start} in {len(ids)} token ids")
        words.append(tuple(ids[start:end]))
        start = end
    return tuple(word for word in words if word)


def _present(inputs: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    values = inputs.get(name)
    return None if values is None or values.size == 0 else values


def _prompts(inputs: Mapping[str, np.ndarray], ids_name: str, lengths_name: str, required: bool) -> list[list[int]]:
    """The rows of ``ids_name`` (``[rows, n]``, right-padded), each cut to its ``lengths_name`` (the whole row when
    that input is optional and missing)."""
    ids = inputs.get(ids_name)
    if ids is None:
        raise ValueError(f"{ids_name} missing: the request holds no prompt")
    ids = ids.reshape(-1, ids.shape[-1])
    lengths = _present(inputs, lengths_name)
    if lengths is None and not required:
        lengths = np.full(len(ids), ids.shape[1])
    elif lengths is None:
        raise ValueError(f"{lengths_name} missing: it gives each row's length of {ids_name}")
    lengths = lengths.reshape(-1)
    if len(lengths) != len(ids) or np.any(lengths > ids.shape[1]) or np.any(lengths < 0):
        raise ValueError(f"{lengths_name} {lengths.tolist()} do not fit {ids_name} of shape {ids.shape}")
    return [row[:length].tolist() for row, length in zip(ids, lengths, strict=True)]


def _encoder_decoder_rows(inputs: Mapping[str, np.ndarray]) -> tuple[list[list[int]], list[np.ndarray]]:
    """The decoder prompts and the encoder features of an encoder-decoder request, row by row.

    As in TensorRT-LLM, ``input_lengths`` counts a row's mel frames (the features may be padded past them) and
    ``encoder_output_lengths`` the encoder frames they make, half as many.
    """
    if _present(inputs, "input_ids") is not None:
        raise ValueError(
            "input_ids: an encoder-decoder request takes its decoder prompt from decoder_input_ids; send no input_ids"
        )
    features = inputs["encoder_input_features"]
    if features.ndim == 2:
        features = features[None]
    if features.ndim != 3:
        raise ValueError(
            f"encoder_input_features of shape {list(features.shape)}: send [1, frames, n_mels] per request"
        )
    rows, frames = features.shape[:2]
    lengths = _present(inputs, "input_lengths")
    lengths = np.full(rows, frames) if lengths is None else lengths.reshape(-1).astype(np.int64)
    if len(lengths) != rows or np.any(lengths < 1) or np.any(lengths > frames):
        raise ValueError(
            f"input_lengths {lengths.tolist()} do not fit encoder_input_features of {rows} x {frames} frames: an "
            "encoder-decoder request's input_lengths is its number of mel frames"
        )
    output_lengths = _present(inputs, "encoder_output_lengths")
    if output_lengths is not None and (
        output_lengths.size != rows or np.any(output_lengths.reshape(-1) != lengths // 2)
    ):
        raise ValueError(
            f"encoder_output_lengths {output_lengths.reshape(-1).tolist()} must be input_lengths // 2 "
            f"({(lengths // 2).tolist()}): the encoder halves the mel frames"
        )
    prompts = _prompts(inputs, "decoder_input_ids", "decoder_input_lengths", required=False)
    if len(prompts) != rows:
        raise ValueError(f"decoder_input_ids has {len(prompts)} rows for {rows} rows of encoder_input_features")
    # copies: the input tensors are the server's shared memory, released once the request is answered or dropped,
    # and the encoder reads the features later, from the decode thread
    return prompts, [np.array(row[:length]) for row, length in zip(features, lengths, strict=True)]


def parse_request(
    inputs: Mapping[str, np.ndarray], *, decoupled: bool, exclude_input: bool, encoder_decoder: bool = False
) -> GenerationRequest:
    """A request from its contract tensors (by name).

    Per-row settings must agree across the rows of one request (one :class:`GenerationRequest` shares them). As in
    TensorRT-LLM's backend, a model that is not decoupled answers one sequence per request: streaming, several
    prompts and several return sequences need a decoupled one. ``pad_id`` is accepted and has nothing to pad:
    each response holds one sequence of one beam. An ``encoder_decoder`` model takes (and needs) the encoder-decoder
    inputs of :func:`encoder_decoder_inputs`; a decoder-only one refuses them. Raises ValueError naming what is
    wrong.
    """
    encoder_features = None
    has_features = _present(inputs, "encoder_input_features") is not None
    mismatch = encoder_mismatch(has_features, encoder_decoder)
    if mismatch:
        raise ValueError(mismatch)
    if has_features:
        prompts, encoder_features = _encoder_decoder_rows(inputs)
    else:
        prompts = _prompts(inputs, "input_ids", "input_lengths", required=True)
    rows = len(prompts)

    def shared(name: str, values: np.ndarray) -> np.ndarray:
        """The one row of ``values [rows, n]`` that every row repeats (compared row by row: ``np.unique`` over
        rows of a vocabulary-wide embedding_bias takes about a second)."""
        first = values[0]
        nan_equal = values.dtype.kind in "fc"
        if any(not np.array_equal(row, first, equal_nan=nan_equal) for row in values[1:]):
            raise ValueError(
                f"{name} differs between the {rows} rows of one request: send rows with different settings as "
                "separate requests"
            )
        return first

    def scalar(name: str, kind: type, default):
        values = inputs.get(name)
        if values is None or not values.size:
            return default
        return kind(shared(name, values.reshape(-1, 1))[0])

    def words(name: str) -> Words:
        values = inputs.get(name)
        if values is None or values.size == 0:
            return ()
        found = {word_list(row) for row in values.reshape(-1, 2, values.shape[-1])}
        if len(found) > 1:
            raise ValueError(f"{name} differs between the {rows} rows of one request: send them separately")
        return found.pop()

    streaming = scalar("streaming", bool, decoupled)
    num_return_sequences = scalar("num_return_sequences", int, 1) or 1
    if num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be at least 1 (got {num_return_sequences})")
    if not decoupled:
        offline = "needs a decoupled model (deploy with --mode streaming); this deployment is offline"
        if streaming:
            raise ValueError(f"streaming=true {offline}")
        if rows > 1:
            prompt_name = "input_ids" if encoder_features is None else "decoder_input_ids"
            raise ValueError(f"{prompt_name} with {rows} prompts {offline}: send one prompt per request")
        if num_return_sequences > 1:
            raise ValueError(f"num_return_sequences {num_return_sequences} {offline}")
    bias = inputs.get("embedding_bias")
    sampling = SamplingParams(
        temperature=scalar("temperature", float, 1.0),
        top_k=scalar("runtime_top_k", int, 0),
        top_p=scalar("runtime_top_p", float, 0.0),
        repetition_penalty=scalar("repetition_penalty", float, 1.0),
        seed=scalar("random_seed", int, 0),
        presence_penalty=scalar("presence_penalty", float, 0.0),
        frequency_penalty=scalar("frequency_penalty", float, 0.0),
    )
    request = GenerationRequest(
        input_ids=prompts,
        max_new_tokens=scalar("request_output_len", int, 0),
        encoder_features=encoder_features,
        end_id=scalar("end_id", int, None),
        sampling=sampling,
        streaming=streaming,
        exclude_input=scalar("exclude_input_in_output", bool, exclude_input),
        num_return_sequences=num_return_sequences,
        stop_words=words("stop_words_list"),
        bad_words=words("bad_words_list"),
        min_tokens=max(scalar("min_length", int, 0), 0),
        embedding_bias=None
        if bias is None or bias.size == 0
        else shared("embedding_bias", bias.reshape(-1, bias.shape[-1])).astype(np.float32),
        beam_width=scalar("beam_width", int, 1) or 1,
        length_penalty=scalar("len_penalty", float, None),
        return_log_probs=scalar("return_log_probs", bool, False),
        return_context_logits=scalar("return_context_logits", bool, False),
        return_generation_logits=scalar("return_generation_logits", bool, False),
        return_perf_metrics=scalar("return_perf_metrics", bool, False),
        return_num_input_tokens=scalar("return_num_input_tokens", bool, False),
        return_num_output_tokens=scalar("return_num_output_tokens", bool, False),
    )
    return request


def response_arrays(request: GenerationRequest, output: SequenceOutput) -> dict[str, np.ndarray]:
    """The contract's output tensors of the response carrying ``output``, by name.

    A response holds one sequence (or a streamed piece of it) laid out ``[1, 1, ...]``, with ``batch_index`` and
    ``sequence_index`` ``[1, 1]`` when the request has several rows or sequences, as TensorRT-LLM's backend sends
    them; the other outputs come when their ``return_*`` input asks.
    """
    arrays = {
        "output_ids": np.array(output, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(output)]], dtype=np.int32),
    }
    if request.return_log_probs:
        arrays["cum_log_probs"] = np.array([[output.cum_log_prob or 0.0]], dtype=np.float32)
        arrays["output_log_probs"] = np.array(output.log_probs or [], dtype=np.float32).reshape(1, 1, -1)
    if request.return_generation_logits and output.generation_logits is not None:
        arrays["generation_logits"] = np.asarray(output.generation_logits, dtype=np.float32)[None, None]
    if request.return_context_logits and output.context_logits is not None:
        arrays["context_logits"] = np.asarray(output.context_logits, dtype=np.float32)[None]
    if len(request.input_ids) > 1:
        arrays["batch_index"] = np.array([[output.row]], dtype=np.int32)
    if request.num_return_sequences > 1:
        arrays["sequence_index"] = np.array([[output.index]], dtype=np.int32)
    if request.return_num_input_tokens:
        arrays["num_input_tokens"] = np.array([[len(request.input_ids[output.row])]], dtype=np.int32)
    if request.return_num_output_tokens:
        arrays["num_output_tokens"] = np.array([[output.generated]], dtype=np.int32)
    return arrays


def special_tokens(model_dir: str | Path) -> tuple[frozenset[int], int]:
    """The checkpoint's end-of-sequence ids and its pad id, from ``generation_config.json`` and ``config.json``."""
    folder = Path(model_dir)
    sources = [
        json.loads(path.read_text())
        for name in ("generation_config.json", "config.json")
        if (path := folder / name).is_file()
    ]

    def first(key: str) -> int | list[int] | None:
        return next((source[key] for source in sources if source.get(key) is not None), None)

    eos = first("eos_token_id")
    end_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
    pad = first("pad_token_id")
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    if pad is None:
        pad = min(end_ids) if end_ids else 0
    return end_ids, pad
