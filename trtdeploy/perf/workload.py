"""The perf plugin API: how a model turns an input row into a Triton request and its responses into a result.

A model plugin returns a :class:`Workload` from ``ModelSpec.workload(deployment)``. ``trtdeploy perf`` then

1. calls :meth:`Workload.validate` once with the served model's configuration (:class:`ModelInfo`),
2. calls :meth:`Workload.make_request` once per input row, before any load is sent,
3. sends the requests, keeping each raw response and its arrival time (nothing else runs per response),
4. once a request is complete (and its slot has sent the next one), calls :meth:`Workload.parse_chunk` for each of
   its responses and :meth:`Workload.finish` once, computes the metrics of the workload's
   :attr:`Workload.family` from what they return, writes the request to the reports and forgets it.

Workloads are pickled into worker processes (``--workers``): keep heavy state (tokenizers) lazy and out of the
pickled state.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from ..errors import UsageError
from ..overrides import check_instance
from .inputs import InputRow, PromptLayout, load_dataset_rows, load_jsonl

if TYPE_CHECKING:
    import numpy as np

#: Which metrics apply: ``llm`` (TTFT, ITL, token throughput), ``tts`` (first-chunk latency, RTF, audio seconds) or
#: ``asr`` (first-partial latency, RTF of the audio sent, WER/CER of the transcripts).
MetricFamily = Literal["llm", "tts", "asr"]
#: Where output token counts come from: token ids the server returned, or the client re-tokenizing the text.
TokenSource = Literal["server", "retokenized"]


#: Optional sampling inputs, keyed by the RequestOptions field that sets them: the names a model may use for
#: each (TRT-LLM's ensemble and TTS models say top_k/top_p, its tensorrt_llm model runtime_top_k/runtime_top_p).
SAMPLING_INPUTS = {
    "temperature": ("temperature",),
    "top_k": ("top_k", "runtime_top_k"),
    "top_p": ("top_p", "runtime_top_p"),
    "seed": ("random_seed", "seed"),  # TRT-LLM 0.20+ names the tensorrt_llm model's input seed
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a Triton model, as its configuration declares it (dims without the batch dim)."""

    name: str
    datatype: str  # KServe name: INT32, BYTES, BOOL, FP32, ...
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class ModelInfo:
    """What the server says about the model under load."""

    name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    max_batch_size: int = 0
    decoupled: bool = False
    #: The string parameters of its configuration (``parameters { key: ... }``).
    parameters: Mapping[str, str] = field(default_factory=dict)

    def shape(self, *dims: int) -> list[int]:
        """The full tensor shape of one request: ``dims`` with a leading batch dim of 1 when the model batches."""
        return [1, *dims] if self.max_batch_size > 0 else list(dims)

    def scalar(self, name: str, value: Any) -> np.ndarray:
        """A one-element tensor for input ``name``, in the data type and shape the model declares (text goes in as
        UTF-8 bytes)."""
        import numpy as np
        from tritonclient.utils import triton_to_np_dtype

        if isinstance(value, str):
            value = value.encode("utf-8")
        return np.full(self.shape(1), value, dtype=triton_to_np_dtype(self.inputs[name].datatype))

    def sampling_input(self, key: str) -> str:
        """The name under which this model takes the sampling option ``key`` of :data:`SAMPLING_INPUTS` (the first
        name when it takes none)."""
        names = SAMPLING_INPUTS[key]
        return next((name for name in names if name in self.inputs), names[0])

    def sampling_inputs(self, options: RequestOptions) -> list[str]:
        """The inputs the sampling options set in ``options`` go to."""
        return [self.sampling_input(key) for key in SAMPLING_INPUTS if getattr(options, key) is not None]

    def sampling_tensors(self, options: RequestOptions) -> dict[str, np.ndarray]:
        """The tensors of the sampling options set in ``options``."""
        tensors = {}
        for key in SAMPLING_INPUTS:
            value = getattr(options, key)
            if value is not None:
                name = self.sampling_input(key)
                tensors[name] = self.scalar(name, value)
        return tensors

    def require_inputs(self, *names: str) -> None:
        """Raise UsageError naming every one of ``names`` the model does not take."""
        missing = [name for name in names if name not in self.inputs]
        if missing:
            raise UsageError(
                f"model {self.name!r} has no input {', '.join(repr(m) for m in missing)} "
                f"(its inputs: {', '.join(self.inputs) or 'none'})",
                hint="is --model the right Triton model for this workload?",
            )

    def require_outputs(self, *names: str) -> None:
        """Raise UsageError naming the first of ``names`` the model does not return."""
        missing = next((name for name in names if name not in self.outputs), None)
        if missing is not None:
            raise UsageError(
                f"model {self.name!r} has no output {missing!r} (its outputs: {', '.join(self.outputs) or 'none'})"
            )


@dataclass(frozen=True)
class RequestOptions:
    """Generation settings of a run (``None``: leave the model's default).

    Sampling follows TRT-LLM: with top_k and top_p both 0 (off, their defaults) it decodes greedily whatever the
    temperature. So a temperature > 0 without a top_k > 0 or a top_p means sampling from the whole distribution:
    ``top_p`` is set to 1.0. Temperature 0 is greedy.
    """

    #: Stream the response (only against a decoupled model).
    stream: bool = False
    max_tokens: int | None = None
    #: Keep generating past the end-of-sequence token, so exactly ``max_tokens`` come out.
    ignore_eos: bool = False
    #: >= 0; 0 is greedy.
    temperature: float | None = None
    #: >= 0; 0 is off.
    top_k: int | None = None
    #: In (0, 1].
    top_p: float | None = None
    seed: int | None = None
    #: ASR: the decoder prompt (``TEXT_PREFIX``) of every request; None: each row's language, transcribed.
    text_prefix: str | None = None

    def __post_init__(self) -> None:
        # written as "not (ok)" so that NaN is refused too
        if self.max_tokens is not None and not self.max_tokens >= 1:
            raise UsageError(f"--osl must be >= 1, got {self.max_tokens}")
        if self.temperature is not None and not (0 <= self.temperature < math.inf):
            raise UsageError(f"--temperature must be >= 0 (0: greedy), got {self.temperature:g}")
        if self.top_k is not None and not self.top_k >= 0:
            raise UsageError(f"--top-k must be >= 0 (0: off), got {self.top_k}")
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise UsageError(f"--top-p must be > 0 and <= 1, got {self.top_p:g}")
        if self.temperature and not self.top_k and self.top_p is None:
            object.__setattr__(self, "top_p", 1.0)  # temperature sampling over the whole distribution


@dataclass
class Request:
    """A request ready to send: named tensors (full shapes, batch dim included when the model batches)."""

    inputs: dict[str, np.ndarray]
    #: Outputs to ask for; empty asks for all.
    outputs: tuple[str, ...] = ()
    #: The expected output, if any (from :attr:`InputRow.reference`).
    reference: Any = None
    #: Input length in tokens, when the workload knows it.
    input_tokens: int | None = None
    #: Characters of the input text (TTS: the text to speak), when the workload knows it.
    input_characters: int | None = None
    #: Anything :meth:`Workload.parse_chunk`/:meth:`Workload.finish` need later (e.g. the prompt's token ids).
    context: Any = None
    #: A short name for the files of this request's output (e.g. the dataset's ``id``).
    label: str | None = None
    #: OpenAI-compatible endpoints: the path the request is posted to and its JSON body (``inputs`` is empty).
    path: str | None = None
    body: dict[str, Any] | None = None


@dataclass
class Chunk:
    """What one response (one chunk of a stream, or the whole answer offline) carried."""

    #: Output tokens in this chunk; None when only the text is known (``finish`` then counts).
    tokens: int | None = None
    text: str = ""
    #: The token ids themselves, when the workload needs them in ``finish`` (e.g. to decode the text).
    token_ids: np.ndarray | None = None
    #: Seconds of audio in this chunk (TTS).
    audio_seconds: float = 0.0
    #: The audio samples themselves (TTS; mono float32), for the saved output.
    audio: np.ndarray | None = None
    #: Token counts the server reported with this response (OpenAI's ``usage``: ``prompt_tokens``,
    #: ``completion_tokens``, the latter counting the whole answer so far). A response without content that
    #: carries them (the usage a stream ends with) passes them to the last chunk with content.
    usage: dict[str, Any] | None = None

    @property
    def has_content(self) -> bool:
        """Whether the chunk carries output (an empty chunk does not end the time to first token)."""
        return bool(self.tokens) or bool(self.text) or self.audio_seconds > 0


@dataclass
class Result:
    """Per-request fields computed when a request has finished."""

    #: Input tokens as the server counted them, when it says (instead of the request's own count).
    input_tokens: int | None = None
    #: Output tokens of the whole request.
    output_tokens: int | None = None
    #: Tokens in the first chunk with content (the ITL denominator excludes them).
    first_chunk_tokens: int | None = None
    token_source: TokenSource | None = None
    #: The full output text (scored against the reference).
    text: str | None = None
    #: Seconds of audio produced (TTS), or sent (ASR).
    audio_seconds: float | None = None
    #: The audio produced (TTS; mono float32 at ``sample_rate``), saved beside the reports.
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    #: Extra per-request scores (e.g. ``wer``); the report gives the mean of each over the level.
    scores: dict[str, float] = field(default_factory=dict)
    #: ASR: the transcript scored against the reference (:func:`~trtdeploy.perf.asr_workload.score_transcript`);
    #: None without a reference.
    accuracy: dict[str, Any] | None = None


class Workload(ABC):
    """How rows become requests for one Triton model, and responses become results.

    Its members are all that perf reads of a workload: a plugin's workload is checked against them
    (:func:`check_workload`) before perf uses it.
    """

    #: The metric family of this workload.
    family: ClassVar[MetricFamily] = "llm"
    #: The inputs and outputs every model of this workload's tensor contract has (:meth:`speaks`).
    contract_inputs: ClassVar[tuple[str, ...]] = ()
    contract_outputs: ClassVar[tuple[str, ...]] = ()

    #: The Triton model the requests go to.
    model_name: str
    #: Whether that model is decoupled (streams its answer), as the deployment says; at run time the served
    #: model's configuration decides whether requests stream (``--stream``/``--no-stream`` must agree with it).
    decoupled: bool
    #: Output tokens an LLM workload's requests ask for when neither the row nor ``--osl`` says (at most the
    #: deployment's max_output_len); None: perf's default.
    max_tokens: int | None = None

    @classmethod
    def speaks(cls, model: ModelInfo) -> bool:
        """Whether ``model`` has every input and output of this workload's tensor contract."""
        return set(cls.contract_inputs) <= set(model.inputs) and set(cls.contract_outputs) <= set(model.outputs)

    def validate(self, model: ModelInfo, options: RequestOptions) -> None:
        """Check that the served model fits this workload and ``options``; raise UsageError if not.

        Called once before any request is built. The default checks the tensor contract (UsageError naming what
        the model lacks); workloads that check ``options`` too call it first.
        """
        model.require_inputs(*self.contract_inputs)
        model.require_outputs(*self.contract_outputs)

    @abstractmethod
    def make_request(self, row: InputRow, options: RequestOptions, model: ModelInfo) -> Request:
        """Build the request for one row (called before the load starts, or for synthetic rows before the level
        that first sends it; may be slow, e.g. tokenize)."""

    @abstractmethod
    def parse_chunk(self, outputs: Mapping[str, Any], request: Request) -> Chunk:
        """Read one response: its output tensors (Triton), or its JSON object (an OpenAI-compatible server); called
        once its request is complete, between sends."""

    @abstractmethod
    def finish(self, request: Request, chunks: Sequence[Chunk]) -> Result:
        """Per-request fields from the chunks with content, in arrival order."""

    def count_text_tokens(self, text: str) -> int:
        """Tokens of generated text, as the model's tokenizer counts them (``--osl-from-reference`` asks each row
        for as many tokens as its reference output has). Default: UsageError (no tokenizer: not an LLM workload)."""
        raise UsageError(f"the {type(self).__name__} workload counts no tokens (it has no LLM tokenizer)")

    def load_input_data(self, path: Path) -> list[InputRow]:
        """Rows of ``--input-data PATH``; the default reads jsonl lines ``{"input", "output", "max_tokens"}``."""
        return load_jsonl(path)

    def load_dataset(
        self, source: str, *, split: str | None, column: str | None, reference_column: str | None
    ) -> list[InputRow]:
        """Rows of ``--dataset SOURCE``. The default reads a prompt column (and a reference column) as text."""
        return load_dataset_rows(source, split=split, column=column, reference_column=reference_column)

    def synthetic_rows(
        self,
        count: int,
        *,
        input_tokens: int | Sequence[int],
        output_tokens: int | Sequence[int] | None,
        seed: int,
        start: int = 0,
    ) -> list[InputRow]:
        """``count`` synthetic rows of exactly ``input_tokens`` tokens, asking for ``output_tokens`` (``--isl/--osl``;
        None: the run's default); a sequence gives each row its own (LLM workloads, ``--isl-stddev``).

        They are the rows ``start .. start + count - 1`` of the run: each depends only on ``(seed, its index)``, so
        that a run can make its rows a level at a time and get the ones it would have got at once.
        """
        raise UsageError(f"the {type(self).__name__} workload has no synthetic inputs (--isl/--osl)")

    def layout_rows(self, layouts: Sequence[PromptLayout], *, seed: int) -> list[InputRow]:
        """One row per :class:`~trtdeploy.perf.inputs.PromptLayout`: a prompt of blocks of random words that prompts
        naming the same blocks share (``--shared-prefixes``, ``--trace``), asking for the layout's ``max_tokens``.
        The words depend only on ``seed`` and the blocks' keys, so rows can be made a few at a time."""
        raise UsageError(f"the {type(self).__name__} workload has no prompts of token blocks (LLM workloads do)")

    def retarget(self, model_name: str) -> Workload:
        """A copy of this workload aimed at another Triton model that speaks the same tensor contract."""
        other = copy.copy(self)
        other.model_name = model_name
        return other


def check_workload(workload: Any, model: str) -> Workload:
    """``workload``, made by the plugin of ``model``, once it is a sound :class:`Workload` (every member set, none
    misspelt, methods perf can call, a known :attr:`~Workload.family`); UsageError naming the model otherwise (the
    plugin's fault, told in one line as a bad registration is, not a traceback)."""
    kind = f"the workload of model {model!r}"
    hint = f"fix or upgrade the plugin that provides model {model!r} (`trtdeploy plugins` names it)"
    try:
        check_instance(workload, kind, Workload)
    except TypeError as exc:
        raise UsageError(str(exc), hint=hint) from None
    if workload.family not in get_args(MetricFamily):
        known = ", ".join(get_args(MetricFamily))
        raise UsageError(
            f"{kind} {type(workload).__name__}: family {workload.family!r} is not one of {known}", hint=hint
        )
    return workload
