"""Intelligibility of generated speech: WER/CER of a Whisper transcript against the text the TTS was given.

Scoring follows the rules of seed-tts-eval's ``run_wer.py``: ASCII and Chinese punctuation (zhon's
``hanzi.punctuation``) are removed, except the apostrophe ``'``; English is lower-cased and scored per word;
Chinese is split into characters, so its WER is a character error rate. Its reported number is the mean of the
per-utterance WERs (printed ×100); :func:`aggregate` gives that mean as a fraction, and the corpus rate too.

Transcripts come from a Whisper model on Triton with the contract of TensorRT-LLM's ``whisper_bls``
(:func:`transcribe`, gRPC). Typical use::

    languages = [language or detect_language(ref) for ref in references]
    texts = await transcribe(url, wavs, languages)
    summary = aggregate([score(text, ref, lang) for text, ref, lang in zip(texts, references, languages)])
"""

from __future__ import annotations

import asyncio
import json
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import jiwer
import numpy as np

from ..errors import NotFoundError, PerfError, ServerError, UsageError
from ..fsutil import atomic_write_text
from .control import ControlClient, check_url, failure_reason

if TYPE_CHECKING:
    from .report import ReportWriter

Language = Literal["en", "zh"]
LANGUAGES: tuple[Language, ...] = ("en", "zh")
#: The only sample rate Whisper takes.
SAMPLE_RATE = 16000

#: Chinese punctuation, the characters of zhon's ``hanzi.punctuation`` (non-stops, then stops).
CHINESE_PUNCTUATION = (
    # fullwidth ASCII variants
    "\uff02\uff03\uff04\uff05\uff06\uff07\uff08\uff09\uff0a\uff0b\uff0c\uff0d\uff0f\uff1a\uff1b\uff1c\uff1d\uff1e"
    "\uff20\uff3b\uff3c\uff3d\uff3e\uff3f\uff40\uff5b\uff5c\uff5d\uff5e\uff5f\uff60"
    # halfwidth CJK punctuation
    "\uff62\uff63\uff64"
    # CJK symbols and punctuation: ideographic space, comma, ditto mark
    "\u3000\u3001\u3003"
    # CJK angle and corner brackets
    "\u3008\u3009\u300a\u300b\u300c\u300d\u300e\u300f\u3010\u3011"
    # CJK brackets and symbols
    "\u3014\u3015\u3016\u3017\u3018\u3019\u301a\u301b\u301c\u301d\u301e\u301f"
    # wavy dash, vertical ideographic iteration mark, ideographic half fill space
    "\u3030\u303e\u303f"
    # en and em dashes, curly quotes (the right single quote, a typographic apostrophe, among them)
    "\u2013\u2014\u2018\u2019\u201b\u201c\u201d\u201e\u201f"
    # ellipsis, hyphenation point, dashed low line, small comma and semicolon, middle dot
    "\u2026\u2027\ufe4f\ufe51\ufe54\u00b7"
    # stops: fullwidth full stop, exclamation and question marks, halfwidth and ideographic full stops
    "\uff0e\uff01\uff1f\uff61\u3002"
)
_STRIP = str.maketrans(dict.fromkeys((string.punctuation + CHINESE_PUNCTUATION).replace("'", "")))
#: CJK ideographs (unified, extensions A to H, compatibility, and the ideographic number zero).
_HAN = re.compile("[\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f\U00030000-\U000323af]")

#: The Whisper model of NVIDIA's Triton repository, and of a trtdeploy whisper deployment.
WHISPER_MODEL = "whisper_bls"
WHISPER_INPUTS = {"TEXT_PREFIX": "BYTES", "WAV": "FP32", "WAV_LENS": "INT32"}
WHISPER_OUTPUTS = {"TRANSCRIPTS": "BYTES"}
_CONTRACT_HINT = (
    "a Whisper model takes TEXT_PREFIX (BYTES), WAV (FP32), WAV_LENS (INT32) and answers TRANSCRIPTS (BYTES), "
    "as TensorRT-LLM's whisper_bls does; name it with --asr-model"
)
_URL_HINT = "pass --asr WHISPER_DEPLOYMENT (served), or --asr HOST:PORT, the gRPC port of a Triton serving whisper_bls"


@dataclass(frozen=True)
class AsrSettings:
    """Where generated speech is transcribed for WER/CER (``--asr``): a Whisper model on Triton (gRPC)."""

    url: str
    model: str = WHISPER_MODEL
    #: ``en``, ``zh``, or None to tell each utterance's language from its text.
    language: str | None = None
    concurrency: int = 4
    #: Headers of the control calls (the key to a trtdeploy server's restricted APIs).
    headers: Mapping[str, str] = field(default_factory=dict)


# --- scoring ---------------------------------------------------------------------------------------------------


def detect_language(text: str) -> Language:
    """``zh`` if ``text`` has a CJK ideograph, else ``en``."""
    return "zh" if _HAN.search(text) else "en"


def _check_language(language: str) -> Language:
    if language not in LANGUAGES:
        raise UsageError(f"cannot score language {language!r}: WER/CER scoring knows {', '.join(LANGUAGES)}")
    return language  # type: ignore[return-value]


def normalize(text: str, language: str) -> str:
    """``text`` as seed-tts-eval scores it: punctuation but ``'`` removed; English lower-cased, words separated by
    one space; Chinese as its characters separated by one space (whitespace dropped)."""
    text = text.translate(_STRIP)
    if _check_language(language) == "zh":
        return " ".join(ch for ch in text if not ch.isspace())
    return " ".join(text.lower().split())


@dataclass(frozen=True)
class UtteranceScore:
    """One transcript against its reference. ``words`` and ``chars`` are the reference's lengths after
    normalisation (for Chinese each character is a word; English characters count the spaces between words);
    ``word_errors`` and ``char_errors`` are substitutions + deletions + insertions."""

    language: Language
    wer: float
    cer: float
    word_errors: int
    words: int
    char_errors: int
    chars: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def error_rate(errors: int, length: int) -> float:
    """errors / length; for an empty reference 0.0 if nothing was inserted, else 1.0."""
    if length:
        return errors / length
    return 1.0 if errors else 0.0


@dataclass(frozen=True)
class Alignment:
    """jiwer's counts of a hypothesis aligned to its reference, by words or by characters."""

    hits: int
    substitutions: int
    deletions: int
    insertions: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions


def align(reference: str, hypothesis: str, *, characters: bool = False) -> Alignment:
    """``hypothesis`` aligned to ``reference`` word by word (or character by character). jiwer refuses an empty
    reference: against one, every unit of the hypothesis is an insertion."""
    if not (reference if characters else reference.split()):
        return Alignment(0, 0, 0, len(hypothesis) if characters else len(hypothesis.split()))
    out = (jiwer.process_characters if characters else jiwer.process_words)(reference, hypothesis)
    return Alignment(out.hits, out.substitutions, out.deletions, out.insertions)


def score(hypothesis: str, reference: str, language: str | None = None) -> UtteranceScore:
    """Score ``hypothesis`` against ``reference`` in ``language`` (detected from the reference when None).

    An empty reference (after normalisation) scores WER/CER 0.0 against an empty hypothesis and 1.0 against any
    other; its errors (the hypothesis' words or characters, all insertions) still count in the corpus rates.
    """
    lang = _check_language(language) if language is not None else detect_language(reference)
    ref_words, hyp_words = normalize(reference, lang), normalize(hypothesis, lang)
    # Chinese characters are scored without the separating spaces; English ones with them, as jiwer's CER does
    ref_chars, hyp_chars = ref_words, hyp_words
    if lang == "zh":
        ref_chars, hyp_chars = ref_words.replace(" ", ""), hyp_words.replace(" ", "")
    words, chars = len(ref_words.split()), len(ref_chars)
    word_errors = align(ref_words, hyp_words).errors
    char_errors = align(ref_chars, hyp_chars, characters=True).errors
    return UtteranceScore(
        language=lang,
        wer=error_rate(word_errors, words),
        cer=error_rate(char_errors, chars),
        word_errors=word_errors,
        words=words,
        char_errors=char_errors,
        chars=chars,
    )


def aggregate(scores: Sequence[UtteranceScore]) -> dict[str, Any]:
    """Rates over utterances, as fractions (not ×100).

    ``wer_mean``/``cer_mean``: the mean of the per-utterance rates (seed-tts-eval's number, /100);
    ``wer_corpus``/``cer_corpus``: all errors over all reference words/characters. Also ``utterances``,
    ``languages`` (utterances per language), the summed counts, and ``empty_references``. Rates are None over
    no utterances (corpus rates: over no reference words). Call it per language for per-language rates.
    """
    count = len(scores)
    totals = {key: sum(getattr(s, key) for s in scores) for key in ("word_errors", "words", "char_errors", "chars")}
    return {
        "utterances": count,
        "languages": dict(sorted(Counter(s.language for s in scores).items())),
        "wer_mean": sum(s.wer for s in scores) / count if count else None,
        "cer_mean": sum(s.cer for s in scores) / count if count else None,
        "wer_corpus": totals["word_errors"] / totals["words"] if totals["words"] else None,
        "cer_corpus": totals["char_errors"] / totals["chars"] if totals["chars"] else None,
        **totals,
        "empty_references": sum(1 for s in scores if s.words == 0),
    }


# --- transcription ---------------------------------------------------------------------------------------------


def whisper_prefix(language: str) -> str:
    """The decoder prompt of a transcription in ``language`` (a Whisper language code), without timestamps."""
    return f"<|startoftranscript|><|{language}|><|transcribe|><|notimestamps|>"


def _address(url: str) -> str:
    return check_url(url, flag="--asr", schemes=("grpc",), example="e.g. --asr localhost:8001 (Triton's gRPC)")


def _wav(wav: Any, index: int) -> np.ndarray:
    array = np.asarray(wav)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise UsageError(f"utterance {index}: a wav must be mono samples (1-D), got shape {list(array.shape)}")
    if not np.issubdtype(array.dtype, np.floating):
        raise UsageError(f"utterance {index}: wav samples must be floats in [-1, 1], got {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.float32)


async def _check_model(control: ControlClient, address: str, model: str) -> None:
    """Raise unless the server is live and ``model`` is ready and has the Whisper inputs and outputs."""
    try:
        live = await control.is_live()
    except Exception as exc:
        raise ServerError(
            f"cannot reach the Whisper server at {address}: {failure_reason(exc)}", hint=_URL_HINT
        ) from None
    if not live:
        raise ServerError(f"the Whisper server at {address} is not live", hint=_URL_HINT)
    try:
        await control.model_info(model)
    except NotFoundError:
        states = await control.model_states()  # None where the model list is restricted
        listed = f" (its models: {', '.join(sorted(states)) or 'none'})" if states is not None else ""
        raise NotFoundError(
            f"no Whisper model {model!r} at {address}{listed}", hint="name the Whisper model with --asr-model"
        ) from None
    except ServerError as exc:
        raise ServerError(f"Whisper model {model!r} at {address}: {exc.message}") from None
    try:
        metadata = await control.metadata(model)
    except Exception as exc:
        raise ServerError(f"cannot read the metadata of {model!r} at {address}: {failure_reason(exc)}") from None
    problems = []
    for kind, wanted in (("input", WHISPER_INPUTS), ("output", WHISPER_OUTPUTS)):
        have = {tensor["name"]: tensor.get("datatype") for tensor in metadata.get(f"{kind}s", [])}
        for name, datatype in wanted.items():
            if name not in have:
                problems.append(f"missing {kind} {name}")
            elif have[name] != datatype:
                problems.append(f"{kind} {name} is {have[name]}, not {datatype}")
    if problems:
        raise UsageError(
            f"model {model!r} at {address} does not speak the Whisper contract: {'; '.join(problems)}",
            hint=_CONTRACT_HINT,
        )


async def check_whisper(url: str, model: str = "whisper_bls", headers: Mapping[str, str] | None = None) -> None:
    """Raise (as :func:`transcribe` would) unless ``model`` at ``url`` is a ready Whisper model: a run checks this
    before its load, so that no benchmark is lost for want of an ASR server."""
    address = _address(url)
    control = ControlClient("grpc", address, headers=headers)
    try:
        await _check_model(control, address, model)
    finally:
        await control.close()


async def transcribe(
    url: str,
    wavs: Sequence[np.ndarray],
    languages: Sequence[str],
    *,
    model: str = "whisper_bls",
    concurrency: int = 4,
    timeout_s: float = 120.0,
    sample_rate: int = 16000,
    headers: Mapping[str, str] | None = None,
) -> list[str]:
    """The transcript of each wav (16 kHz mono floats), in input order, from Whisper ``model`` at ``url`` (gRPC).

    ``languages`` gives each wav's Whisper language code (``en``, ``zh``, ...) for its prompt. At most
    ``concurrency`` requests are in flight. A wav of no samples is not sent: its transcript is ``""``.
    Raises ServerError/NotFoundError/UsageError when the server or model is not usable, before any request, and
    PerfError naming the utterance when a request fails (the others are cancelled).
    """
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.grpc import InferInput, InferRequestedOutput

    if sample_rate != SAMPLE_RATE:
        raise UsageError(
            f"Whisper takes {SAMPLE_RATE} Hz audio, got {sample_rate} Hz", hint="resample the wavs to 16 kHz first"
        )
    if len(wavs) != len(languages):
        raise UsageError(f"{len(wavs)} wavs but {len(languages)} languages: give one language per wav")
    if concurrency < 1:
        raise UsageError(f"ASR concurrency must be >= 1, got {concurrency}")
    if not timeout_s > 0:
        raise UsageError(f"ASR timeout must be > 0 s, got {timeout_s:g}")
    address = _address(url)
    for index, language in enumerate(languages):
        if not re.fullmatch(r"[a-z]{2,3}", language):
            raise UsageError(f"utterance {index}: {language!r} is not a Whisper language code (en, zh, ...)")
    arrays = [_wav(wav, index) for index, wav in enumerate(wavs)]
    if not arrays:
        return []

    control = ControlClient("grpc", address, headers=headers)
    client = grpcclient.InferenceServerClient(address)
    try:
        await _check_model(control, address, model)
        slots = asyncio.Semaphore(concurrency)

        async def one(index: int) -> str:
            samples = arrays[index]
            if not samples.size:
                return ""
            tensors = {
                "TEXT_PREFIX": np.array([[whisper_prefix(languages[index]).encode()]], dtype=np.object_),
                "WAV": samples[None, :],
                "WAV_LENS": np.array([[samples.size]], dtype=np.int32),
            }
            async with slots:
                inputs = []
                for name, array in tensors.items():
                    tensor = InferInput(name, list(array.shape), WHISPER_INPUTS[name])
                    tensor.set_data_from_numpy(array)
                    inputs.append(tensor)
                try:
                    result = await client.infer(
                        model,
                        inputs,
                        outputs=[InferRequestedOutput("TRANSCRIPTS")],
                        request_id=str(index),
                        client_timeout=timeout_s,
                    )
                except Exception as exc:
                    raise PerfError(
                        f"ASR request for utterance {index} failed ({model!r} at {address}): {failure_reason(exc)}"
                    ) from None
            text = result.as_numpy("TRANSCRIPTS")
            if text is None or not text.size:
                raise PerfError(f"ASR answer for utterance {index} has no TRANSCRIPTS ({model!r} at {address})")
            value = text.reshape(-1)[0]
            return (value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)).strip()

        tasks = [asyncio.ensure_future(one(index)) for index in range(len(arrays))]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    finally:
        await client.close()
        await control.close()


# --- scoring a written run -------------------------------------------------------------------------------------

#: Utterances whose audio is read from disk and transcribed at a time (the audio in memory stays bounded however
#: long the run; the rows of requests.jsonl, without audio, are read at once).
SCORE_BATCH = 64


def score_reports(writer: ReportWriter, asr: AsrSettings) -> None:
    """Transcribe the audio a run saved (the first measured request of each input row of each level) and score it
    against the target text: each such row of ``requests.jsonl`` gets the transcript as its ``text`` and
    ``wer``/``cer`` in its ``scores``, each level an ``asr`` summary. Files are rewritten in place, atomically."""
    from .report import read_wav
    from .tts import resample

    path = writer.requests_path
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    scored = [row for row in rows if row.get("audio_file") and row.get("reference") is not None]
    languages = [asr.language or detect_language(str(row["reference"])) for row in scored]
    by_level: dict[int, list[UtteranceScore]] = {}
    for start in range(0, len(scored), SCORE_BATCH):
        batch = scored[start : start + SCORE_BATCH]
        wavs = []
        for row in batch:
            samples, rate = read_wav(writer.output_dir / row["audio_file"])
            wavs.append(resample(samples, rate, SAMPLE_RATE))
        texts = asyncio.run(
            transcribe(
                asr.url,
                wavs,
                languages[start : start + SCORE_BATCH],
                model=asr.model,
                concurrency=asr.concurrency,
                headers=asr.headers,
            )
        )
        for row, text, language in zip(batch, texts, languages[start : start + SCORE_BATCH], strict=True):
            result = score(text, str(row["reference"]), language)
            row["text"] = text
            row["scores"] = {**row.get("scores", {}), "wer": result.wer, "cer": result.cer}
            by_level.setdefault(row["level"], []).append(result)
    atomic_write_text(path, "".join(json.dumps(row, default=str) + "\n" for row in rows))
    for level in writer.levels:
        level["asr"] = aggregate(by_level.get(level["level"], []))
    writer.extra["asr"] = {"url": asr.url, "model": asr.model, "language": asr.language or "auto"}
