"""The LLM contract's requests and results as plain data, shared by every engine's Triton model (no torch here).

A Triton model serving the contract (see :mod:`trtdeploy.engines.triton_model`) parses each request into a
:class:`GenerationRequest` and hands it, with a :class:`ResponseSink`, to its engine's generator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, as the TRT-LLM contract names them.

    ``top_k`` 0 means no top-k limit and ``top_p`` 0 (or >= 1) no nucleus limit; with both off the row is greedy,
    as in TRT-LLM. ``temperature`` 0 is greedy too.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1 or (self.top_k <= 0 and self.top_p <= 0)

    @property
    def uses_top_p(self) -> bool:
        return 0 < self.top_p < 1


#: ``end_id`` value meaning "never stop before ``request_output_len`` tokens" (benchmarks use it for exact lengths).
NEVER_STOP = -1


class ResponseSink(Protocol):
    """Where one request's results go. Called from the generator's sender thread, in order."""

    def send_tokens(self, tokens: list[int]) -> None:
        """Streaming: the tokens generated since the last call (the latest step's, or several steps' when the
        sender fell behind; one sequence per streaming request)."""

    def send_final(self, outputs: list[list[int]] | None) -> None:
        """The request is complete: every sequence's output (non-streaming), or None after streamed tokens."""

    def send_error(self, message: str, cancelled: bool = False) -> None:
        """The request failed (or was cancelled); nothing more is sent for it."""

    def is_cancelled(self) -> bool:
        """Whether the client gave up on the request (polled now and then by the decode thread)."""


@dataclass
class GenerationRequest:
    """One client request: one or more prompts that share the settings below.

    ``end_id``: None or a negative value other than :data:`NEVER_STOP` stops at the model's end-of-sequence
    token(s); :data:`NEVER_STOP` (-1) never stops early; any other value stops at that token. The end token is not
    part of the output (as in TRT-LLM).
    """

    input_ids: list[list[int]]
    max_new_tokens: int
    end_id: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    streaming: bool = False
    exclude_input: bool = True

    def stop_ids(self, defaults: frozenset[int]) -> frozenset[int]:
        """The tokens that end this request's sequences, given the checkpoint's end-of-sequence ids."""
        if self.end_id == NEVER_STOP:
            return frozenset()
        if self.end_id is None or self.end_id < 0:
            return defaults
        return frozenset((self.end_id,))


def output_arrays(outputs: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The contract's ``output_ids [batch, 1, longest]`` (padded with ``pad_id``) and ``sequence_length [batch, 1]``."""
    longest = max((len(tokens) for tokens in outputs), default=0)
    ids = np.full((len(outputs), 1, longest), pad_id, dtype=np.int32)
    for row, tokens in enumerate(outputs):
        ids[row, 0, : len(tokens)] = tokens
    lengths = np.array([[len(tokens)] for tokens in outputs], dtype=np.int32)
    return ids, lengths


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
