"""Streaming detokenization: the text of a token stream, piece by piece, equal to the text of the whole.

A token's text can depend on the tokens before it: a sentencepiece word's leading space (``▁``) is dropped at the
start of a decoded text and kept after another word, and a character whose UTF-8 bytes span several tokens (byte-level
BPE, byte fallback) is only whole once its last byte comes. So a piece is decoded after a few tokens of what came
before it, and only the new text is sent: ``decode(before + piece)`` less ``decode(before)``. A character that may
still be incomplete (a trailing U+FFFD) is held back until the next piece settles it, or the stream ends
(:meth:`flush`).

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
    tokens of what was decoded kept to decode the next piece after (more while they decode to nothing: the next piece
    must not start the text); they are cut back to that when they reach four times as many, so that a piece costs
    about one decoding of a few tokens, and never grow past eight times as many. ``byte_pieces``: the ids of the
    tokenizer's byte pieces; ``dropped``: whether ``decode`` drops an id (a special token it skips, an id past the
    tokenizer's vocabulary, as the padded rows of a model's embedding), left out here too: a model that says nothing
    but such ids must not grow what each piece decodes.
    """

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        *,
        context: int = 4,
        byte_pieces: Collection[int] = (),
        dropped: Callable[[int], bool] = lambda token: False,
    ) -> None:
        self._decode = decode
        self._context = context
        self._byte_pieces = byte_pieces
        self._dropped = dropped
        self._ids: list[int] = []  # context tokens already sent, then the tokens held back
        self._sent_text = ""  # the text sent of what they decode to
        self._pending = False  # whether some of their text is held back

    def add(self, ids: Sequence[int]) -> str:
        """The text that ``ids``, the stream's next tokens, add (empty while it is only a character in the making)."""
        self._ids.extend(token for token in map(int, ids) if not self._dropped(token))
        self._pending = True
        if self._ids and self._ids[-1] in self._byte_pieces:
            return ""
        return self._send(hold_last=True)

    def flush(self) -> str:
        """At the end of the stream: the text held back (an incomplete character, as the whole text shows it)."""
        return self._send(hold_last=False) if self._pending else ""

    def _send(self, *, hold_last: bool) -> str:
        """The text of every id kept less what was sent: all of it, or with ``hold_last`` all but a trailing U+FFFD.

        A trailing U+FFFD may be a character whose last bytes are still to come; the text before it is settled
        (bytes decode to the same text whatever follows them, once a character starts after them), so only that one
        character waits, and a stream that keeps ending in one (invalid bytes, one after another) is still sent
        piece by piece, each decoding a few tokens.
        """
        text = self._decode(self._ids)
        held = 1 if hold_last and text.endswith(REPLACEMENT) else 0
        settled = text[: len(text) - held]
        new = settled[len(self._sent_text) :]
        self._sent_text, self._pending = settled, bool(held)
        if len(self._ids) >= 4 * self._context:
            start = len(self._ids) - self._context  # a character held back lies whole in what is kept
            while not (kept := self._decode(self._ids[start:])) and start > max(len(self._ids) - 8 * self._context, 0):
                start -= 1
            self._ids = self._ids[start:]
            self._sent_text = kept[: len(kept) - held]
        return new


class TokenizerText:
    """Text of token ids with a Hugging Face tokenizer, whole (:meth:`decode`) or streamed (:meth:`stream`): special
    tokens skipped or not, spaces never cleaned up (which would make a piece's text depend on the next one's)."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # whatever the model says of byte fallback (a Unigram model has no such setting, its decoder falls back
        # all the same): the pieces spelled as bytes are held as runs
        vocab = tokenizer.get_vocab()
        self._byte_pieces = frozenset(index for token, index in vocab.items() if BYTE_PIECE.fullmatch(token))
        specials = {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
        self._skipped = frozenset(specials | set(tokenizer.all_special_ids)) if skip_special_tokens else frozenset()
        self._vocab_size = len(tokenizer)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=self._skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def stream(self) -> StreamDetokenizer:
        """A detokenizer for one new stream."""
        return StreamDetokenizer(self.decode, byte_pieces=self._byte_pieces, dropped=self._drops)

    def _drops(self, token: int) -> bool:
        return token in self._skipped or not 0 <= token < self._vocab_size
