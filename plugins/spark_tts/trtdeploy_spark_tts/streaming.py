"""Streaming audio from semantic tokens as they arrive: the chunk schedule, left context, the cross-fade, and the
two wire formats.

The audio is finished on the server (:class:`AudioStream`):

* chunk sizes grow from ``first_tokens`` by ``growth`` up to ``max_tokens`` (a quick first chunk, then few
  vocoder calls), counted in semantic tokens, not in LLM responses;
* each vocoder call also re-reads ``context_tokens`` tokens before the chunk, so the audio at the chunk's start
  is what whole-utterance vocoding gives (the vocoder is convolutional: only tokens within its receptive radius
  change a sample);
* the last ``overlap_tokens`` of a chunk are held back and cross-faded (linearly) with the next call's version of
  the same tokens, which saw more of the future: no click at the seam;
* or, with ``lookahead_tokens`` (at least the vocoder's receptive radius), the last ``lookahead_tokens`` of a chunk
  are held back and replaced by the next call's version: every sample sent saw all the tokens that change it, so
  the stream is the offline audio exactly, at the price of that many tokens of latency per chunk.

Finished audio always has ``320 x`` the tokens received, as offline. It goes on the wire in one of two formats:

* ``overlapped`` (the official one, the default): every chunk after the first starts with a repeat of the last
  ``overlap`` samples of the chunk before. The official client drops the last ``overlap`` samples of each chunk,
  cross-fades them with the next chunk's first ``overlap`` samples and keeps the last chunk's tail; since both copies
  are the same samples, what it rebuilds is the finished audio (:class:`OverlappedChunks`);
* ``finished``: the chunks as they are, ready to play one after another; their concatenation is the audio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .prompt import SAMPLES_PER_TOKEN

StreamFormat = Literal["overlapped", "finished"]
STREAM_FORMATS: tuple[StreamFormat, ...] = ("overlapped", "finished")

#: Turns semantic codes into audio: ``len(codes) * 320`` float32 samples.
Vocode = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ChunkSchedule:
    """When streamed audio is sent (in semantic tokens; 50 tokens = 1 s)."""

    first_tokens: int = 50
    growth: float = 8.0
    max_tokens: int = 1500
    overlap_tokens: int = 5
    context_tokens: int = 48
    lookahead_tokens: int = 0

    def __post_init__(self) -> None:
        if self.first_tokens < 1 or self.max_tokens < self.first_tokens:
            raise ValueError(f"chunk sizes must satisfy 1 <= first ({self.first_tokens}) <= max ({self.max_tokens})")
        if self.growth < 1:
            raise ValueError(f"chunk growth must be >= 1, got {self.growth}")
        if not 0 <= 2 * self.overlap_tokens <= self.first_tokens:
            # the overlapped wire format needs a first chunk that still holds an overlap once its own is held back
            raise ValueError(f"overlap must be >= 0 and at most half the first chunk ({self.first_tokens} tokens)")
        if self.context_tokens < 0:
            raise ValueError(f"context must be >= 0 tokens, got {self.context_tokens}")
        if self.lookahead_tokens and self.first_tokens < self.lookahead_tokens + self.overlap_tokens:
            # the first chunk must still send a whole overlap once the lookahead is held back
            raise ValueError(
                f"a lookahead of {self.lookahead_tokens} tokens needs a first chunk of at least "
                f"{self.lookahead_tokens + self.overlap_tokens} tokens (lookahead + overlap), not {self.first_tokens}"
            )

    @property
    def held_tokens(self) -> int:
        """Tokens at the end of each vocoded window whose audio waits for the next window."""
        return max(self.overlap_tokens, self.lookahead_tokens)


class AudioStream:
    """Semantic tokens in (:meth:`push`, then :meth:`finish`), audio chunks out, ready to play one after another."""

    def __init__(self, schedule: ChunkSchedule, vocode: Vocode) -> None:
        self.schedule = schedule
        self.vocode = vocode
        self.codes: list[int] = []
        self.sent_tokens = 0  # tokens whose audio was sent
        self.vocoded_tokens = 0  # end of the last vocoded window
        self.next_chunk = schedule.first_tokens
        self.held = np.zeros(0, dtype=np.float32)  # audio of tokens [sent_tokens, vocoded_tokens), not yet sent

    def push(self, codes: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Add semantic codes; returns the audio chunks that became ready (often none)."""
        self.codes.extend(int(code) for code in codes)
        chunks = []
        while len(self.codes) - self.vocoded_tokens >= self.next_chunk:
            end = self.vocoded_tokens + self.next_chunk
            chunks.append(self._render(end, final=False))
            self.next_chunk = min(self.schedule.max_tokens, int(self.next_chunk * self.schedule.growth))
        return chunks

    def tokens_until_next_chunk(self) -> int:
        """Semantic tokens still to come before :meth:`push` returns the next chunk (at least 1)."""
        return self.vocoded_tokens + self.next_chunk - len(self.codes)

    def finish(self) -> np.ndarray | None:
        """The rest of the audio (None when everything was sent already)."""
        if len(self.codes) > self.vocoded_tokens:
            return self._render(len(self.codes), final=True)
        rest, self.held = self.held, np.zeros(0, dtype=np.float32)
        self.sent_tokens = self.vocoded_tokens
        return rest if rest.size else None

    def _render(self, end: int, *, final: bool) -> np.ndarray:
        """Vocode up to token ``end``; return the audio from ``sent_tokens`` on, holding back the last
        :attr:`~ChunkSchedule.held_tokens` tokens for the next call (all of it is returned when ``final``)."""
        start = max(0, self.sent_tokens - self.schedule.context_tokens)
        audio = np.asarray(self.vocode(np.asarray(self.codes[start:end], dtype=np.int32)), dtype=np.float32)
        audio = audio.reshape(-1)[(self.sent_tokens - start) * SAMPLES_PER_TOKEN :]
        if self.held.size and not self.schedule.lookahead_tokens:  # with a lookahead the new version is final
            audio = audio.copy()
            audio[: self.held.size] = crossfade(self.held, audio[: self.held.size])
        keep = 0 if final else min(self.schedule.held_tokens, end - self.sent_tokens)
        cut = audio.size - keep * SAMPLES_PER_TOKEN
        self.held = audio[cut:]
        self.sent_tokens = end - keep
        self.vocoded_tokens = end
        return audio[:cut]


def crossfade(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Fade linearly from ``old`` to ``new`` (same length) over their whole length."""
    ramp = (np.arange(old.size, dtype=np.float32) + 0.5) / max(old.size, 1)
    return old * (1.0 - ramp) + new * ramp


class OverlappedChunks:
    """Finished chunks in, the official wire format out: each chunk after the first is sent with the last
    ``overlap`` samples sent before it in front (:meth:`wire`).

    The official client rebuilds the audio exactly when every finished chunk holds at least ``overlap`` samples,
    which :class:`AudioStream` guarantees when its overlap is at least as long (its first chunk is at least twice
    the overlap, later ones are longer, and the last one carries the held-back overlap).
    """

    def __init__(self, overlap_samples: int) -> None:
        self.overlap = overlap_samples
        self.tail = np.zeros(0, dtype=np.float32)
        self.started = False

    def wire(self, audio: np.ndarray) -> np.ndarray:
        """What to send for the next finished chunk ``audio``."""
        sent = np.concatenate([self.tail, audio]) if self.started else audio
        self.started = True
        if self.overlap:
            self.tail = np.concatenate([self.tail, audio])[-self.overlap :]
        return sent
