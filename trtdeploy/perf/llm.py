"""Workloads for text LLMs: the text contract (``ensemble``) and the token-level LLM contract (``tensorrt_llm``).

numpy, tritonclient and transformers are imported where used: plugins import this module when they load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backend_utils import first_sequence
from ..errors import NotFoundError, UsageError
from .workload import Chunk, InputRow, ModelInfo, Request, RequestOptions, Result, Workload

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedTokenizerBase

    from .inputs import BlockPrompts, PromptLayout


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The Hugging Face tokenizer in ``path``, from local files only."""
    if not path.is_dir():
        raise NotFoundError(f"tokenizer folder {path} does not exist")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise NotFoundError(f"no usable tokenizer in {path} ({exc})") from None


def _token_ids(outputs: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The first sequence of ``output_ids`` (trimmed to ``sequence_length`` when given), or None if absent."""
    ids = outputs.get("output_ids")
    return None if ids is None else first_sequence(ids, outputs.get("sequence_length"))


def _text(outputs: Mapping[str, np.ndarray], name: str) -> str:
    values = outputs.get(name)
    if values is None:
        return ""
    return "".join(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in values.reshape(-1))


class _LLMWorkload(Workload):
    """What both LLM workloads share: the tokenizer (lazy, not pickled), generation inputs, synthetic prompts."""

    family = "llm"

    def __init__(
        self,
        model_name: str,
        tokenizer_dir: str | Path | None = None,
        *,
        decoupled: bool = False,
        max_tokens: int = 128,
        chat_template: bool = False,
        add_special_tokens: bool = True,
    ) -> None:
        self.model_name = model_name
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        self.decoupled = decoupled
        #: Output length when neither the row nor the run (``--osl``) gives one.
        self.max_tokens = max_tokens
        #: How the deployment turns a prompt into ids (its preprocessing): as one user turn of the tokenizer's chat
        #: template, or encoded with (or without) the tokenizer's special tokens.
        self.chat_template = chat_template
        self.add_special_tokens = add_special_tokens
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._block_prompts: BlockPrompts | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tokenizer"] = state["_block_prompts"] = None
        return state

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            if self.tokenizer_dir is None:
                raise UsageError(f"the {type(self).__name__} for {self.model_name!r} has no tokenizer folder")
            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer

    def prompt_ids(self, text: str) -> list[int]:
        """The prompt's token ids as the model sees them: wrapped in the chat template, or with the special tokens
        (such as BOS) the tokenizer adds, as the deployment's preprocessing does."""
        if self.chat_template:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
            )
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens))

    def count_text_tokens(self, text: str) -> int:
        """Tokens of generated text (no special tokens added)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def synthetic_rows(
        self,
        count: int,
        *,
        input_tokens: int | Sequence[int],
        output_tokens: int | Sequence[int] | None,
        seed: int,
        start: int = 0,
    ) -> list[InputRow]:
        from .inputs import synthetic_prompts

        prompts = synthetic_prompts(
            self.tokenizer, count, input_tokens, seed=seed, prompt_ids=self.prompt_ids, start=start
        )
        lengths = [output_tokens] * count if output_tokens is None or isinstance(output_tokens, int) else output_tokens
        return [InputRow(input=prompt, max_tokens=length) for prompt, length in zip(prompts, lengths, strict=True)]

    def layout_rows(self, layouts: Sequence[PromptLayout], *, seed: int) -> list[InputRow]:
        from .inputs import BlockPrompts

        if self._block_prompts is None or self._block_prompts.seed != seed:  # its vocabulary takes a while
            self._block_prompts = BlockPrompts(self.tokenizer, seed, self.prompt_ids)
        prompts = self._block_prompts
        return [InputRow(input=prompts.prompt(layout), max_tokens=layout.max_tokens) for layout in layouts]

    def _validate_options(self, model: ModelInfo, options: RequestOptions) -> None:
        wanted = model.sampling_inputs(options)
        if options.temperature and options.top_p == 1.0 and not options.top_k:  # temperature sampling
            top_p = model.sampling_input("top_p")
            if top_p not in model.inputs and model.sampling_input("temperature") in model.inputs:
                raise UsageError(
                    f"model {model.name!r} has no input 'top_p': with top_k and top_p off (0) TRT-LLM decodes "
                    "greedily whatever the temperature, so --temperature samples with top_p 1.0",
                    hint="pass --top-k K as well, or leave --temperature out",
                )
        if options.ignore_eos:
            wanted.append("end_id")
        model.require_inputs(*wanted)

    def _generation_inputs(
        self, row: InputRow, options: RequestOptions, model: ModelInfo, *, length_input: str, stream_input: str
    ) -> dict[str, np.ndarray]:
        max_tokens = row.max_tokens or options.max_tokens or self.max_tokens
        tensors = {length_input: model.scalar(length_input, max_tokens)}
        if stream_input in model.inputs:
            tensors[stream_input] = model.scalar(stream_input, options.stream)
        if options.ignore_eos:
            tensors["end_id"] = model.scalar("end_id", -1)
        if "exclude_input_in_output" in model.inputs:
            tensors["exclude_input_in_output"] = model.scalar("exclude_input_in_output", True)
        tensors.update(model.sampling_tensors(options))
        return tensors


class TextLLMWorkload(_LLMWorkload):
    """A text LLM behind the text contract of a TRT-LLM-style ``ensemble``.

    Inputs: ``text_input`` BYTES, ``max_tokens`` INT32, and when the model declares them ``stream``, ``end_id``
    (-1 with ``--ignore-eos``), ``exclude_input_in_output``, ``temperature``, ``top_k``/``runtime_top_k``,
    ``top_p``/``runtime_top_p``, ``random_seed``/``seed``. Outputs: ``text_output`` BYTES and, when present,
    ``output_ids`` INT32 (the generated token ids, which give exact token counts and, decoded with
    ``tokenizer_dir``, the text; without them the text is re-tokenized with ``tokenizer_dir``).
    """

    contract_inputs = ("text_input", "max_tokens")
    contract_outputs = ("text_output",)

    def validate(self, model: ModelInfo, options: RequestOptions) -> None:
        super().validate(model, options)
        self._validate_options(model, options)

    def make_request(self, row: InputRow, options: RequestOptions, model: ModelInfo) -> Request:
        text = str(row.input)
        tensors = {"text_input": model.scalar("text_input", text)}
        tensors.update(self._generation_inputs(row, options, model, length_input="max_tokens", stream_input="stream"))
        outputs = ("text_output", "output_ids") if "output_ids" in model.outputs else ("text_output",)
        input_tokens = len(self.prompt_ids(text)) if self.tokenizer_dir is not None else None
        return Request(inputs=tensors, outputs=outputs, reference=row.reference, input_tokens=input_tokens)

    def parse_chunk(self, outputs: Mapping[str, np.ndarray], request: Request) -> Chunk:
        ids = _token_ids(outputs)
        tokens = None if ids is None else int(ids.size)
        return Chunk(tokens=tokens, text=_text(outputs, "text_output"), token_ids=ids)

    def finish(self, request: Request, chunks: Sequence[Chunk]) -> Result:
        """Token counts from the returned ids, else from re-tokenizing the text. The text: the ids decoded at
        once when the responses carry them and there is a tokenizer (TensorRT-LLM's own ensemble decodes a streamed
        answer's pieces one by one, which drops a sentencepiece word's leading space and breaks a character whose
        bytes span two tokens; trtdeploy's decodes them in context), else the pieces joined.

        No chunk with content: the model generated nothing (end-of-sequence first), a success with 0 tokens.
        """
        if not chunks:
            ids_asked = "output_ids" in request.outputs
            source = "server" if ids_asked else "retokenized" if self.tokenizer_dir is not None else None
            return Result(output_tokens=0, token_source=source, text="")
        text = "".join(chunk.text for chunk in chunks)
        if all(chunk.token_ids is not None for chunk in chunks):
            total = sum(chunk.tokens or 0 for chunk in chunks)
            if self.tokenizer_dir is not None:
                import numpy as np

                ids = np.concatenate([chunk.token_ids for chunk in chunks]).tolist()
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return Result(output_tokens=total, first_chunk_tokens=chunks[0].tokens, token_source="server", text=text)
        if self.tokenizer_dir is None:
            return Result(text=text)
        return Result(
            output_tokens=self.count_text_tokens(text),
            first_chunk_tokens=self.count_text_tokens(chunks[0].text),
            token_source="retokenized",
            text=text,
        )


class TokenLLMWorkload(_LLMWorkload):
    """The LLM contract itself (the ``tensorrt_llm`` model): token ids in and out, tokenized client-side.

    Inputs: ``input_ids`` INT32, ``input_lengths``, ``request_output_len``, and when declared ``streaming``,
    ``end_id``, ``exclude_input_in_output`` (true) and the sampling inputs. Outputs: ``output_ids``
    (+ ``sequence_length``). A model without ``exclude_input_in_output`` answers offline requests with the prompt
    followed by the generated ids: the prompt's length is dropped. For engine-level benchmarks without the text
    pre/post-processing.
    """

    contract_inputs = ("input_ids", "input_lengths", "request_output_len")
    contract_outputs = ("output_ids",)

    def validate(self, model: ModelInfo, options: RequestOptions) -> None:
        super().validate(model, options)
        self._validate_options(model, options)
        self.tokenizer  # noqa: B018 - fail before the load when there is no tokenizer

    def make_request(self, row: InputRow, options: RequestOptions, model: ModelInfo) -> Request:
        import numpy as np

        ids = np.asarray(self.prompt_ids(str(row.input)), dtype=np.int32)
        tensors = {
            "input_ids": ids.reshape(model.shape(ids.size)),
            "input_lengths": model.scalar("input_lengths", ids.size),
        }
        tensors.update(
            self._generation_inputs(row, options, model, length_input="request_output_len", stream_input="streaming")
        )
        outputs = tuple(name for name in ("output_ids", "sequence_length") if name in model.outputs)
        # TRT-LLM returns the prompt before the generated ids in an offline answer unless the request sets
        # exclude_input_in_output (sent whenever the model takes it); streamed responses never hold the prompt
        echoed = 0 if options.stream or "exclude_input_in_output" in model.inputs else int(ids.size)
        return Request(
            inputs=tensors, outputs=outputs, reference=row.reference, input_tokens=int(ids.size), context=echoed
        )

    def parse_chunk(self, outputs: Mapping[str, np.ndarray], request: Request) -> Chunk:
        ids = _token_ids(outputs)
        if ids is None:
            return Chunk()
        echoed = request.context or 0
        if echoed:  # the prompt, echoed: drop exactly its length
            if ids.size < echoed:
                raise ValueError(f"{ids.size} output ids, fewer than the {echoed} of the prompt they should start with")
            ids = ids[echoed:]
        return Chunk(tokens=int(ids.size), text="", token_ids=ids)

    def finish(self, request: Request, chunks: Sequence[Chunk]) -> Result:
        total = sum(chunk.tokens or 0 for chunk in chunks)
        text = None
        if request.reference is not None and chunks:
            ids = [int(token) for chunk in chunks for token in chunk.token_ids]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        first = chunks[0].tokens if chunks else None
        return Result(output_tokens=total, first_chunk_tokens=first, token_source="server", text=text)
