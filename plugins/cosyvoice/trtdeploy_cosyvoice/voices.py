"""Registered voices: what the flow and the LLM need of a reference (its text, speech tokens, mel and speaker
embedding), kept under an id so that later requests name the voice instead of sending the audio again.

This is the official runtime's ``spk2info`` done as an API: a request that sends a reference with a ``speaker_id``
registers (or replaces) that voice, and a request that sends only the id uses it, skipping the speech tokenizer and
the speaker encoder. Voices are files in the deployment's ``speakers/`` folder, one ``<id>.npz`` each, written
atomically: every BLS instance (each a process of its own) sees them, and they outlive a restart.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The id the official client's ``--use-spk2info-cache`` relies on: a request with neither a reference nor an id
#: is spoken in this voice, once registered.
DEFAULT_SPEAKER = "001"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Voice:
    text: str
    #: Speech tokens ``[T]`` (int32) and mel frames ``[2T, 80]`` (float32) of the reference, aligned.
    tokens: np.ndarray
    mel: np.ndarray
    #: The 192-d speaker embedding (float32).
    embedding: np.ndarray


class VoiceStore:
    def __init__(self, folder: Path | str):
        self.folder = Path(folder)

    @staticmethod
    def check_id(speaker_id: str) -> None:
        """ValueError unless the id is 1 to 64 letters, digits, ``_``, ``.`` or ``-`` (not starting with the
        last three): ids name files."""
        if not _ID.fullmatch(speaker_id):
            raise ValueError(
                f"speaker_id {speaker_id!r} is not a valid id: use 1 to 64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )

    def save(self, speaker_id: str, voice: Voice) -> None:
        self.check_id(speaker_id)
        self.folder.mkdir(parents=True, exist_ok=True)
        descriptor, scratch = tempfile.mkstemp(dir=self.folder, prefix=f".{speaker_id}.", suffix=".npz")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                np.savez(
                    handle,
                    text=np.array(voice.text),
                    tokens=voice.tokens.astype(np.int32),
                    mel=voice.mel.astype(np.float32),
                    embedding=voice.embedding.astype(np.float32),
                )
            os.replace(scratch, self.folder / f"{speaker_id}.npz")
        except BaseException:
            Path(scratch).unlink(missing_ok=True)
            raise

    def load(self, speaker_id: str) -> Voice:
        """The voice registered under the id; KeyError naming it when there is none."""
        self.check_id(speaker_id)
        path = self.folder / f"{speaker_id}.npz"
        try:
            with np.load(path) as data:
                return Voice(
                    text=str(data["text"]), tokens=data["tokens"], mel=data["mel"], embedding=data["embedding"]
                )
        except FileNotFoundError:
            raise KeyError(speaker_id) from None
