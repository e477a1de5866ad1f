"""Random-weight checkpoints in the official Spark-TTS layout (everything but the LLM), for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
import yaml
from safetensors.torch import save_file
from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

from .codec import BiCodec
from .config import BiCodecConfig
from .layers import FeatureDecoder, WeightNormConv1d, WeightNormConvTranspose1d
from .speaker import ECAPA_LATENT_CHANNELS, ECAPA_SE_BOTTLENECK
from .tokenizer import WAV2VEC2_FOLDER

# The checkpoint root's config.yaml of SparkAudio/Spark-TTS-0.5B.
ROOT_CONFIG = {
    "highpass_cutoff_freq": 40,
    "sample_rate": 16000,
    "segment_duration": 2.4,
    "max_val_duration": 12,
    "latent_hop_length": 320,
    "ref_segment_duration": 6,
    "volume_normalize": True,
}
# The shape of facebook/wav2vec2-large-xlsr-53, and a small model of the same kind with hidden_states[16].
_WAV2VEC2_SHAPES = {
    "full": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "conv_dim": [512] * 7,
        "num_conv_pos_embeddings": 128,
        "num_conv_pos_embedding_groups": 16,
    },
    "tiny": {
        "hidden_size": 32,
        "num_hidden_layers": 16,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "conv_dim": [16] * 7,
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 4,
    },
}
_RESIDUAL_BRANCH_GAIN = 0.3
_OUTPUT_CONV_GAIN = 0.1


def _random_tensor(name: str, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A value for one official entry that keeps activations in a sane range (unit-ish variance, no saturation)."""
    shape = like.shape
    if not like.is_floating_point():
        return torch.zeros(shape, dtype=like.dtype)
    if name.endswith(("running_var", "alpha")) or (like.dim() == 1 and name.endswith(("weight", "gamma"))):
        return torch.empty(shape).uniform_(0.5, 1.5, generator=generator)
    if name.endswith(("bias", "running_mean")):
        return 0.1 * torch.randn(shape, generator=generator)
    if name.endswith(("codebook.weight", "latents")):
        return torch.randn(shape, generator=generator)
    fan_in = like[0].numel()
    return torch.randn(shape, generator=generator) / fan_in**0.5


def _training_only_entries(config: BiCodecConfig) -> dict[str, torch.Tensor]:
    """Entries of the official checkpoint that no part here uses, shaped from the config (values unset)."""
    postnet = FeatureDecoder(config.postnet).state_dict()
    entries = {f"postnet.{key}": tensor for key, tensor in postnet.items()}
    # Attentive statistics pooling: attention over the latents and their global mean and std, pooling mean and std.
    pooled = 2 * ECAPA_LATENT_CHANNELS
    head = "speaker_encoder.speaker_encoder."
    entries.update(
        {
            f"{head}pool.linear1.weight": torch.empty(ECAPA_SE_BOTTLENECK, 3 * ECAPA_LATENT_CHANNELS, 1),
            f"{head}pool.linear1.bias": torch.empty(ECAPA_SE_BOTTLENECK),
            f"{head}pool.linear2.weight": torch.empty(ECAPA_LATENT_CHANNELS, ECAPA_SE_BOTTLENECK, 1),
            f"{head}pool.linear2.bias": torch.empty(ECAPA_LATENT_CHANNELS),
            f"{head}bn.weight": torch.empty(pooled),
            f"{head}bn.bias": torch.empty(pooled),
            f"{head}bn.running_mean": torch.empty(pooled),
            f"{head}bn.running_var": torch.empty(pooled),
            f"{head}bn.num_batches_tracked": torch.empty((), dtype=torch.int64),
            f"{head}linear.weight": torch.empty(config.speaker_encoder.out_dim, pooled),
            f"{head}linear.bias": torch.empty(config.speaker_encoder.out_dim),
            "quantizer.cluster_size": torch.empty(config.quantizer.codebook_size),
        }
    )
    return entries


def random_official_state_dict(config: BiCodecConfig, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the official entry names, weight-normalized convs as ``weight_g``/``weight_v``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = BiCodec(config)
        entries = {**model.state_dict(), **_training_only_entries(config)}
    state = {name: _random_tensor(name, like, generator) for name, like in entries.items()}
    state["quantizer.cluster_size"].zero_()
    last_conv = f"decoder.model.{len(model.decoder.model) - 2}"
    for module_name, module in model.named_modules():
        if isinstance(module, WeightNormConv1d | WeightNormConvTranspose1d):
            direction = state.pop(f"{module_name}.weight")
            norm = direction.flatten(1).norm(dim=1).view(-1, *[1] * (direction.dim() - 1))
            # Damp the residual branches and the last conv so that the waveform stays in tanh's linear range.
            gain = _RESIDUAL_BRANCH_GAIN if module_name.endswith("block.3") else 1.0
            gain = _OUTPUT_CONV_GAIN if module_name == last_conv else gain
            state[f"{module_name}.weight_v"] = direction
            state[f"{module_name}.weight_g"] = (
                gain * norm * torch.empty_like(norm).uniform_(0.8, 1.2, generator=generator)
            )
    return state


def write_random_checkpoint_parts(dest: Path, *, size: Literal["tiny", "full"] = "tiny", seed: int = 0) -> None:
    """Writes ``config.yaml``, ``BiCodec/{config.yaml, model.safetensors}`` and ``wav2vec2-large-xlsr-53/`` (a random
    Wav2Vec2Model with its feature extractor) under ``dest``, in the official layout. ``tiny`` is a small model of the
    same architecture and token rates; ``full`` has the real shapes."""
    dest = Path(dest)
    wav2vec2_config = Wav2Vec2Config(
        **_WAV2VEC2_SHAPES[size], feat_extract_norm="layer", do_stable_layer_norm=True, conv_bias=True
    )
    config = BiCodecConfig.full() if size == "full" else BiCodecConfig.tiny(wav2vec2_config.hidden_size)
    (dest / "BiCodec").mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(ROOT_CONFIG, sort_keys=False))
    config.to_yaml(dest / "BiCodec" / "config.yaml")
    save_file(random_official_state_dict(config, seed=seed), dest / "BiCodec" / "model.safetensors")

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wav2vec2 = Wav2Vec2Model(wav2vec2_config)
    wav2vec2.save_pretrained(dest / WAV2VEC2_FOLDER)
    Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=True
    ).save_pretrained(dest / WAV2VEC2_FOLDER)
