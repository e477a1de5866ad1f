"""BiCodec's configuration: the ``audio_tokenizer`` section of the official ``BiCodec/config.yaml``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Fixed sizes of the architecture (not in config.yaml).
CONVNEXT_KERNEL = 7
RESAMPLE_STAGE_LAYERS = 2
GENERATOR_OUTER_KERNEL = 7
RESIDUAL_UNIT_KERNEL = 7
RESIDUAL_UNIT_DILATIONS = (1, 3, 9)


@dataclass
class MelConfig:
    """The mel spectrogram the speaker encoder reads (magnitude, Slaney mel scale and norm, no log)."""

    sample_rate: int
    n_fft: int
    win_length: int
    hop_length: int
    mel_fmin: float
    mel_fmax: float | None
    num_mels: int


@dataclass
class FeatureEncoderConfig:
    """The ``encoder``: wav2vec2 features to the latents the semantic quantizer reads."""

    input_channels: int
    vocos_dim: int
    vocos_intermediate_dim: int
    vocos_num_layers: int
    out_channels: int
    sample_ratios: list[int] = field(default_factory=lambda: [1, 1])


@dataclass
class WaveGeneratorConfig:
    """The ``decoder``: a DAC-style generator that upsamples one frame per token by ``prod(rates)``."""

    input_channel: int
    channels: int
    rates: list[int]
    kernel_sizes: list[int]


@dataclass
class QuantizerConfig:
    """The semantic quantizer: a factorized, L2-normalized codebook lookup.

    ``commitment``, ``codebook_loss_weight``, ``use_l2_normlize`` and ``threshold_ema_dead_code`` only matter for
    training; they are kept so that a config we write loads in the official code, which requires ``commitment``.
    """

    input_dim: int
    codebook_size: int
    codebook_dim: int
    commitment: float = 0.25
    codebook_loss_weight: float = 2.0
    use_l2_normlize: bool = True
    threshold_ema_dead_code: float = 0.2


@dataclass
class SpeakerEncoderConfig:
    """The global (speaker) tokenizer: ECAPA-TDNN, a perceiver resampler to ``token_num`` latents, and FSQ."""

    input_dim: int
    out_dim: int
    latent_dim: int
    token_num: int
    fsq_levels: list[int]
    fsq_num_quantizers: int = 1


@dataclass
class FeatureDecoderConfig:
    """The ``prenet`` (conditioned on the speaker vector) and the training-only ``postnet``."""

    input_channels: int
    vocos_dim: int
    vocos_intermediate_dim: int
    vocos_num_layers: int
    out_channels: int
    condition_dim: int | None = None
    sample_ratios: list[int] = field(default_factory=lambda: [1, 1])
    use_tanh_at_final: bool = False


_SECTIONS = {
    "mel_params": MelConfig,
    "encoder": FeatureEncoderConfig,
    "decoder": WaveGeneratorConfig,
    "quantizer": QuantizerConfig,
    "speaker_encoder": SpeakerEncoderConfig,
    "prenet": FeatureDecoderConfig,
    "postnet": FeatureDecoderConfig,
}


@dataclass
class BiCodecConfig:
    mel_params: MelConfig
    encoder: FeatureEncoderConfig
    decoder: WaveGeneratorConfig
    quantizer: QuantizerConfig
    speaker_encoder: SpeakerEncoderConfig
    prenet: FeatureDecoderConfig
    postnet: FeatureDecoderConfig

    def __post_init__(self) -> None:
        problems = []
        ratios = [*self.encoder.sample_ratios, *self.prenet.sample_ratios, *self.postnet.sample_ratios]
        if any(ratio != 1 for ratio in ratios):
            problems.append(f"sample_ratios other than 1 are not supported (got {ratios})")
        if self.speaker_encoder.fsq_num_quantizers != 1:
            problems.append("only fsq_num_quantizers: 1 is supported")
        if math.prod(self.decoder.rates) != self.mel_params.hop_length:
            problems.append(
                f"decoder rates {self.decoder.rates} upsample by {math.prod(self.decoder.rates)}, "
                f"not by the hop length {self.mel_params.hop_length}"
            )
        if len(self.decoder.rates) != len(self.decoder.kernel_sizes):
            problems.append("decoder rates and kernel_sizes differ in length")
        if self.decoder.channels % 2 ** len(self.decoder.rates):
            problems.append(f"decoder channels must be divisible by {2 ** len(self.decoder.rates)}")
        if self.prenet.condition_dim != self.speaker_encoder.out_dim:
            problems.append("prenet condition_dim must equal speaker_encoder out_dim")
        if self.speaker_encoder.input_dim != self.mel_params.num_mels:
            problems.append("speaker_encoder input_dim must equal mel_params num_mels")
        if problems:
            raise ValueError("unsupported BiCodec config: " + "; ".join(problems))

    @property
    def samples_per_token(self) -> int:
        return self.mel_params.hop_length

    @classmethod
    def from_dict(cls, audio_tokenizer: dict[str, Any]) -> BiCodecConfig:
        missing = sorted(set(_SECTIONS) - set(audio_tokenizer))
        if missing:
            raise ValueError(f"BiCodec config lacks the sections {missing}")
        sections = {}
        for name, section_type in _SECTIONS.items():
            values = dict(audio_tokenizer[name])
            known = {f.name for f in dataclasses.fields(section_type)}
            unknown = sorted(set(values) - known)
            if unknown:
                raise ValueError(f"BiCodec config section {name!r} has unknown keys {unknown}")
            sections[name] = section_type(**values)
        return cls(**sections)

    def to_dict(self) -> dict[str, Any]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}

    @classmethod
    def from_yaml(cls, path: str | Path) -> BiCodecConfig:
        """Reads the official layout: the sections under the top-level key ``audio_tokenizer``."""
        document = yaml.safe_load(Path(path).read_text())
        if not isinstance(document, dict) or "audio_tokenizer" not in document:
            raise ValueError(f"{path}: no top-level 'audio_tokenizer' key")
        return cls.from_dict(document["audio_tokenizer"])

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump({"audio_tokenizer": self.to_dict()}, sort_keys=False))

    @classmethod
    def full(cls) -> BiCodecConfig:
        """The configuration of SparkAudio/Spark-TTS-0.5B."""
        return cls(
            mel_params=MelConfig(
                sample_rate=16000, n_fft=1024, win_length=640, hop_length=320, mel_fmin=10, mel_fmax=None, num_mels=128
            ),
            encoder=FeatureEncoderConfig(
                input_channels=1024, vocos_dim=384, vocos_intermediate_dim=2048, vocos_num_layers=12, out_channels=1024
            ),
            decoder=WaveGeneratorConfig(
                input_channel=1024, channels=1536, rates=[8, 5, 4, 2], kernel_sizes=[16, 11, 8, 4]
            ),
            quantizer=QuantizerConfig(input_dim=1024, codebook_size=8192, codebook_dim=8),
            speaker_encoder=SpeakerEncoderConfig(
                input_dim=128, out_dim=1024, latent_dim=128, token_num=32, fsq_levels=[4] * 6
            ),
            prenet=FeatureDecoderConfig(
                input_channels=1024,
                vocos_dim=384,
                vocos_intermediate_dim=2048,
                vocos_num_layers=12,
                out_channels=1024,
                condition_dim=1024,
            ),
            postnet=FeatureDecoderConfig(
                input_channels=1024, vocos_dim=384, vocos_intermediate_dim=2048, vocos_num_layers=6, out_channels=1024
            ),
        )

    @classmethod
    def tiny(cls, wav2vec2_hidden_size: int = 32) -> BiCodecConfig:
        """A small model for tests: the same architecture and token rates (320 samples per semantic token at 16 kHz,
        32 global tokens), few channels and layers. ``wav2vec2_hidden_size`` is the encoder's input width.

        The speaker encoder's ECAPA-TDNN width (512) and the perceiver's attention shape are fixed by the official
        code, not by the config, so they stay full size.
        """
        return cls(
            mel_params=MelConfig(
                sample_rate=16000, n_fft=1024, win_length=640, hop_length=320, mel_fmin=10, mel_fmax=None, num_mels=128
            ),
            encoder=FeatureEncoderConfig(
                input_channels=wav2vec2_hidden_size,
                vocos_dim=16,
                vocos_intermediate_dim=32,
                vocos_num_layers=2,
                out_channels=16,
            ),
            decoder=WaveGeneratorConfig(input_channel=16, channels=32, rates=[8, 5, 4, 2], kernel_sizes=[16, 11, 8, 4]),
            quantizer=QuantizerConfig(input_dim=16, codebook_size=8192, codebook_dim=4),
            speaker_encoder=SpeakerEncoderConfig(
                input_dim=128, out_dim=16, latent_dim=8, token_num=32, fsq_levels=[4] * 6
            ),
            prenet=FeatureDecoderConfig(
                input_channels=16,
                vocos_dim=16,
                vocos_intermediate_dim=32,
                vocos_num_layers=2,
                out_channels=16,
                condition_dim=16,
            ),
            postnet=FeatureDecoderConfig(
                input_channels=16, vocos_dim=16, vocos_intermediate_dim=32, vocos_num_layers=1, out_channels=16
            ),
        )


def feature_decoder_token_radius(config: FeatureDecoderConfig) -> int:
    """How many frames on each side reach an output frame: every conv in the backbones is ``CONVNEXT_KERNEL`` wide,
    one input conv plus one per ConvNeXt block."""
    convs = len(config.sample_ratios) * (1 + RESAMPLE_STAGE_LAYERS) + 1 + config.vocos_num_layers
    return (CONVNEXT_KERNEL // 2) * convs


def wave_generator_token_radius(config: WaveGeneratorConfig) -> int:
    """How many input frames (tokens) on each side can reach an output sample within a frame's span.

    Walks the generator from its output back to its input, keeping the radius in frames of the current rate: a
    stride-1 conv of kernel k and dilation d adds ``d * (k // 2)``; a transposed conv of stride s, kernel k and
    padding p turns a radius R around output sample n into at most ``ceil((R + max(k - 1 - p, p)) / s)`` around
    input frame ``n // s``, the frame whose span holds n.
    """
    per_unit = sum(dilation * (RESIDUAL_UNIT_KERNEL // 2) for dilation in RESIDUAL_UNIT_DILATIONS)
    radius = GENERATOR_OUTER_KERNEL // 2
    for rate, kernel in reversed(list(zip(config.rates, config.kernel_sizes, strict=True))):
        padding = (kernel - rate) // 2
        radius += per_unit
        radius = -(-(radius + max(kernel - 1 - padding, padding)) // rate)
    return radius + GENERATOR_OUTER_KERNEL // 2


def vocoder_receptive_radius(config: BiCodecConfig) -> int:
    """How many semantic tokens on each side of a token can change that token's audio.

    Vocoding a chunk with this many extra tokens of context on each side (or up to the sequence's ends) gives the
    chunk's audio as vocoding the whole sequence would, up to float rounding.
    """
    return feature_decoder_token_radius(config.prenet) + wave_generator_token_radius(config.decoder)
