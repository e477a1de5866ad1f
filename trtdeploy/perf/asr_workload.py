"""Speech recognition through the ``whisper_bls`` contract: requests, inputs, and WER/CER under Whisper's normalisers.

Requests carry ``TEXT_PREFIX`` BYTES (the decoder prompt), ``WAV`` FP32 [1, n] (16 kHz mono) and ``WAV_LENS`` INT32;
answers carry ``TRANSCRIPTS`` BYTES, in one response, or streamed by a decoupled model as partial transcripts, each
the whole transcript so far. Optional inputs are sent when the model declares them: ``SAMPLE_RATE``, and for exact
output lengths (``--osl``, ``--ignore-eos``) ``MAX_NEW_TOKENS`` INT32 and ``IGNORE_EOS`` BOOL.

Inputs:
* ``--dataset`` with an audio column (``audio``, or ``--column``) and a reference column (``text``, ``sentence`` or
  ``transcription``, or ``--reference-column``), a Hub name or a local folder (``save_to_disk``'s included), and an
  optional ``language`` column;
* ``--input-data`` a Kaldi-style folder as Triton-ASR-Client reads it: ``wav.scp`` (``ID PATH`` lines, paths relative
  to the folder) and ``text`` (or ``trans.txt``: ``ID TRANSCRIPT`` lines); or a jsonl of ``{"audio": path, "text":
  reference, "language": code, "id": ..., "max_tokens": n}`` (all but ``audio`` optional, paths relative to the file);
* nothing: synthetic speech-shaped audio with durations like LibriSpeech test-clean's (2 to 35 s, 7.4 s on average).
  It has no reference, so no WER.

Scoring (per utterance with a reference) follows Whisper's own evaluation: English through its English text normaliser
(transformers' ``EnglishTextNormalizer`` with Whisper's British-to-American spelling map, which the
``whisper-normalizer`` package ships) and scored per word; Chinese through its basic normaliser and scored per
character (CER); any other language through the basic normaliser, per word. jiwer aligns the words or characters.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError, UsageError
from .asr import align, detect_language, error_rate, whisper_prefix
from .tts import read_audio, resample
from .workload import Chunk, InputRow, ModelInfo, Request, RequestOptions, Result, Workload

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedTokenizerBase

#: Languages scored per character (CER); the others per word (WER).
CHARACTER_LANGUAGES = frozenset({"zh", "yue"})
#: Whisper's window: whisper_bls transcribes longer audio window by window, each with its own token cap.
WINDOW_SECONDS = 30
#: Dataset columns read by default.
AUDIO_COLUMN = "audio"
REFERENCE_COLUMNS = ("text", "sentence", "transcription")
LANGUAGE_COLUMN = "language"
#: The files of a Kaldi-style manifest folder: the audio list, then the transcripts (Kaldi's name, Triton-ASR-Client's).
WAV_SCP = "wav.scp"
TRANSCRIPT_FILES = ("text", "trans.txt")
#: Synthetic utterances: durations log-normal around SYNTHETIC_MEDIAN_S, kept within SYNTHETIC_RANGE_S (LibriSpeech
#: test-clean: 2620 utterances, 1.3 to 35 s, 7.4 s on average).
SYNTHETIC_RANGE_S = (2.0, 35.0)
SYNTHETIC_MEDIAN_S = 6.0
SYNTHETIC_SPREAD = 0.62
#: Vowel formants F1, F2, F3 in Hz (Peterson and Barney's averages for adult male speakers).
_VOWELS = (
    (270, 2290, 3010),
    (390, 1990, 2550),
    (530, 1840, 2480),
    (660, 1720, 2410),
    (730, 1090, 2440),
    (570, 840, 2410),
    (440, 1020, 2240),
    (300, 870, 2240),
    (640, 1190, 2390),
    (490, 1350, 1690),
)
_FORMANT_WIDTHS = (90.0, 120.0, 170.0)
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")
_PREFIX_LANGUAGE = re.compile(r"<\|startoftranscript\|><\|([a-z]{2,3})\|>")


# --- scoring ---------------------------------------------------------------------------------------------------


@functools.cache
def english_normalizer() -> Any:
    """Whisper's English text normaliser with its spelling map (UsageError naming the package when it is missing)."""
    from importlib import resources

    try:
        from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

        spelling = json.loads(resources.files("whisper_normalizer").joinpath("normalizers/english.json").read_text())
    except (ImportError, OSError) as exc:
        raise UsageError(
            f"scoring English transcripts needs transformers and Whisper's spelling map (whisper-normalizer): {exc}",
            hint="install them with `pip install 'trtdeploy[perf]' transformers`",
        ) from None
    return EnglishTextNormalizer(spelling)


@functools.cache
def basic_normalizer() -> Any:
    """Whisper's basic text normaliser (lower case; brackets, symbols and punctuation dropped)."""
    try:
        from transformers.models.whisper.english_normalizer import BasicTextNormalizer
    except ImportError as exc:
        raise UsageError(
            f"scoring transcripts needs transformers: {exc}", hint="install it with `pip install transformers`"
        ) from None
    return BasicTextNormalizer()


def normalize_transcript(text: str, language: str) -> str:
    """``text`` as Whisper's evaluation scores it in ``language``: through the English normaliser for English, the
    basic one for any other language; words separated by single spaces."""
    normalizer = english_normalizer() if language == "en" else basic_normalizer()
    return " ".join(normalizer(text).split())


def score_transcript(hypothesis: str, reference: str, language: str) -> dict[str, Any]:
    """One transcript against its reference: the normalised forms, jiwer's alignment counts and the error rate.

    ``metric`` is ``cer`` for CHARACTER_LANGUAGES (characters aligned, spaces left out), else ``wer`` (words
    aligned); ``reference_length`` counts the reference's words or characters; ``rate`` = (substitutions + deletions
    + insertions) / reference_length. An empty reference (after normalisation) rates 0.0 against an empty hypothesis
    and 1.0 against any other, all of whose units count as insertions.
    """
    ref, hyp = normalize_transcript(reference, language), normalize_transcript(hypothesis, language)
    characters = language in CHARACTER_LANGUAGES
    if characters:
        ref_units, hyp_units = ref.replace(" ", ""), hyp.replace(" ", "")
        length = len(ref_units)
    else:
        ref_units, hyp_units = ref, hyp
        length = len(ref.split())
    counts = align(ref_units, hyp_units, characters=characters)
    return {
        "language": language,
        "metric": "cer" if characters else "wer",
        "reference_normalized": ref,
        "hypothesis_normalized": hyp,
        "hits": counts.hits,
        "substitutions": counts.substitutions,
        "deletions": counts.deletions,
        "insertions": counts.insertions,
        "errors": counts.errors,
        "reference_length": length,
        "rate": error_rate(counts.errors, length),
    }


# --- inputs ----------------------------------------------------------------------------------------------------


def _language(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _LANGUAGE_CODE.fullmatch(value):
        raise UsageError(f"{where}: {value!r} is not a Whisper language code (en, zh, ...)")
    return value


def _max_tokens(value: Any, where: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise UsageError(f'{where}: "max_tokens" must be a positive integer, got {value!r}')
    return value


def _row(
    audio: Any,
    reference: Any,
    *,
    where: str,
    base: Path | None = None,
    name: str = "",
    language: Any = None,
    max_tokens: Any = None,
) -> InputRow:
    samples, rate = read_audio(audio, base=base, where=where)
    if samples.size == 0:
        raise UsageError(f"{where}: the audio is empty")
    fields = {"id": name, "samples": samples, "sample_rate": rate, "language": _language(language, where)}
    text = None if reference is None else str(reference)
    return InputRow(input=name or where, reference=text, max_tokens=_max_tokens(max_tokens, where), fields=fields)


def _id_lines(path: Path) -> dict[str, tuple[str, str]]:
    """``ID REST`` lines of a manifest file: id -> (rest, file:line)."""
    from .inputs import numbered_lines

    entries: dict[str, tuple[str, str]] = {}
    for where, line in numbered_lines(path):
        name, _, rest = line.strip().partition(" ")
        if name in entries:
            raise UsageError(f"{where}: utterance {name!r} is listed twice (first at {entries[name][1]})")
        entries[name] = (" ".join(rest.split()), where)
    return entries


def load_manifest(folder: Path) -> list[InputRow]:
    """Rows of a Kaldi-style folder: ``wav.scp`` and its transcripts (``text``, else ``trans.txt``; without either
    the rows have no reference)."""
    audio = _id_lines(folder / WAV_SCP)
    transcripts_file = next((folder / name for name in TRANSCRIPT_FILES if (folder / name).is_file()), None)
    transcripts = _id_lines(transcripts_file) if transcripts_file is not None else {}
    rows = []
    for name, (path, where) in audio.items():
        if not path or len(path.split()) != 1 or path.endswith("|"):
            raise UsageError(
                f"{where}: expected `ID PATH`, got {name} {path}".rstrip(),
                hint="each line names one audio file (commands piped into wav.scp are not run)",
            )
        if transcripts_file is not None and name not in transcripts:
            raise UsageError(f"{where}: utterance {name!r} has no transcript in {transcripts_file}")
        reference = transcripts[name][0] if name in transcripts else None
        rows.append(_row(path, reference, where=where, base=folder, name=name))
    if not rows:
        raise UsageError(f"{folder / WAV_SCP} has no utterances")
    return rows


def load_asr_jsonl(path: Path) -> list[InputRow]:
    """Rows of a jsonl file of ``{"audio", "text", "language", "id", "max_tokens"}`` objects (``audio`` required)."""
    from .inputs import json_object, numbered_lines

    rows = []
    for where, line in numbered_lines(path):
        data = json_object(line, where)
        if "audio" not in data:
            raise UsageError(
                f'{where}: no "audio" key (keys: {", ".join(data) or "none"})',
                hint='each line needs {"audio": "path.wav", "text": "its transcript"}',
            )
        rows.append(
            _row(
                data["audio"],
                data.get("text"),
                where=where,
                base=path.parent,
                name=str(data.get("id") or ""),
                language=data.get("language"),
                max_tokens=data.get("max_tokens"),
            )
        )
    if not rows:
        raise UsageError(f"input file {path} has no rows")
    return rows


def load_asr_input(path: Path) -> list[InputRow]:
    """``--input-data`` of the ASR workload: a manifest folder (or its wav.scp), else a jsonl file."""
    path = Path(path)
    if path.is_dir() or path.name == WAV_SCP:
        folder = path if path.is_dir() else path.parent
        if not (folder / WAV_SCP).is_file():
            raise NotFoundError(
                f"{folder} has no {WAV_SCP}", hint=f"pass a folder with {WAV_SCP} and text, or a .jsonl file"
            )
        return load_manifest(folder)
    if not path.is_file():
        raise NotFoundError(f"input {path} does not exist", hint=f"pass a .jsonl file or a folder with {WAV_SCP}")
    return load_asr_jsonl(path)


def load_asr_dataset(
    source: str, *, split: str | None, audio_column: str | None, reference_column: str | None
) -> list[InputRow]:
    """Rows of a dataset with an audio column and (when it has one) a reference column; audio is decoded here
    (soundfile), not by ``datasets``."""
    import datasets

    from .inputs import load_split

    dataset = load_split(source, split)
    columns = list(dataset.column_names)
    audio_column = audio_column or AUDIO_COLUMN
    for flag, column in (("--column", audio_column), ("--reference-column", reference_column)):
        if column is not None and column not in columns:
            what = "audio" if flag == "--column" else "reference transcripts"
            raise NotFoundError(
                f"dataset {source!r} has no column {column!r}",
                hint=f"name the column of its {what} with {flag} (columns: {', '.join(columns)})",
            )
    if reference_column is None:
        reference_column = next((name for name in REFERENCE_COLUMNS if name in columns), None)
    if isinstance(dataset.features[audio_column], datasets.Audio):
        dataset = dataset.cast_column(audio_column, datasets.Audio(decode=False))
    folder = Path(source).expanduser()
    base = folder if folder.is_dir() else None
    rows = [
        _row(
            record[audio_column],
            record[reference_column] if reference_column else None,
            where=f"{source} row {index}",
            base=base,
            name=str(record.get("id") or ""),
            language=record.get(LANGUAGE_COLUMN),
        )
        for index, record in enumerate(dataset)
    ]
    if not rows:
        raise UsageError(f"dataset {source!r} has no rows")
    return rows


def synthetic_duration(rng: np.random.Generator) -> float:
    """An utterance duration in seconds, drawn like LibriSpeech test-clean's."""
    import numpy as np

    low, high = SYNTHETIC_RANGE_S
    while True:
        seconds = float(np.exp(rng.normal(np.log(SYNTHETIC_MEDIAN_S), SYNTHETIC_SPREAD)))
        if low <= seconds <= high:
            return seconds


def synthetic_speech(seconds: float, rng: np.random.Generator, sample_rate: int = 16000) -> np.ndarray:
    """Speech-shaped audio: voiced syllables about 4 a second, grouped into words by short pauses and into phrases
    by longer ones. Each syllable is a glottal pitch with its harmonics shaped by the three formants of a vowel, a
    puff of noise at its onset; pitch falls along a phrase. Samples in [-0.5, 0.5]."""
    import numpy as np

    hop = sample_rate // 100  # the timeline is drawn at 10 ms frames, then interpolated
    frames = int(seconds * 100) + 1
    loudness = np.zeros(frames, dtype=np.float32)
    formants = np.tile(np.array(_VOWELS[0], dtype=np.float32), (frames, 1))
    noise_gate = np.zeros(frames, dtype=np.float32)
    speaker = rng.uniform(0.9, 1.15)  # formant scale: vocal tract length
    base_pitch = rng.uniform(95.0, 230.0)
    pitch = np.full(frames, base_pitch, dtype=np.float32)
    frame = int(rng.uniform(0.1, 0.3) * 100)
    while frame < frames:
        phrase_start = frame
        for _ in range(int(rng.integers(4, 12))):  # words in the phrase
            for _ in range(int(rng.integers(1, 4))):  # syllables in the word
                length = int(rng.uniform(0.15, 0.3) * 100)
                end = min(frame + length, frames)
                if end - frame < 5:  # no room for a syllable before the end
                    break
                shape = np.clip(np.sin(np.linspace(0, np.pi, end - frame, dtype=np.float32)), 0, None) ** 0.7
                loudness[frame:end] = rng.uniform(0.6, 1.0) * shape
                formants[frame:end] = np.array(_VOWELS[int(rng.integers(len(_VOWELS)))], dtype=np.float32) * speaker
                noise_gate[frame : min(frame + 4, frames)] = rng.uniform(0.2, 0.5)
                pitch[frame:end] = base_pitch * rng.uniform(0.95, 1.1)
                frame = end
            frame += int(rng.uniform(0.03, 0.15) * 100)
            if frame >= frames:
                break
        end = min(frame, frames)
        pitch[phrase_start:end] *= np.linspace(1.0, 0.85, end - phrase_start, dtype=np.float32)  # declination
        frame += int(rng.uniform(0.3, 0.7) * 100)

    count = int(seconds * sample_rate)
    at = np.arange(count, dtype=np.float32) / hop
    grid = np.arange(frames, dtype=np.float32)
    f0 = np.interp(at, grid, pitch).astype(np.float32)
    phase = np.cumsum(2 * np.pi * f0 / sample_rate, dtype=np.float64)
    voiced = np.zeros(count, dtype=np.float32)
    for k in range(1, int(4000 // base_pitch) + 1):  # harmonics up to about 4 kHz
        frequency = k * pitch
        gain = sum(
            np.exp(-0.5 * ((frequency - formants[:, j]) / width) ** 2) / (j + 1)
            for j, width in enumerate(_FORMANT_WIDTHS)
        )
        amplitude = np.interp(at, grid, (gain + 0.02) / k**0.5 * loudness).astype(np.float32)
        voiced += amplitude * np.sin(k * phase).astype(np.float32)
    breath = np.diff(rng.standard_normal(count + 1)).astype(np.float32) * np.interp(at, grid, noise_gate)
    signal = voiced + 0.3 * breath + 0.002 * rng.standard_normal(count).astype(np.float32)
    peak = float(np.abs(signal).max()) or 1.0
    return (0.5 * signal / peak).astype(np.float32)


# --- the workload ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Utterance:
    """What ``finish`` needs of a request: its language (for scoring) and its audio duration."""

    language: str
    audio_seconds: float


def _transcript(outputs: Mapping[str, np.ndarray]) -> str:
    values = outputs.get("TRANSCRIPTS")
    if values is None or values.size == 0:
        return ""
    value = values.reshape(-1)[0]
    return (value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)).strip()


class ASRWorkload(Workload):
    """Whisper behind the ``whisper_bls`` contract (see the module docstring).

    ``tokenizer_dir`` (the Whisper checkpoint's tokenizer) lets ``--ignore-eos`` without ``--osl`` force each
    request's output length to its reference transcript's token count.
    """

    family = "asr"
    contract_inputs = ("TEXT_PREFIX", "WAV")
    contract_outputs = ("TRANSCRIPTS",)

    def __init__(
        self, model_name: str, decoupled: bool, sample_rate: int = 16000, tokenizer_dir: str | Path | None = None
    ) -> None:
        self.model_name = model_name
        self.decoupled = decoupled
        #: The rate the model takes; input audio is resampled to it on the client.
        self.sample_rate = sample_rate
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tokenizer"] = None
        return state

    def validate(self, model: ModelInfo, options: RequestOptions) -> None:
        super().validate(model, options)
        model.require_inputs(*model.sampling_inputs(options))
        wanted = {"MAX_NEW_TOKENS": options.max_tokens is not None, "IGNORE_EOS": options.ignore_eos}
        missing = [name for name, asked in wanted.items() if asked and name not in model.inputs]
        if options.ignore_eos and "MAX_NEW_TOKENS" not in model.inputs:
            missing.insert(0, "MAX_NEW_TOKENS")
        if missing:
            raise UsageError(
                f"model {model.name!r} takes no {' or '.join(dict.fromkeys(missing))}, so it cannot be held to an "
                "exact transcript length",
                hint="drop --osl and --ignore-eos (NVIDIA's whisper_bls has no such inputs)",
            )

    def load_input_data(self, path: Path) -> list[InputRow]:
        return load_asr_input(path)

    def load_dataset(
        self, source: str, *, split: str | None, column: str | None, reference_column: str | None
    ) -> list[InputRow]:
        return load_asr_dataset(source, split=split, audio_column=column, reference_column=reference_column)

    def synthetic_rows(
        self, count: int, *, input_tokens: int, output_tokens: int | None, seed: int, start: int = 0
    ) -> list[InputRow]:
        """``count`` synthetic utterances (no reference transcript; ``input_tokens`` does not apply to audio), each
        asking for ``output_tokens`` when given."""
        import numpy as np

        rows = []
        for index in range(start, start + count):
            rng = np.random.default_rng([seed, index])
            name = f"synthetic-{index:04d}"
            samples = synthetic_speech(synthetic_duration(rng), rng, self.sample_rate)
            fields = {"id": name, "samples": samples, "sample_rate": self.sample_rate, "language": None}
            rows.append(InputRow(input=name, max_tokens=output_tokens, fields=fields))
        return rows

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            from .llm import load_tokenizer

            assert self.tokenizer_dir is not None
            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer

    def _length(self, row: InputRow, options: RequestOptions) -> int | None:
        """The row's output length: its own, the run's (--osl), or with --ignore-eos its reference's token count."""
        length = row.max_tokens or options.max_tokens
        if length is None and options.ignore_eos:
            if row.reference is None or self.tokenizer_dir is None:
                raise UsageError(
                    f"input {row.input}: --ignore-eos needs a length for every request",
                    hint="pass --osl N, or give each row a max_tokens"
                    + ("" if row.reference is None else " (or a Whisper deployment's tokenizer, or --tokenizer)"),
                )
            length = max(1, len(self.tokenizer.encode(" " + row.reference.strip(), add_special_tokens=False)))
        return length

    def make_request(self, row: InputRow, options: RequestOptions, model: ModelInfo) -> Request:
        import numpy as np

        fields = row.fields
        language = self._language(row, options)
        if row.reference is not None:  # fail before the load when the normaliser cannot be had
            normalize_transcript("", language)
        samples = resample(fields["samples"], fields["sample_rate"], self.sample_rate).astype(np.float32)
        prefix = options.text_prefix if options.text_prefix is not None else whisper_prefix(language)
        tensors = {
            "TEXT_PREFIX": model.scalar("TEXT_PREFIX", prefix),
            "WAV": samples.reshape(model.shape(samples.size)),
        }
        if "WAV_LENS" in model.inputs:
            tensors["WAV_LENS"] = model.scalar("WAV_LENS", samples.size)
        if "SAMPLE_RATE" in model.inputs:
            tensors["SAMPLE_RATE"] = model.scalar("SAMPLE_RATE", self.sample_rate)
        length = self._length(row, options)
        if length is not None:
            # whisper_bls caps (and with IGNORE_EOS fixes) the tokens of each 30 s window: the utterance's length
            # is shared out over its windows
            windows = max(1, math.ceil(samples.size / (WINDOW_SECONDS * self.sample_rate)))
            length = math.ceil(length / windows)
            if "MAX_NEW_TOKENS" not in model.inputs:
                raise UsageError(
                    f"input {row.input} asks for max_tokens {length}, but model {model.name!r} takes no MAX_NEW_TOKENS",
                    hint="drop max_tokens from the input data",
                )
            tensors["MAX_NEW_TOKENS"] = model.scalar("MAX_NEW_TOKENS", length)
        if options.ignore_eos:
            tensors["IGNORE_EOS"] = model.scalar("IGNORE_EOS", True)
        context = _Utterance(language=language, audio_seconds=samples.size / self.sample_rate)
        return Request(
            inputs=tensors,
            outputs=("TRANSCRIPTS",),
            reference=row.reference,
            context=context,
            label=fields.get("id") or None,
        )

    @staticmethod
    def _language(row: InputRow, options: RequestOptions) -> str:
        """The language the utterance is transcribed and scored in: the one ``--text-prefix`` names, else the row's,
        else the one its reference is written in, else English."""
        named = _PREFIX_LANGUAGE.search(options.text_prefix or "")
        if named:
            return named.group(1)
        if row.fields.get("language"):
            return str(row.fields["language"])
        return detect_language(row.reference) if row.reference is not None else "en"

    def parse_chunk(self, outputs: Mapping[str, np.ndarray], request: Request) -> Chunk:
        return Chunk(text=_transcript(outputs))

    def finish(self, request: Request, chunks: Sequence[Chunk]) -> Result:
        """The transcript is the last response's (a stream's responses each hold the whole transcript so far),
        scored against the reference when there is one."""
        utterance: _Utterance = request.context
        text = chunks[-1].text if chunks else ""
        accuracy = None
        if request.reference is not None:
            accuracy = score_transcript(text, str(request.reference), utterance.language)
        return Result(text=text, audio_seconds=utterance.audio_seconds, accuracy=accuracy)
