"""The reference's 24 kHz log-mel frames (prompt_speech_feat) and their alignment with its speech tokens."""

import numpy as np
import pytest
from trtdeploy_cosyvoice.prompt_mel import HOP, MEL_BINS, PromptMel, align


def tone(frequency: float, samples: int) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * frequency * np.arange(samples) / 16000)).astype(np.float32)


@pytest.mark.parametrize(("samples", "frames"), [(48077, 150), (112639, 351), (16000, 50)])
def test_fifty_frames_a_second_of_the_resampled_reference(samples, frames):
    features = PromptMel(fmax=8000).features(tone(440, samples))
    assert features.shape == (frames, MEL_BINS) and features.dtype == np.float32
    assert frames == round(samples * 1.5) // HOP


def test_a_tone_lights_the_filter_over_its_frequency_and_the_floor_is_log_1e_5():
    mel = PromptMel(fmax=None)
    centres = (mel.filters * np.arange(len(mel.filters))[:, None]).sum(0) / mel.filters.sum(0) * 12.5  # Hz a bin
    for frequency in (300.0, 1000.0, 3000.0):
        loudest = mel.features(tone(frequency, 16000))[10:-10].mean(0).argmax()
        assert abs(centres[loudest] - frequency) < 0.1 * frequency
    silence = mel.features(np.zeros(16000, dtype=np.float32))
    assert np.allclose(silence, np.log(1e-5))


def test_cosyvoice2s_filters_stop_at_8_khz_and_cosyvoice3s_at_nyquist():
    above_8k = slice(int(8000 / 12.5) + 1, None)  # 12.5 Hz per FFT bin at 24 kHz, n_fft 1920
    assert PromptMel(fmax=8000).filters[above_8k].max() == 0
    assert PromptMel(fmax=None).filters[above_8k].max() > 0


def test_a_reference_too_short_for_a_frame_gives_none():
    assert PromptMel(fmax=8000).features(np.zeros(100, dtype=np.float32)).shape == (0, MEL_BINS)


def test_tokens_and_frames_are_cut_to_two_frames_a_token():
    tokens, features = align(np.arange(176), np.zeros((351, MEL_BINS)))
    assert len(tokens) == 175 and len(features) == 350
    tokens, features = align(np.arange(70), np.zeros((150, MEL_BINS)))
    assert len(tokens) == 70 and len(features) == 140


def test_the_mel_is_matchas_recipe_as_torch_computes_it():
    """The same frames as torch.stft over the reflect-padded 24 kHz wave (what the official front end runs)."""
    import soxr
    import torch
    from trtdeploy_cosyvoice.prompt_mel import N_FFT

    wave = np.random.default_rng(0).standard_normal(16000 * 3).astype(np.float32) * 0.1
    for fmax in (8000.0, None):
        mel = PromptMel(fmax=fmax)
        samples = torch.from_numpy(soxr.resample(wave, 16000, 24000))
        padded = torch.nn.functional.pad(samples[None, None], ((N_FFT - HOP) // 2,) * 2, mode="reflect")[0]
        window = torch.hann_window(N_FFT)
        spectrum = torch.stft(padded, N_FFT, HOP, N_FFT, window, center=False, return_complex=True)[0]
        magnitude = torch.sqrt(spectrum.real**2 + spectrum.imag**2 + 1e-9)
        expected = torch.log((torch.from_numpy(mel.filters).T @ magnitude).clamp_min(1e-5)).T.numpy()
        assert np.abs(mel.features(wave) - expected).max() < 1e-4
