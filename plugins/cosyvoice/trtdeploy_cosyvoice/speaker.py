"""The speaker embedding: Kaldi filterbank features of the 16 kHz reference, then CAM++ (the checkpoint's
``campplus.onnx``) to a 192-d vector that conditions the flow decoder.

The features are what the official front end computes: 80 log-mel bins over 25 ms frames every 10 ms (Povey
window, pre-emphasis 0.97, DC removed, 512-point FFT, 20 Hz to Nyquist, no dither, frames only where a whole window
fits), then each bin's mean over the utterance subtracted. CAM++ pools over time, so each reference runs on its own
(padding would change its statistics); one ONNX session serves them one after another.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
MEL_BINS = 80
EMBEDDING_DIM = 192
#: One 25 ms analysis window: a shorter reference has no frame.
MIN_SAMPLES = 400
CAMPPLUS = "campplus.onnx"


def speaker_features(samples: np.ndarray) -> np.ndarray:
    """Mean-normalised Kaldi fbank ``[frames, 80]`` (float32) of 16 kHz mono ``samples`` in [-1, 1]."""
    import kaldi_native_fbank as knf

    if samples.ndim != 1 or len(samples) < MIN_SAMPLES:
        raise ValueError(f"a speaker reference needs at least {MIN_SAMPLES} samples of 16 kHz mono audio (25 ms)")
    options = knf.FbankOptions()
    options.frame_opts.samp_freq = SAMPLE_RATE
    options.frame_opts.dither = 0.0  # the library's default adds noise: the same audio would give other features
    options.mel_opts.num_bins = MEL_BINS
    fbank = knf.OnlineFbank(options)
    fbank.accept_waveform(SAMPLE_RATE, np.ascontiguousarray(samples, dtype=np.float32).tolist())
    fbank.input_finished()
    features = np.stack([fbank.get_frame(index) for index in range(fbank.num_frames_ready)]).astype(np.float32)
    return features - features.mean(axis=0, keepdims=True)


class SpeakerEncoder:
    """CAM++ from the checkpoint's ONNX file, on onnxruntime's CPU provider."""

    def __init__(self, onnx_path: Path, *, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def embed(self, references: list[np.ndarray]) -> np.ndarray:
        """Float32 embeddings ``[len(references), 192]`` of 16 kHz mono references."""
        rows = []
        for samples in references:
            features = speaker_features(samples)[None]
            rows.append(self._session.run(None, {self._input: features})[0].reshape(-1))
        return np.stack(rows).astype(np.float32)
