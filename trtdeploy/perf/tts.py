"""The speech-synthesis workload: (reference audio, reference text, target text) in, audio out.

The tensor contract is the official Spark-TTS/CosyVoice Triton one: ``reference_wav`` FP32 [1, N] (mono, at the
model's input rate), ``reference_wav_len`` INT32, ``reference_text`` and ``target_text`` BYTES; ``waveform`` FP32
back, in one response or streamed as chunks. Streamed chunks either play one after another, or overlap as the
official clients expect: each chunk after the first repeats the last ``chunk_overlap_samples`` of the chunk before,
and the audio is rebuilt by the official clients' rule (:func:`join_overlapped`). Optional inputs are sent when the
model declares them: ``sample_rate``, ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``random_seed``.

Inputs:
* ``--dataset yuekai/seed_tts --split wenetspeech4tts`` (columns id, prompt_text, prompt_audio, target_text), or any
  dataset or local file with such columns (``reference_audio``/``reference_text`` are accepted too);
* ``--input-data FILE.jsonl`` with ``reference_audio`` (a path, relative to the file), ``reference_text``,
  ``target_text`` and optional ``id``, ``max_tokens``; or a seed-tts-eval folder (or its ``meta.lst``) whose lines
  are ``id|reference text|reference wav|target text``;
* nothing: synthetic rows, a generated voiced reference and English text, with target durations like the
  wenetspeech4tts split's (3 to 10 s, 6.5 s on average), each request capped at its duration (a random-weight
  checkpoint never stops on its own).

Audio is read with soundfile, mixed down to mono and resampled (soxr) to the model's input rate on the client, as
the official gRPC client does; numpy, soundfile and soxr are imported where used.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError, UsageError
from .workload import Chunk, InputRow, ModelInfo, Request, RequestOptions, Result, Workload

if TYPE_CHECKING:
    import numpy as np

#: Column names tried, in order, for each field of a row.
AUDIO_COLUMNS = ("prompt_audio", "reference_audio", "prompt_wav", "reference_wav")
REFERENCE_TEXT_COLUMNS = ("prompt_text", "reference_text")
TARGET_TEXT_COLUMNS = ("target_text", "text")
#: The seed-tts-eval list file of a test-set folder.
META_LIST = "meta.lst"
#: Synthetic rows: target speech durations (uniform, seconds), reference durations, words per second.
SYNTHETIC_TARGET_S = (3.0, 10.0)
SYNTHETIC_REFERENCE_S = (3.0, 8.0)
WORDS_PER_SECOND = 2.5
_WORDS = (
    "the a voice model speaks clearly today and every morning we walk along quiet rivers while bright birds sing "
    "over green hills people listen to music in small rooms then share stories about distant cities with friends"
).split()


def _first(record: Mapping[str, Any], names: Sequence[str], what: str, where: str) -> Any:
    for name in names:
        if name in record and record[name] is not None:
            return record[name]
    raise UsageError(
        f"{where}: no {what} (looked for {', '.join(names)}; found {', '.join(map(str, record)) or 'nothing'})"
    )


def read_audio(value: Any, *, base: Path | None = None, where: str = "") -> tuple[np.ndarray, int]:
    """Mono float32 samples and their rate from a path, bytes, or a datasets Audio value (decoded or not)."""
    import numpy as np

    if isinstance(value, Mapping) and value.get("array") is not None:
        samples = np.asarray(value["array"], dtype=np.float32)
        return (samples.mean(axis=0) if samples.ndim > 1 else samples), int(value["sampling_rate"])
    if isinstance(value, Mapping):
        value = value.get("bytes") or value.get("path")
    try:
        import soundfile
    except ImportError as exc:
        raise UsageError(
            f"reading audio needs soundfile ({exc})", hint="install it with `pip install 'trtdeploy[perf]'`"
        ) from None
    if isinstance(value, bytes | bytearray):
        source: Any = io.BytesIO(value)
    else:
        path = Path(str(value)).expanduser()
        source = path if path.is_absolute() or base is None else base / path
        if not Path(source).is_file():
            raise NotFoundError(f"{where}: audio file {source} does not exist")
    try:
        samples, rate = soundfile.read(source, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise UsageError(f"{where}: cannot read the reference audio ({exc})") from None
    return samples.mean(axis=1), int(rate)


def _row(record: Mapping[str, Any], *, base: Path | None, where: str, target_column: str | None = None) -> InputRow:
    audio = _first(record, AUDIO_COLUMNS, "reference audio", where)
    reference_text = _first(record, REFERENCE_TEXT_COLUMNS, "reference text", where)
    target = _first(record, (target_column,) if target_column else TARGET_TEXT_COLUMNS, "target text", where)
    samples, rate = read_audio(audio, base=base, where=where)
    if samples.size == 0:
        raise UsageError(f"{where}: the reference audio is empty")
    max_tokens = record.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise UsageError(f'{where}: "max_tokens" must be a positive integer, got {max_tokens!r}')
    fields = {
        "id": str(record.get("id") or ""),
        "reference_text": str(reference_text),
        "samples": samples,
        "sample_rate": rate,
    }
    return InputRow(input=str(target), reference=str(target), max_tokens=max_tokens, fields=fields)


def load_tts_file(path: Path) -> list[InputRow]:
    """Rows of a jsonl file, a seed-tts-eval ``meta.lst``, or a folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / META_LIST
    if not path.is_file():
        raise NotFoundError(
            f"input {path} does not exist", hint=f"pass a .jsonl file, a {META_LIST}, or a folder holding a {META_LIST}"
        )
    from .inputs import json_object, numbered_lines

    rows = []
    for where, line in numbered_lines(path):
        if path.suffix == ".jsonl":
            record = json_object(line, where)
        else:
            parts = line.split("|")
            if len(parts) < 4:
                raise UsageError(f"{where}: expected id|reference text|reference wav|target text, got {line!r}")
            record = {"id": parts[0], "reference_text": parts[1], "reference_audio": parts[2], "target_text": parts[3]}
        rows.append(_row(record, base=path.parent, where=where))
    if not rows:
        raise UsageError(f"input file {path} has no rows")
    return rows


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return samples
    import numpy as np

    try:
        import soxr
    except ImportError as exc:
        raise UsageError(
            f"resampling {rate} Hz reference audio to {target} Hz needs soxr ({exc})",
            hint="install it with `pip install 'trtdeploy[perf]'`",
        ) from None
    return np.asarray(soxr.resample(samples, rate, target), dtype=np.float32)


def synthetic_voice(seconds: float, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """A voiced, speech-like test signal: harmonics of a wandering pitch, syllable-rate loudness, some breath."""
    import numpy as np

    t = np.arange(int(seconds * sample_rate)) / sample_rate
    pitch = rng.uniform(100, 220) * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.3, 1.0) * t))
    phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    syllables = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, np.pi)), 0, None) ** 0.5
    signal = voiced * syllables + 0.05 * rng.standard_normal(t.size)
    return (0.3 * signal / np.abs(signal).max()).astype(np.float32)


def _sentence(seconds: float, rng: np.random.Generator) -> str:
    words = rng.choice(_WORDS, max(1, round(seconds * WORDS_PER_SECOND)))
    return " ".join(words).capitalize() + "."


def join_overlapped(chunks: Sequence[np.ndarray], overlap: int) -> np.ndarray:
    """The audio of overlapping chunks, rebuilt as the official Spark-TTS/CosyVoice clients do: the first chunk but
    its last ``overlap`` samples, then for each later chunk its first ``overlap`` samples faded in over the previous
    chunk's last ``overlap`` faded out, and its middle; then the last chunk's last ``overlap`` samples."""
    import numpy as np

    if not chunks:
        return np.zeros(0, dtype=np.float32)
    if overlap <= 0:
        return np.concatenate(chunks)
    fade_in = np.linspace(0.0, 1.0, overlap, dtype=np.float32)
    parts = [chunks[0][:-overlap]]
    for previous, chunk in zip(chunks, chunks[1:], strict=False):
        parts.append(chunk[:overlap] * fade_in + previous[-overlap:] * (1 - fade_in))
        parts.append(chunk[overlap:-overlap])
    parts.append(chunks[-1][-overlap:])
    return np.concatenate(parts).astype(np.float32)


class TTSWorkload(Workload):
    """Speech synthesis through the reference-voice contract (see the module docstring)."""

    family = "tts"
    contract_inputs = ("reference_wav", "reference_text", "target_text")
    contract_outputs = ("waveform",)

    def __init__(
        self,
        model_name: str,
        *,
        decoupled: bool,
        sample_rate: int,
        tokens_per_second: int,
        input_sample_rate: int = 16000,
        chunk_overlap_samples: int = 0,
    ) -> None:
        self.model_name = model_name
        self.decoupled = decoupled
        #: Rate of the audio the model returns, and of the reference audio it takes.
        self.sample_rate = sample_rate
        self.input_sample_rate = input_sample_rate
        #: Speech tokens per second of audio (``max_tokens`` of synthetic rows).
        self.tokens_per_second = tokens_per_second
        #: Streamed chunks overlap by this many samples (the official wire format); 0: they play one after another.
        self.chunk_overlap_samples = chunk_overlap_samples

    def validate(self, model: ModelInfo, options: RequestOptions) -> None:
        super().validate(model, options)
        if options.ignore_eos:
            raise UsageError("--ignore-eos applies to LLM workloads", hint="cap the speech length with --osl")
        wanted = model.sampling_inputs(options)
        if options.max_tokens is not None:
            wanted.append("max_tokens")
        model.require_inputs(*wanted)

    def load_input_data(self, path: Path) -> list[InputRow]:
        return load_tts_file(path)

    def load_dataset(
        self, source: str, *, split: str | None, column: str | None, reference_column: str | None
    ) -> list[InputRow]:
        from .inputs import load_split

        if reference_column is not None:
            raise UsageError("--reference-column does not apply to TTS: the target text is the reference")
        dataset = load_split(source, split)
        audio_column = next((name for name in AUDIO_COLUMNS if name in dataset.column_names), None)
        if audio_column is not None:
            import datasets

            dataset = dataset.cast_column(audio_column, datasets.Audio(decode=False))
        if column is not None and column not in dataset.column_names:
            raise NotFoundError(
                f"dataset {source!r} has no column {column!r}", hint=f"columns: {', '.join(dataset.column_names)}"
            )
        rows = [
            _row(record, base=None, where=f"{source} row {index}", target_column=column)
            for index, record in enumerate(dataset)
        ]
        if not rows:
            raise UsageError(f"dataset {source!r} has no rows")
        return rows

    def synthetic_rows(
        self, count: int, *, input_tokens: int, output_tokens: int | None, seed: int, start: int = 0
    ) -> list[InputRow]:
        """``count`` rows (``input_tokens`` does not apply to speech); each asks for ``output_tokens`` tokens, else
        for its target duration at the model's speech tokens per second."""
        import numpy as np

        rows = []
        for index in range(start, start + count):
            rng = np.random.default_rng([seed, index])
            target_s = rng.uniform(*SYNTHETIC_TARGET_S)
            reference_s = rng.uniform(*SYNTHETIC_REFERENCE_S)
            target = _sentence(target_s, rng)
            fields = {
                "id": f"synthetic-{index:04d}",
                "reference_text": _sentence(reference_s, rng),
                "samples": synthetic_voice(reference_s, rng, self.input_sample_rate),
                "sample_rate": self.input_sample_rate,
            }
            max_tokens = output_tokens or round(target_s * self.tokens_per_second)
            rows.append(InputRow(input=target, reference=target, max_tokens=max_tokens, fields=fields))
        return rows

    def make_request(self, row: InputRow, options: RequestOptions, model: ModelInfo) -> Request:
        import numpy as np

        samples = resample(row.fields["samples"], row.fields["sample_rate"], self.input_sample_rate)
        tensors = {
            "reference_wav": samples.astype(np.float32).reshape(model.shape(samples.size)),
            "reference_text": model.scalar("reference_text", row.fields["reference_text"]),
            "target_text": model.scalar("target_text", str(row.input)),
        }
        if "reference_wav_len" in model.inputs:
            tensors["reference_wav_len"] = model.scalar("reference_wav_len", samples.size)
        if "sample_rate" in model.inputs:
            tensors["sample_rate"] = model.scalar("sample_rate", self.input_sample_rate)
        max_tokens = row.max_tokens or options.max_tokens
        if max_tokens is not None and "max_tokens" in model.inputs:
            tensors["max_tokens"] = model.scalar("max_tokens", max_tokens)
        tensors.update(model.sampling_tensors(options))
        return Request(
            inputs=tensors,
            outputs=("waveform",),
            reference=row.reference,
            input_characters=len(str(row.input)),
            label=row.fields.get("id") or None,
        )

    def parse_chunk(self, outputs: Mapping[str, np.ndarray], request: Request) -> Chunk:
        wave = outputs.get("waveform")
        if wave is None or wave.size == 0:
            return Chunk()
        wave = wave.reshape(-1)
        # an overlapping chunk's last samples play only once the next chunk is blended in (the last chunk's, at
        # the end: finish() counts them)
        playable = max(wave.size - self.chunk_overlap_samples, 0)
        return Chunk(audio_seconds=playable / self.sample_rate, audio=wave)

    def finish(self, request: Request, chunks: Sequence[Chunk]) -> Result:
        waves = [chunk.audio for chunk in chunks if chunk.audio is not None]
        if not waves:
            raise ValueError("the response holds no audio")
        audio = join_overlapped(waves, self.chunk_overlap_samples)
        return Result(audio_seconds=audio.size / self.sample_rate, audio=audio, sample_rate=self.sample_rate)
