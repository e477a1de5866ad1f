"""Speech tokens of the reference through s3tokenizer, from the full-size random tokenizer files that the random
checkpoint holds: every weight read from the file, 25 tokens per second, batches equal to single waves, the windows
of a wave over 30 s, and a file of the other generation refused."""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
import pytest
import torch
from trtdeploy_cosyvoice.generations import SPEECH_TOKENIZER_FILES
from trtdeploy_cosyvoice.speaker import CAMPPLUS
from trtdeploy_cosyvoice.speech_tokens import SpeechTokenizer, import_s3tokenizer, new_s3tokenizer_model

from trtdeploy import UsageError

GENERATIONS = list(SPEECH_TOKENIZER_FILES)
RATE = 16000


@pytest.fixture(scope="session")
def checkpoint(cosyvoice_checkpoint):
    return cosyvoice_checkpoint


@pytest.fixture(scope="session")
def tokenizer(checkpoint):
    """``tokenizer(generation)``: the checkpoint's speech tokenizer on the CPU, loaded once per generation."""
    return functools.cache(lambda generation: SpeechTokenizer.load(checkpoint(generation), generation))


def _speech_like(seconds: float, seed: int) -> np.ndarray:
    """Syllable-long stretches of voiced sound (harmonics of a gliding pitch under random formants), hiss and near
    silence, each under its own envelope: audio whose spectrum changes the way speech does."""
    rng = np.random.default_rng(seed)
    wave = np.zeros(int(seconds * RATE), dtype=np.float32)
    start = 0
    while start < len(wave):
        length = min(int(rng.uniform(0.08, 0.25) * RATE), len(wave) - start)
        time = np.arange(length) / RATE
        kind = rng.integers(3)
        if kind == 0:
            pitch = rng.uniform(90, 260)
            phase = 2 * np.pi * np.cumsum(pitch * (1 + 0.3 * time)) / RATE
            formants = rng.uniform([300, 900, 2200], [900, 2200, 3500])
            segment = sum(
                np.exp(-((k * pitch - formants) ** 2) / 2e4).sum() / k * np.sin(k * phase) for k in range(1, 30)
            )
        elif kind == 1:
            segment = np.diff(rng.standard_normal(length + 1))
        else:
            segment = 0.02 * rng.standard_normal(length)
        envelope = np.sin(np.linspace(0, np.pi, length)) ** 0.5
        wave[start : start + length] = segment / (np.abs(segment).max() + 1e-9) * envelope * rng.uniform(0.2, 0.8)
        start += length
    return wave


#: Lengths in samples: 3 s, 1.3 s and some, the shortest wave the log-mel takes (one frame, one token).
LENGTHS = (3 * RATE, 20_923, 201)


@pytest.fixture(scope="session")
def batch(tokenizer):
    """``batch(generation)``: speech-like waves of the lengths above and their tokens, computed as one batch."""

    @functools.cache
    def run(generation):
        waves = [_speech_like(length / RATE, seed) for seed, length in enumerate(LENGTHS)]
        return waves, tokenizer(generation).tokens(waves)

    return run


@pytest.mark.parametrize("generation", GENERATIONS)
def test_every_weight_comes_from_the_file(generation, checkpoint, tokenizer):
    s3tokenizer = import_s3tokenizer()
    convert = s3tokenizer.onnx2torch if generation == "cosyvoice2" else s3tokenizer.onnx2torch_v3
    from_file = convert(str(checkpoint(generation) / SPEECH_TOKENIZER_FILES[generation]))
    loaded = tokenizer(generation)._model.state_dict()
    assert set(from_file) == set(new_s3tokenizer_model(generation).state_dict()) == set(loaded)
    assert all(torch.equal(loaded[key], value.float()) for key, value in from_file.items())


@pytest.mark.parametrize("generation", GENERATIONS)
def test_tokens_are_int32_ids_at_25_per_second(generation, batch):
    waves, tokens = batch(generation)
    for wave, row in zip(waves, tokens, strict=True):
        assert row.dtype == np.int32 and row.ndim == 1
        assert len(row) == math.ceil((len(wave) // 160) / 4)  # 100 log-mel frames a second, 4 to a token
        assert row.min() >= 0 and row.max() < 6561
    assert [len(row) for row in tokens] == [75, 33, 1]
    # the random weights are scaled so that speech-like audio gives many ids (one id everywhere would test little)
    assert len(set(tokens[0].tolist())) >= 20  # 39 and 37 of 75 with these seeds


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_batch_gives_each_wave_the_tokens_it_gets_alone(generation, batch, tokenizer):
    waves, tokens = batch(generation)
    for wave, row in zip(waves, tokens, strict=True):
        np.testing.assert_array_equal(tokenizer(generation).tokens([wave])[0], row)
    assert tokenizer(generation).tokens([]) == []


def test_a_wave_over_30_seconds_is_tokenized_in_windows(tokenizer):
    """s3tokenizer cuts a wave over 3,000 frames into 30 s windows every 26 s and joins their tokens, 2 s of each
    overlap from either side; its codes are int64 then, cast to int32 here. The first window's tokens (up to 2 s
    before its end) are those of the first 30 s alone, which attention over the whole wave would not give."""
    speech_tokenizer = tokenizer("cosyvoice2")  # CosyVoice3's class windows the same way, at twice the cost
    head = _speech_like(30, seed=5)
    tail = 0.1 * _speech_like(1.5, seed=6)  # quieter: each log-mel is floored 8 below its own wave's loudest bin
    head[-400:], tail[:400] = 0, 0  # the 30 s wave's last frame reflects silence, as the longer wave's has silence
    whole = np.concatenate([head, tail])
    long_tokens, head_tokens = speech_tokenizer.tokens([whole])[0], speech_tokenizer.tokens([head])[0]
    assert long_tokens.dtype == np.int32 and len(long_tokens) == math.ceil((len(whole) // 160) / 4) == 788
    np.testing.assert_array_equal(long_tokens[:700], head_tokens[:700])


def test_the_tokenizer_class_comes_from_the_generation_not_the_path(checkpoint, tokenizer, tmp_path):
    """s3tokenizer's own load_model would take a CosyVoice2 file under a folder named v3 for CosyVoice3's."""
    (tmp_path / "v3").mkdir()
    moved = tmp_path / "v3" / SPEECH_TOKENIZER_FILES["cosyvoice2"]
    moved.symlink_to(checkpoint("cosyvoice2") / SPEECH_TOKENIZER_FILES["cosyvoice2"])
    wave = _speech_like(1.0, seed=9)
    np.testing.assert_array_equal(
        SpeechTokenizer(moved, "cosyvoice2").tokens([wave])[0], tokenizer("cosyvoice2").tokens([wave])[0]
    )


@pytest.mark.parametrize(("generation", "other", "problem"), [
    ("cosyvoice3", "cosyvoice2", r"\d+ weights \(encoder\.blocks\.0\.attn_ln\.weight, .*\) missing"),
    ("cosyvoice2", "cosyvoice3", r"missing; \d+ weights \(.*\) unexpected"),
])  # fmt: skip
def test_the_other_generations_file_is_refused_with_its_weights_named(generation, other, problem, checkpoint):
    """CosyVoice3's converter finds most of the random CosyVoice2 file, not its layer norms: s3tokenizer's own loader
    would keep those random without a word."""
    path = checkpoint(other) / SPEECH_TOKENIZER_FILES[other]
    with pytest.raises(UsageError, match=rf"is not {generation}'s speech tokenizer: .*{problem}") as refused:
        SpeechTokenizer(path, generation)
    assert str(path) in str(refused.value) and SPEECH_TOKENIZER_FILES[generation] in refused.value.hint


def test_a_file_that_is_no_speech_tokenizer_is_refused(checkpoint, tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        SpeechTokenizer(tmp_path / "speech_tokenizer_v2.onnx", "cosyvoice2")
    (tmp_path / "text.onnx").write_text("not a model")
    with pytest.raises(UsageError, match="cannot read .*text.onnx as cosyvoice2's speech tokenizer"):
        SpeechTokenizer(tmp_path / "text.onnx", "cosyvoice2")
    with pytest.raises(UsageError, match=r"campplus.onnx is not cosyvoice3's speech tokenizer: \d+ weights .* missing"):
        SpeechTokenizer(checkpoint("cosyvoice3") / CAMPPLUS, "cosyvoice3")


def test_too_short_or_not_mono_waves_are_refused(tokenizer):
    with pytest.raises(ValueError, match="at least 201 samples"):
        tokenizer("cosyvoice2").tokens([np.zeros(200, dtype=np.float32)])
    with pytest.raises(ValueError, match="mono"):
        tokenizer("cosyvoice2").tokens([np.zeros((2, RATE), dtype=np.float32)])


def test_s3tokenizer_imports_without_torchaudio():
    """The package index's torchaudio is a CUDA build: next to a CPU-only torch it does not import, and s3tokenizer,
    which imports it for its audio loading only, works without it. The stand-in does not outlive the import."""
    s3tokenizer = import_s3tokenizer()
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        pass
    else:
        pytest.skip("torchaudio imports here: s3tokenizer has the real one")
    assert "torchaudio" not in sys.modules
    with pytest.raises(ImportError, match="torchaudio.load is unavailable: torchaudio failed to import"):
        s3tokenizer.load_audio("reference.wav")
