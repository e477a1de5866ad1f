"""BiCodec: wav2vec2 features and a reference clip to semantic and global tokens, and those tokens back to audio."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .config import BiCodecConfig, QuantizerConfig, vocoder_receptive_radius
from .layers import (
    FeatureDecoder,
    FeatureEncoder,
    WaveGenerator,
    WeightNormConv1d,
)
from .mel import MelSpectrogram
from .speaker import SpeakerEncoder

Part = Literal["tokenizer", "vocoder"]
ALL_PARTS: tuple[Part, ...] = ("tokenizer", "vocoder")

# Official checkpoint entries each part needs alone; entries under neither are shared (the codebooks).
_PART_PREFIXES: dict[Part, tuple[str, ...]] = {
    "tokenizer": (
        "encoder.",
        "quantizer.in_project.",
        "speaker_encoder.speaker_encoder.",
        "speaker_encoder.perceiver_sampler.",
        "speaker_encoder.quantizer.project_in.",
    ),
    "vocoder": (
        "prenet.",
        "decoder.",
        "quantizer.out_project.",
        "speaker_encoder.quantizer.project_out.",
        "speaker_encoder.project.",
    ),
}
# Official checkpoint entries that only training uses: the postnet, the x-vector head, codebook usage statistics, and
# torchaudio's mel buffers (which the released checkpoint does not have).
TRAINING_ONLY_PREFIXES = (
    "postnet.",
    "speaker_encoder.speaker_encoder.pool.",
    "speaker_encoder.speaker_encoder.bn.",
    "speaker_encoder.speaker_encoder.linear.",
    "quantizer.cluster_size",
    "mel_transformer.",
)
# (magnitude, direction) suffixes of a weight-normalized ``weight``: torch.nn.utils.weight_norm's, as the official
# checkpoint stores them, and torch.nn.utils.parametrizations.weight_norm's.
_WEIGHT_NORM_SUFFIXES = (
    ("weight_g", "weight_v"),
    ("parametrizations.weight.original0", "parametrizations.weight.original1"),
)


def weight_from_norm(magnitude: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """``magnitude * direction / ||direction||``, the norm taken per slice along dim 0 (weight norm's default)."""
    norm = direction.flatten(1).norm(dim=1).view(magnitude.shape)
    return direction * (magnitude / norm)


def fold_weight_norm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replaces each weight-norm pair in a state dict by the plain ``weight`` it stands for."""
    folded = {}
    for key, tensor in state.items():
        for magnitude_suffix, direction_suffix in _WEIGHT_NORM_SUFFIXES:
            if key.endswith(magnitude_suffix):
                prefix = key[: -len(magnitude_suffix)]
                folded[prefix + "weight"] = weight_from_norm(tensor, state[prefix + direction_suffix])
                break
            if key.endswith(direction_suffix):
                break
        else:
            folded[key] = tensor
    return folded


class SemanticQuantizer(nn.Module):
    """``quantizer``: a factorized codebook. Encoding projects each latent frame down to ``codebook_dim`` and picks
    the nearest codeword after L2-normalizing both (so the nearest by cosine); decoding looks the codeword up and
    projects it back up."""

    def __init__(self, config: QuantizerConfig, *, encode: bool, decode: bool):
        super().__init__()
        self.in_project = WeightNormConv1d(config.input_dim, config.codebook_dim, 1) if encode else None
        self.out_project = WeightNormConv1d(config.codebook_dim, config.input_dim, 1) if decode else None
        self.codebook = nn.Embedding(config.codebook_size, config.codebook_dim)

    def encode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[B, input_dim, T]`` to tokens ``[B, T]``."""
        projected = F.normalize(self.in_project(latents).transpose(1, 2).flatten(0, 1))
        codewords = F.normalize(self.codebook.weight)
        # The squared euclidean distance written out, in the official order of operations, so near-ties resolve
        # the same way.
        distances = (
            projected.pow(2).sum(1, keepdim=True)
            - 2 * projected @ codewords.t()
            + codewords.pow(2).sum(1, keepdim=True).t()
        )
        return distances.argmin(dim=1).view(latents.shape[0], latents.shape[2])

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens ``[B, T]`` to ``[B, input_dim, T]``."""
        return self.out_project(self.codebook(tokens).transpose(1, 2))


class BiCodec(nn.Module):
    """Spark-TTS's audio codec, built from the official config and loaded from the official checkpoint.

    ``parts`` picks what to build: ``"tokenizer"`` (wav2vec2 features and a reference clip to tokens) and/or
    ``"vocoder"`` (tokens to a 16 kHz waveform). Weight norm is folded into plain weights at load. ``detokenize``
    makes no host round trip, so a caller can capture it in a CUDA graph for a fixed input shape.
    """

    def __init__(self, config: BiCodecConfig, parts: Iterable[Part] = ALL_PARTS):
        super().__init__()
        self.parts = tuple(parts)
        unknown = set(self.parts) - set(ALL_PARTS)
        if unknown or not self.parts:
            raise ValueError(f"parts must be a non-empty subset of {ALL_PARTS}, got {self.parts}")
        tokenizer, vocoder = "tokenizer" in self.parts, "vocoder" in self.parts
        self.config = config
        self.mel_spectrogram = MelSpectrogram(config.mel_params) if tokenizer else None
        self.encoder = FeatureEncoder(config.encoder) if tokenizer else None
        self.quantizer = SemanticQuantizer(config.quantizer, encode=tokenizer, decode=vocoder)
        self.speaker_encoder = SpeakerEncoder(config.speaker_encoder, encode=tokenizer, decode=vocoder)
        self.prenet = FeatureDecoder(config.prenet) if vocoder else None
        self.decoder = WaveGenerator(config.decoder) if vocoder else None

    @classmethod
    def load(
        cls,
        bicodec_dir: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        parts: Iterable[Part] = ALL_PARTS,
    ) -> BiCodec:
        """Loads ``config.yaml`` and ``model.safetensors`` from the official ``BiCodec/`` folder."""
        directory = Path(bicodec_dir)
        model = cls(BiCodecConfig.from_yaml(directory / "config.yaml"), parts)
        model.load_official_state_dict(load_file(directory / "model.safetensors"))
        model.to(device=device)
        for name, child in model.named_children():
            # The mel filterbank stays float32 whatever the model's dtype.
            if name != "mel_spectrogram":
                child.to(dtype=dtype)
        return model.eval().requires_grad_(False)

    def load_official_state_dict(self, checkpoint: Mapping[str, torch.Tensor]) -> None:
        """Loads the entries the built parts need; raises on missing entries and on entries that belong to no part."""
        state = fold_weight_norm(checkpoint)
        wanted = self.state_dict()
        ignorable = TRAINING_ONLY_PREFIXES + tuple(
            prefix for part in ALL_PARTS if part not in self.parts for prefix in _PART_PREFIXES[part]
        )
        missing = sorted(set(wanted) - set(state))
        unexpected = sorted(key for key in state if key not in wanted and not key.startswith(ignorable))
        if missing or unexpected:
            raise ValueError(f"not a BiCodec checkpoint of this config: missing {missing}, unexpected {unexpected}")
        self.load_state_dict({key: state[key] for key in wanted})

    @property
    def samples_per_token(self) -> int:
        return self.config.samples_per_token

    @property
    def vocoder_receptive_radius(self) -> int:
        return vocoder_receptive_radius(self.config)

    def _require(self, part: Part) -> None:
        if part not in self.parts:
            raise RuntimeError(f"this BiCodec was loaded without its {part} (parts={self.parts})")

    @torch.inference_mode()
    def tokenize(
        self, features: torch.Tensor, feature_lengths: torch.Tensor, ref_wavs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Semantic and global tokens for a batch.

        ``features`` ``[B, T, D]`` are wav2vec2 features padded at the end, ``feature_lengths`` ``[B]`` their valid
        frame counts, ``ref_wavs`` ``[B, S]`` the reference clips (16 kHz, one length for all).

        Returns ``semantic`` ``[B, T]`` (int64), one token per feature frame: row i's tokens are
        ``semantic[i, :feature_lengths[i]]`` and its later positions hold -1; and ``global_`` ``[B, token_num]``
        (int64). Padding never reaches a valid frame (padded frames are zeroed before every convolution), so each
        row's tokens are those of that request alone.
        """
        self._require("tokenizer")
        device, dtype = self.quantizer.codebook.weight.device, self.quantizer.codebook.weight.dtype
        features = features.to(device=device, dtype=dtype)
        frame_mask = torch.arange(features.shape[1], device=device) < feature_lengths.to(device).unsqueeze(1)
        semantic = self.quantizer.encode(self.encoder(features, frame_mask)).masked_fill(~frame_mask, -1)
        mels = self.mel_spectrogram(ref_wavs.to(device)).to(dtype)
        return semantic, self.speaker_encoder.tokenize(mels)

    @torch.inference_mode()
    def detokenize(self, semantic: torch.Tensor, global_: torch.Tensor) -> torch.Tensor:
        """Semantic tokens ``[B, T]`` and global tokens ``[B, token_num]`` to 16 kHz audio ``[B, T * 320]``."""
        self._require("vocoder")
        device = self.quantizer.codebook.weight.device
        speaker = self.speaker_encoder.detokenize(global_.to(device))
        hidden = self.prenet(self.quantizer.decode(semantic.to(device)), speaker)
        return self.decoder(hidden + speaker.unsqueeze(-1)).squeeze(1)
