"""WER/CER scoring by seed-tts-eval's rules, and the Whisper client against a fake whisper_bls on the real server."""

from __future__ import annotations

import asyncio
import shutil
import socket

import numpy as np
import pytest

from trtdeploy.errors import NotFoundError, PerfError, ServerError, UsageError
from trtdeploy.perf.asr import aggregate, detect_language, normalize, score, transcribe

from .conftest import MODELS, write_fake_repo


def transcribe_sync(*args, **kwargs) -> list[str]:
    return asyncio.run(transcribe(*args, **kwargs))


# --- normalisation ---------------------------------------------------------------------------------------------


def test_english_is_lowercased_without_punctuation_but_apostrophes():
    assert normalize('  Hello, World!  It\'s a "TEST"; (really)...', "en") == "hello world it's a test really"
    assert normalize("well-known e.g. 3.5%", "en") == "wellknown eg 35"


def test_typographic_quotes_are_punctuation_as_in_zhon():
    # seed-tts-eval keeps only the ASCII apostrophe: a curly one is stripped with the Chinese punctuation
    assert normalize("Don’t “quote” me…", "en") == "dont quote me"


def test_chinese_loses_its_punctuation_and_is_split_into_characters():
    assert normalize("你好，世界！《三体》、「很好」。", "zh") == "你 好 世 界 三 体 很 好"
    assert normalize("我爱 AI 技术。", "zh") == "我 爱 A I 技 术"
    assert normalize("\u3000全角\uff0e空格\u3000", "zh") == "全 角 空 格"


def test_language_detection():
    assert detect_language("Hello there.") == "en"
    assert detect_language("Call me at 5, OK?") == "en"
    assert detect_language("今天天气很好") == "zh"
    assert detect_language("我用 Python 写代码") == "zh"
    assert detect_language("") == "en"


def test_unknown_language_is_refused():
    with pytest.raises(UsageError, match="cannot score language 'fr'"):
        score("bonjour", "bonjour", "fr")


# --- scoring ---------------------------------------------------------------------------------------------------


def test_one_substitution_in_four_words():
    result = score("the dog sat down", "The cat sat down.")
    assert result.language == "en"
    assert (result.wer, result.word_errors, result.words) == (0.25, 1, 4)
    # "the cat sat down" has 16 characters (spaces included); c/a/t -> d/o/g are 3 substitutions
    assert (result.cer, result.char_errors, result.chars) == (3 / 16, 3, 16)
    assert result.as_dict() == {
        "language": "en",
        "wer": 0.25,
        "cer": 3 / 16,
        "word_errors": 1,
        "words": 4,
        "char_errors": 3,
        "chars": 16,
    }


def test_deletions_and_insertions_count_as_errors():
    assert score("a b c", "a b c d").word_errors == 1  # one deletion
    inserted = score("a b c d e f", "a b c d")
    assert (inserted.wer, inserted.word_errors) == (0.5, 2)
    assert score("a b", "a b c d", "en").wer == 0.5
    assert score("", "one two three").wer == 1.0


def test_punctuation_and_case_do_not_count():
    result = score("hello world it's me", "Hello, world! It's me.")
    assert (result.wer, result.cer) == (0.0, 0.0)


def test_chinese_wer_is_per_character():
    result = score("你好世界", "你好，世间。")
    assert result.language == "zh"
    assert (result.wer, result.word_errors, result.words) == (0.25, 1, 4)
    assert (result.cer, result.char_errors, result.chars) == (0.25, 1, 4)  # spaces between characters not counted


def test_language_given_overrides_detection():
    assert score("ab", "ab", "zh").words == 2  # split into characters
    assert score("ab", "ab").words == 1


def test_empty_reference():
    both_empty = score("", "…!?")
    assert (both_empty.wer, both_empty.cer, both_empty.words, both_empty.chars) == (0.0, 0.0, 0, 0)
    inserted = score("uh huh", "!!!")
    assert (inserted.wer, inserted.cer) == (1.0, 1.0)
    assert (inserted.word_errors, inserted.words, inserted.char_errors, inserted.chars) == (2, 0, 6, 0)


def test_mean_and_corpus_rates_differ():
    scores = [
        score("hullo", "hello"),  # 1 error in 1 word
        score("one two three four five six seven eight nine", "One two three four five six seven eight nine."),
    ]
    summary = aggregate(scores)
    assert summary["wer_mean"] == pytest.approx(0.5)  # seed-tts-eval's number (/100)
    assert summary["wer_corpus"] == pytest.approx(1 / 10)
    assert summary["utterances"] == 2 and summary["languages"] == {"en": 2}
    assert (summary["word_errors"], summary["words"]) == (1, 10)
    # "hello" -> "hullo": 1 of 5 characters; the second is exact (44 characters, spaces included)
    assert summary["cer_mean"] == pytest.approx((1 / 5 + 0) / 2)
    assert summary["cer_corpus"] == pytest.approx(1 / (5 + 44))
    assert summary["empty_references"] == 0


def test_aggregate_over_languages_and_empty_references():
    summary = aggregate([score("你好", "你好"), score("a b", "a c"), score("hm", "...")])
    assert summary["languages"] == {"en": 2, "zh": 1}
    assert summary["empty_references"] == 1
    assert summary["wer_mean"] == pytest.approx((0 + 0.5 + 1.0) / 3)
    assert summary["wer_corpus"] == pytest.approx((0 + 1 + 1) / (2 + 2 + 0))


def test_aggregate_of_nothing():
    summary = aggregate([])
    assert summary["utterances"] == 0 and summary["languages"] == {}
    assert summary["wer_mean"] is None and summary["wer_corpus"] is None
    assert summary["cer_mean"] is None and summary["cer_corpus"] is None
    assert aggregate([score("x", "")])["wer_corpus"] is None  # no reference words at all


# --- the client, without a server -------------------------------------------------------------------------------


def test_wrong_sample_rate_is_refused():
    with pytest.raises(UsageError, match="16000 Hz audio, got 24000 Hz"):
        transcribe_sync("localhost:1", [np.zeros(10, np.float32)], ["en"], sample_rate=24000)


@pytest.mark.parametrize(
    ("wavs", "languages", "url", "message"),
    [
        ([np.zeros(4, np.float32)], ["en", "zh"], "localhost:1", "1 wavs but 2 languages"),
        ([np.zeros(4, np.int16)], ["en"], "localhost:1", "utterance 0: wav samples must be floats"),
        ([np.zeros((2, 4), np.float32)], ["en"], "localhost:1", r"mono samples \(1-D\), got shape \[2, 4\]"),
        ([np.zeros(4, np.float32)], ["<|en|>"], "localhost:1", "not a Whisper language code"),
        ([np.zeros(4, np.float32)], ["en"], "http://localhost", "is not HOST:PORT"),
    ],
)
def test_bad_arguments_are_refused(wavs, languages, url, message):
    with pytest.raises(UsageError, match=message):
        transcribe_sync(url, wavs, languages)


def test_no_wavs_sends_nothing():
    assert transcribe_sync("localhost:1", [], []) == []


# --- the client against a fake whisper_bls ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory):
    """The bundled tritonserver serving the fake Whisper as ``whisper_bls``, and a text LLM (not Whisper)."""
    from trtdeploy.server import launch

    from ..server.helpers import off_default_ports

    root = tmp_path_factory.mktemp("asr-server")
    repo = root / "repo"
    shutil.copytree(MODELS / "fake_whisper", repo / "whisper_bls", ignore=shutil.ignore_patterns("__pycache__"))
    write_fake_repo(repo, ["text_llm"])
    with launch(repo, log_file=root / "tritonserver.log", timeout=120, **off_default_ports()) as server:
        yield server


@pytest.fixture
def whisper_url(whisper) -> str:
    return whisper.grpc_url


def wav(samples: int, first: float) -> np.ndarray:
    data = np.full(samples, 0.01, dtype=np.float32)
    if samples:
        data[0] = first
    return data


@pytest.mark.server
def test_each_wav_gets_its_own_transcript_in_order(whisper_url):
    # the fake answers "<language> <WAV_LENS> <samples> <first sample>" after abs(first) * 0.2 s: the first
    # request finishes last
    wavs = [wav(1600, 0.9), wav(800, 0.1), wav(3200, 0.5), wav(0, 0.0), wav(400, -0.25), wav(16000, 0.05)]
    languages = ["en", "zh", "en", "en", "zh", "en"]
    texts = asyncio.run(transcribe(whisper_url, wavs, languages, concurrency=3))
    assert texts == [
        "en 1600 1600 0.9",
        "zh 800 800 0.1",
        "en 3200 3200 0.5",
        "",
        "zh 400 400 -0.25",
        "en 16000 16000 0.05",
    ]
    assert transcribe_sync(f"grpc://{whisper_url}", wavs[:2], ["zh", "en"], concurrency=1) == [
        "zh 1600 1600 0.9",
        "en 800 800 0.1",
    ]


@pytest.mark.server
def test_a_failed_request_names_its_utterance(whisper_url):
    wavs = [wav(100, 0.0), wav(200, 0.0), wav(300, 0.0)]
    with pytest.raises(PerfError, match=r"utterance 1 failed \('whisper_bls' at .*\): .*fake failure"):
        transcribe_sync(whisper_url, wavs, ["en", "xx", "en"])


@pytest.mark.server
def test_unknown_model_is_named_with_the_models_there(whisper):
    """With the key to the server's model list (trtdeploy's servers restrict it) the models there are named."""
    headers = whisper.restricted_headers("grpc")
    with pytest.raises(NotFoundError, match=r"no Whisper model 'whisper' at .* \(its models: text_llm, whisper_bls\)"):
        transcribe_sync(whisper.grpc_url, [wav(10, 0.0)], ["en"], model="whisper", headers=headers)
    with pytest.raises(NotFoundError, match=r"no Whisper model 'whisper' at [0-9.:]+$") as caught:
        transcribe_sync(whisper.grpc_url, [wav(10, 0.0)], ["en"], model="whisper")
    assert caught.value.hint == "name the Whisper model with --asr-model"


@pytest.mark.server
def test_a_model_without_the_whisper_contract_is_refused(whisper_url):
    with pytest.raises(
        UsageError, match="'text_llm' .* does not speak the Whisper contract: missing input TEXT_PREFIX"
    ):
        transcribe_sync(whisper_url, [wav(10, 0.0)], ["en"], model="text_llm")


def test_unreachable_server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ServerError, match=f"cannot reach the Whisper server at 127.0.0.1:{port}"):
        transcribe_sync(f"127.0.0.1:{port}", [wav(10, 0.0)], ["en"])
