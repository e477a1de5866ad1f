"""Input rows for perf: a jsonl file, a Hugging Face dataset (Hub name or local files), or synthetic prompts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NetworkError, NotFoundError, UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Columns tried, in order, when ``--column`` is not given.
DEFAULT_COLUMNS = ("input", "text", "prompt", "question")
#: Column read as the reference output when ``--reference-column`` is not given (if the dataset has it).
DEFAULT_REFERENCE_COLUMN = "output"
#: The random stream of the words of prompt blocks, kept apart from the streams of arrivals and drawn lengths
#: (:data:`~trtdeploy.perf.loadgen.ARRIVAL_STREAM` and the next one) and from the synthetic prompts' ``(seed, row)``.
BLOCK_STREAM = (1 << 40) + 2
#: The kinds of prompt blocks (the first part of a block's key): a prompt's own words, a shared prefix, a block of a
#: trace (keyed by its hash id).
OWN_BLOCK, PREFIX_BLOCK, TRACE_BLOCK = 0, 1, 2
_LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class InputRow:
    """One row of the input data: what to send, and what should come back."""

    #: The prompt (text for LLMs; whatever the workload expects otherwise).
    input: Any
    #: The expected output, if the data has one (scored for accuracy).
    reference: Any = None
    #: Output length for this row (synthetic prompts, a jsonl "max_tokens"); None: the run's (``--osl``).
    max_tokens: int | None = None
    #: The whole source row, for workloads that need more columns than ``input``.
    fields: Mapping[str, Any] = field(default_factory=dict)


def numbered_lines(path: Path) -> Iterator[tuple[str, str]]:
    """``(file:line, text)`` for every non-blank line of an input file; errors name the file."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise NotFoundError(f"input file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read input file {path}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield f"{path}:{number}", line


def json_object(line: str, where: str) -> dict[str, Any]:
    """One jsonl line as an object, or a UsageError naming ``where``."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(data).__name__}")
    _check_encodable(data, where)
    return data


def _check_encodable(value: Any, where: str) -> None:
    """Refuse text that cannot be sent as UTF-8: JSON's ``\\ud800`` escapes decode to lone surrogates."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = value[exc.start : exc.end]
            raise UsageError(
                f"{where}: the text holds a lone surrogate ({bad.encode('unicode_escape').decode()}), which is not "
                "valid Unicode and cannot be sent",
                hint="write the character itself, or a valid \\uXXXX\\uXXXX surrogate pair",
            ) from None
    elif isinstance(value, dict):
        for item in value.values():
            _check_encodable(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_encodable(item, where)


def load_jsonl(path: Path | str) -> list[InputRow]:
    """Rows of a jsonl file: one object per line with ``input``, optional ``output`` (reference), ``max_tokens``.

    Blank lines are skipped; anything else that is not such an object is a UsageError naming ``file:line``.
    """
    path = Path(path)
    rows: list[InputRow] = []
    for where, line in numbered_lines(path):
        data = json_object(line, where)
        if "input" not in data:
            keys = ", ".join(data) or "none"
            raise UsageError(
                f'{where}: no "input" key (keys: {keys})', hint='each line needs {"input": ..., "output": ...}'
            )
        max_tokens = data.get("max_tokens")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise UsageError(f'{where}: "max_tokens" must be a positive integer, got {max_tokens!r}')
        rows.append(InputRow(input=data["input"], reference=data.get("output"), max_tokens=max_tokens, fields=data))
    if not rows:
        raise UsageError(f"input file {path} has no rows")
    return rows


def load_dataset_rows(
    source: str,
    *,
    split: str | None = None,
    column: str | None = None,
    reference_column: str | None = None,
) -> list[InputRow]:
    """Rows of a dataset through ``datasets``: a Hub name, or a local folder / .json / .jsonl / .csv / .parquet."""
    dataset = load_split(source, split)
    columns = list(dataset.column_names)
    if column is None:
        column = next((name for name in DEFAULT_COLUMNS if name in columns), None)
        if column is None:
            raise NotFoundError(
                f"dataset {source!r} has none of the columns {', '.join(DEFAULT_COLUMNS)}",
                hint=f"pass --column (available columns: {', '.join(columns)})",
            )
    elif column not in columns:
        raise NotFoundError(
            f"dataset {source!r} has no column {column!r}", hint=f"available columns: {', '.join(columns)}"
        )
    if reference_column is None:
        reference_column = DEFAULT_REFERENCE_COLUMN if DEFAULT_REFERENCE_COLUMN in columns else None
    elif reference_column not in columns:
        raise NotFoundError(
            f"dataset {source!r} has no column {reference_column!r}", hint=f"available columns: {', '.join(columns)}"
        )
    rows = [
        InputRow(input=record[column], reference=record[reference_column] if reference_column else None, fields=record)
        for record in dataset
    ]
    if not rows:
        raise UsageError(f"dataset {source!r} has no rows")
    return rows


def load_split(source: str, split: str | None) -> Any:
    """One split of a dataset (see :func:`load_dataset_rows` for the sources); errors name the fix."""
    try:
        import datasets
    except ImportError as exc:
        raise UsageError(
            f"--dataset needs the `datasets` package, which cannot be imported ({exc})",
            hint="install it with `pip install 'trtdeploy[perf]'`, or use --input-data FILE.jsonl",
        ) from None
    path = Path(source).expanduser()
    try:
        if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            loaded = datasets.load_from_disk(str(path))
        elif path.is_dir():
            loaded = datasets.load_dataset(str(path))
        elif path.is_file():
            builder = _LOCAL_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise UsageError(
                    f"cannot read {path} as a dataset", hint=f"use one of {', '.join(_LOCAL_BUILDERS)} or a folder"
                )
            loaded = datasets.load_dataset(builder, data_files=str(path))
        else:  # a Hub name: download only the split asked for
            loaded = datasets.load_dataset(source, split=split) if split else datasets.load_dataset(source)
    except ConnectionError as exc:
        raise NetworkError(
            f"cannot load dataset {source!r} from the Hugging Face Hub: {exc}",
            hint="pass a local path (a folder, or a .json/.jsonl/.csv/.parquet file), or --input-data FILE.jsonl",
        ) from None
    except FileNotFoundError as exc:
        raise NotFoundError(f"dataset {source!r} not found ({exc})") from None
    except datasets.exceptions.DatasetNotFoundError as exc:
        raise NotFoundError(f"dataset {source!r} not found ({exc})") from None
    except datasets.exceptions.DatasetGenerationError as exc:  # a local file it cannot parse
        reason = str(exc.__cause__ or exc).strip().splitlines()[0]
        raise UsageError(
            f"cannot read dataset {source!r}: {reason}",
            hint="fix the file (each line of a .jsonl one valid JSON object), or pass --input-data FILE.jsonl",
        ) from None
    except ValueError as exc:
        if split is None or "split" not in str(exc).lower():
            raise
        raise NotFoundError(f"dataset {source!r} has no split {split!r} ({exc})") from None
    if not isinstance(loaded, datasets.DatasetDict):
        return loaded
    splits = list(loaded)
    if split is None:
        if len(splits) != 1:
            raise UsageError(f"dataset {source!r} has splits {', '.join(splits)}", hint="choose one with --split")
        split = splits[0]
    if split not in loaded:
        raise NotFoundError(f"dataset {source!r} has no split {split!r}", hint=f"available splits: {', '.join(splits)}")
    return loaded[split]


def synthetic_prompts(
    tokenizer: PreTrainedTokenizerBase,
    count: int,
    length: int | Sequence[int],
    *,
    seed: int,
    prompt_ids: Callable[[str], list[int]] | None = None,
    start: int = 0,
) -> list[str]:
    """``count`` random prompts that the model sees as exactly ``length`` tokens (or ``length[i]`` for the i-th,
    at least one token beyond what the deployment adds to every prompt).

    ``prompt_ids`` gives the ids the deployment makes of a prompt (a chat template and special tokens included;
    default: ``tokenizer.encode`` with its special tokens). Each prompt depends only on ``(seed, its index)``, the
    indices counting from ``start``, so a run is reproducible and prompts do not share a prefix.
    """
    import numpy as np

    encode = prompt_ids or (lambda text: tokenizer.encode(text, add_special_tokens=True))
    overhead = len(encode(""))
    if isinstance(length, int):
        if length - overhead < 1:
            raise UsageError(
                f"--isl {length} is too short for this model: its preprocessing (chat template, special tokens) adds "
                f"{overhead} tokens to every prompt",
                hint=f"pass --isl {overhead + 1} or more",
            )
        lengths = [length] * count
    else:  # drawn lengths: the shortest prompt is one token beyond what the deployment adds
        lengths = [max(drawn, overhead + 1) for drawn in length]
    special = set(tokenizer.all_special_ids)
    candidates = [i for i in range(len(tokenizer)) if i not in special]
    pieces = tokenizer.batch_decode([[i] for i in candidates])
    vocab = np.array(
        [
            i
            for i, piece in zip(candidates, pieces, strict=True)
            if piece.strip() and piece.isascii() and piece.isprintable()
        ]
    )
    if vocab.size == 0:
        raise UsageError("this tokenizer has no printable tokens to build synthetic prompts from")
    prompts = []
    for index, length in enumerate(lengths, start=start):
        rng = np.random.default_rng([seed, index])
        content = length - overhead
        for _ in range(8):  # the words may merge with what the template puts around them: adjust and retry
            text = _exact_prompt(tokenizer, vocab, content, rng)
            missing = length - len(encode(text))
            if missing == 0:
                break
            content += missing
        else:
            raise UsageError(f"could not build a prompt of exactly {length} tokens for this deployment")
        prompts.append(text)
    return prompts


def _exact_prompt(tokenizer: PreTrainedTokenizerBase, vocab: Any, length: int, rng: Any) -> str:
    """Decode random tokens, re-encode, and trim or top up until the text encodes to exactly ``length`` tokens."""
    ids = rng.choice(vocab, length).tolist()
    for _ in range(64):
        text = tokenizer.decode(ids)
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == length:
            return text
        ids = encoded[:length] if len(encoded) > length else encoded + rng.choice(vocab, length - len(encoded)).tolist()
    raise UsageError(f"could not build a prompt of exactly {length} tokens with this tokenizer")


@dataclass(frozen=True)
class PromptLayout:
    """A synthetic prompt made of blocks of random words, for prompts that share prefixes.

    ``blocks`` are ``(key, words)`` pairs laid end to end after the tokens the deployment adds before every prompt
    (BOS, the chat template's opening), cut where the prompt reaches ``length`` tokens as the model sees them. The
    words of a block depend only on the run's seed and its key, so prompts whose blocks start with the same keys
    share those tokens, as a prefix cache sees them. The first ``whole`` blocks must fit whole, followed by at least
    one word of the rest (a shared prefix and the request's own part); otherwise a prompt too short for what the
    deployment adds gets one word.
    """

    blocks: tuple[tuple[tuple[int, ...], int], ...]
    length: int
    max_tokens: int | None = None
    whole: int = 0


def word_vocabulary(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Words that ``tokenizer`` makes one token of both at the start of a text and after a space: a text of such
    words joined by spaces has one token per word, and no word's token depends on its neighbours (byte-level BPE
    and SentencePiece split words at spaces before merging)."""
    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer)) if i not in special])
    words = sorted({piece.strip() for piece in pieces if piece.strip().isascii() and piece.strip().isalpha()})
    pairs = tokenizer([f"{word} {word}" for word in words], add_special_tokens=False)["input_ids"] if words else []
    return [word for word, ids in zip(words, pairs, strict=True) if len(ids) == 2]


class BlockPrompts:
    """Builds the prompts of :class:`PromptLayout` for one deployment's tokenizer and prompt format."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, seed: int, prompt_ids: Callable[[str], list[int]] | None = None
    ) -> None:
        import numpy as np

        self.encode = prompt_ids or (lambda text: tokenizer.encode(text, add_special_tokens=True))
        self.seed = seed
        self.words = np.array(word_vocabulary(tokenizer))
        if self.words.size == 0:
            raise UsageError("this tokenizer has no word of one token to build prompts with shared blocks from")
        #: Tokens the deployment adds to every prompt.
        self.overhead = len(self.encode(""))
        if len(self.encode(str(self.words[0]))) != self.overhead + 1:
            raise UsageError("this deployment's prompt format does not keep a one-token word as one token")

    def _words(self, key: tuple[int, ...], count: int) -> list[str]:
        import numpy as np

        rng = np.random.default_rng([self.seed, BLOCK_STREAM, *key])
        return self.words[rng.integers(0, self.words.size, count)].tolist()

    def prompt(self, layout: PromptLayout) -> str:
        """The prompt of ``layout``: exactly ``layout.length`` tokens as the model sees them (see
        :class:`PromptLayout` for a length too short)."""
        room = layout.length - self.overhead
        fixed = sum(words for _, words in layout.blocks[: layout.whole])
        if layout.whole and room <= fixed:
            raise UsageError(
                f"a prompt of {layout.length} tokens cannot hold its {fixed}-token shared prefix and one token of "
                f"its own: this deployment adds {self.overhead} tokens to every prompt",
                hint=f"pass --isl {self.overhead + 1} or more",
            )
        room = max(room, 1)
        words: list[str] = []
        for key, count in layout.blocks:
            if len(words) + count > room:
                words += self._words(key, count)[: room - len(words)]
                break
            words += self._words(key, count)
        text = " ".join(words)
        if len(self.encode(text)) != room + self.overhead:
            raise UsageError(f"could not build a prompt of exactly {layout.length} tokens for this deployment")
        return text
