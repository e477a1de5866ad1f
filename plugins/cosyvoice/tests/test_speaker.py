"""The speaker embedding's front end (Kaldi fbank, as the official front end computes it) and CAM++ from ONNX."""

from __future__ import annotations

import numpy as np
import pytest
from trtdeploy_cosyvoice.speaker import CAMPPLUS, EMBEDDING_DIM, SpeakerEncoder, speaker_features


def _kaldi_fbank(samples: np.ndarray, rate: int = 16000, bins: int = 80) -> np.ndarray:
    """Kaldi's fbank recipe written out in numpy: 25/10 ms frames with snip_edges, DC removal, pre-emphasis 0.97,
    Povey window, 512-point power spectrum, triangular mel banks (Kaldi's mel scale, 20 Hz to Nyquist), log."""
    length, shift, fft = 400, 160, 512
    count = 1 + (len(samples) - length) // shift
    frames = np.stack([samples[i * shift : i * shift + length] for i in range(count)]).astype(np.float64)
    frames -= frames.mean(axis=1, keepdims=True)
    emphasised = frames.copy()
    emphasised[:, 1:] -= 0.97 * frames[:, :-1]
    emphasised[:, 0] -= 0.97 * frames[:, 0]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / (length - 1))) ** 0.85
    power = np.abs(np.fft.rfft(emphasised * window, fft)) ** 2

    def mel(hz):
        return 1127.0 * np.log(1.0 + np.asarray(hz) / 700.0)

    edges = mel(20.0) + (mel(rate / 2) - mel(20.0)) * np.arange(bins + 2) / (bins + 1)
    bin_mels = mel(np.arange(fft // 2) * rate / fft)  # Kaldi leaves out the Nyquist bin
    banks = np.zeros((bins, fft // 2 + 1))
    for index in range(bins):
        left, centre, right = edges[index : index + 3]
        rising, falling = (bin_mels - left) / (centre - left), (right - bin_mels) / (right - centre)
        banks[index, : fft // 2] = np.clip(np.minimum(rising, falling), 0.0, None)
    return np.log(np.maximum(power @ banks.T, np.finfo(np.float32).eps))


def _reference_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    time = np.arange(int(seconds * 16000) + seed) / 16000  # odd lengths too
    return (0.3 * np.sin(2 * np.pi * (180 + 40 * seed) * time) + 0.05 * rng.standard_normal(len(time))).astype(
        np.float32
    )


@pytest.mark.parametrize(("seconds", "seed"), [(0.5, 1), (3.0, 2)])
def test_features_are_kaldis_fbank_with_each_bins_mean_removed(seconds, seed):
    samples = _reference_audio(seconds, seed)
    features = speaker_features(samples)
    expected = _kaldi_fbank(samples)
    assert features.shape == (1 + (len(samples) - 400) // 160, 80) and features.dtype == np.float32
    # float32 in the library against float64 here: measured 6e-5 (0.5 s) and 1.7e-4 (3 s) at most, values up to 13
    np.testing.assert_allclose(features, expected - expected.mean(axis=0), atol=5e-4)
    np.testing.assert_array_equal(speaker_features(samples), features)  # no dither: the same audio, the same features


def test_a_reference_without_a_whole_frame_is_refused():
    with pytest.raises(ValueError, match="at least 400 samples"):
        speaker_features(np.zeros(399, dtype=np.float32))
    with pytest.raises(ValueError, match="mono"):
        speaker_features(np.zeros((2, 16000), dtype=np.float32))


def test_embeddings_of_a_batch_equal_each_reference_alone(cosyvoice_checkpoint):
    encoder = SpeakerEncoder(cosyvoice_checkpoint("cosyvoice2") / CAMPPLUS)
    references = [_reference_audio(seconds, seed) for seconds, seed in [(1.0, 1), (2.5, 2), (0.03, 3)]]
    together = encoder.embed(references)
    assert together.shape == (3, EMBEDDING_DIM) and together.dtype == np.float32
    for row, samples in enumerate(references):
        np.testing.assert_array_equal(encoder.embed([samples])[0], together[row])
    assert not np.allclose(together[0], together[1], atol=1e-3)
