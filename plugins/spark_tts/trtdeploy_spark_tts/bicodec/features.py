"""The speech features BiCodec's semantic tokenizer reads: wav2vec2 hidden states 11, 14 and 16, averaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2Model

# hidden_states[k] is the input of encoder layer k (0-based), i.e. the output of layer k - 1.
MIXED_HIDDEN_STATES = (11, 14, 16)


class SpeechFeatures:
    """Batched wav2vec2 features, as the official tokenizer computes them one utterance at a time.

    A batch is padded at the end and run with its attention mask; the feature extractor normalizes each utterance
    over its own samples, and the model zeroes padded frames before its positional convolution and masks them out of
    attention, so each utterance's features match what it gives alone, up to float rounding.
    """

    def __init__(self, extractor: Wav2Vec2FeatureExtractor, model: Wav2Vec2Model):
        deepest = max(MIXED_HIDDEN_STATES)
        if len(model.encoder.layers) < deepest:
            raise ValueError(f"wav2vec2 has {len(model.encoder.layers)} layers; the features need {deepest}")
        # The layers past the deepest mixed state, and the closing layer norm, never reach the features.
        model.encoder.layers = model.encoder.layers[:deepest]
        model.encoder.layer_norm = nn.Identity()
        self.extractor = extractor
        self.model = model.eval().requires_grad_(False)
        self.sample_rate = extractor.sampling_rate

    @classmethod
    def load(
        cls, folder: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> SpeechFeatures:
        extractor = Wav2Vec2FeatureExtractor.from_pretrained(folder)
        model = Wav2Vec2Model.from_pretrained(folder).to(device=device, dtype=dtype)
        return cls(extractor, model)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def frame_counts(self, sample_counts: torch.Tensor) -> torch.Tensor:
        """Feature frames for waveforms of these lengths (the conv feature encoder pads nothing)."""
        frames = sample_counts
        for kernel, stride in zip(self.model.config.conv_kernel, self.model.config.conv_stride, strict=True):
            frames = torch.div(frames - kernel, stride, rounding_mode="floor") + 1
        return frames

    @torch.inference_mode()
    def __call__(self, wavs: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """16 kHz mono float32 waveforms to features ``[B, T_feat, hidden]`` (padded at the end) and the frame
        counts ``[B]``, both on the model's device."""
        inputs = self.extractor(
            [np.asarray(wav, dtype=np.float32) for wav in wavs],
            sampling_rate=self.sample_rate,
            padding=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        device, dtype = self.model.device, self.model.dtype
        attention_mask = inputs.attention_mask.to(device)
        hidden_states = self.model(
            inputs.input_values.to(device=device, dtype=dtype), attention_mask=attention_mask, output_hidden_states=True
        ).hidden_states
        first, second, third = (hidden_states[index] for index in MIXED_HIDDEN_STATES)
        return (first + second + third) / 3, self.frame_counts(attention_mask.sum(dim=1))
