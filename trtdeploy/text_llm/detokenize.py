"""Streaming detokenization: the text of a token stream, piece by piece, equal to the text of the whole.

A token's text can depend on the tokens before it: a sentencepiece word's leading space (``▁``) is dropped at the
start of a decoded text and kept after another word, and a character whose UTF-8 bytes span several tokens (byte-level
BPE, byte fallback) is only whole once its last byte comes. So a piece is decoded after a few tokens of what came
before it, and only the new text is sent: ``decode(before + piece)`` less ``decode(before)``. Text that ends in an
incomplete character (U+FFFD) is held back until the character is complete, or the stream ends (:meth:`flush`).

Sentencepiece tokenizers spell a character outside their vocabulary in byte pieces (``<0xE4>``), and decode a run of
them as a whole: its text if the bytes are valid UTF-8, else one U+FFFD per byte, so that a byte that comes later can
change the text of those before it. Such a run is held back until a piece that is not a byte ends it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

#: What decoders make of an incomplete UTF-8 sequence.
REPLACEMENT = "\ufffd"
#: A byte piece of a tokenizer with byte fallback.
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


class StreamDetokenizer:
    """One token stream's text, piece by piece (see the module docstring).

    ``decode``: ids to text, as the whole text is decoded (same special-token and clean-up settings). ``context``:
    tokens of what was sent kept to decode the next piece after (more when they decode to nothing, e.g. special tokens
    that ``decode`` skips: the next piece must not start the text); they are cut back to that when they reach four
    times as many, so that a piece costs about one decoding of a few tokens. ``byte_pieces``: the ids of the
    tokenizer's byte pieces; ``skipped``: the ids ``decode`` drops (they do not end a run of byte pieces).
    """

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        *,
        context: int = 4,
        byte_pieces: Collection[int] = (),
        skipped: Collection[int] = (),
    ) -> None:
        self._decode = decode
        self._context = context
        self._byte_pieces = byte_pieces
        self._skipped = skipped
        self._ids: list[int] = []  # context tokens already sent, then the tokens held back
        self._sent = 0  # how many of them are sent
        self._sent_text = ""  # their text

    def add(self, ids: Sequence[int]) -> str:
        """The text that ``ids``, the stream's next tokens, add (empty while a character is incomplete)."""
        self._ids.extend(int(token) for token in ids)
        if next((token for token in reversed(self._ids) if token not in self._skipped), None) in self._byte_pieces:
            return ""
        text = self._decode(self._ids)
        return "" if text.endswith(REPLACEMENT) else self._send(text)

    def flush(self) -> str:
        """At the end of the stream: the text held back (an incomplete character, as the whole text shows it)."""
        return self._send(self._decode(self._ids)) if self._sent < len(self._ids) else ""

    def _send(self, text: str) -> str:
        """``text``, the text of every id kept, less that of those sent; all of them are sent then."""
        new = text[len(self._sent_text) :]
        self._sent, self._sent_text = len(self._ids), text
        if len(self._ids) >= 4 * self._context:
            start = len(self._ids) - self._context
            while not (kept := self._decode(self._ids[start:])) and start > 0:
                start -= 1
            self._ids = self._ids[start:]
            self._sent, self._sent_text = len(self._ids), kept
        return new


class TokenizerText:
    """Text of token ids with a Hugging Face tokenizer, whole (:meth:`decode`) or streamed (:meth:`stream`): special
    tokens skipped or not, spaces never cleaned up (which would make a piece's text depend on the next one's)."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        fallback = getattr(tokenizer.backend_tokenizer.model, "byte_fallback", False)
        vocab = tokenizer.get_vocab() if fallback else {}
        self._byte_pieces = frozenset(index for token, index in vocab.items() if BYTE_PIECE.fullmatch(token))
        specials = {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
        self._skipped = frozenset(specials | set(tokenizer.all_special_ids)) if skip_special_tokens else frozenset()

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=self._skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def stream(self) -> StreamDetokenizer:
        """A detokenizer for one new stream."""
        return StreamDetokenizer(self.decode, byte_pieces=self._byte_pieces, skipped=self._skipped)
