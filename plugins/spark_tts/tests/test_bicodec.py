"""BiCodec and the audio tokenizer on a random tiny checkpoint in the official layout."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from trtdeploy_spark_tts.bicodec import AudioTokenizer, BiCodec, BiCodecConfig, write_random_checkpoint_parts

SAMPLES_PER_TOKEN = 320


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark_tts")
    write_random_checkpoint_parts(root, size="tiny", seed=0)
    return root


@pytest.fixture(scope="module")
def vocoder(checkpoint):
    return BiCodec.load(checkpoint / "BiCodec", parts=("vocoder",))


def random_tokens(codec: BiCodec, batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    semantic = torch.randint(0, codec.config.quantizer.codebook_size, (batch, length), generator=generator)
    global_ = torch.randint(0, 4**6, (batch, 32), generator=generator)
    return semantic, global_


def wav2vec2_frames(samples: int) -> int:
    for kernel, stride in zip((10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2), strict=True):
        samples = (samples - kernel) // stride + 1
    return samples


def test_config_yaml_round_trip_and_strictness(tmp_path):
    for config in (BiCodecConfig.full(), BiCodecConfig.tiny()):
        config.to_yaml(tmp_path / "config.yaml")
        assert BiCodecConfig.from_yaml(tmp_path / "config.yaml") == config
    document = BiCodecConfig.tiny().to_dict()
    document["decoder"]["upsample_kind"] = "nearest"
    with pytest.raises(ValueError, match="unknown keys \\['upsample_kind'\\]"):
        BiCodecConfig.from_dict(document)
    document = BiCodecConfig.tiny().to_dict()
    document["decoder"]["rates"] = [8, 5, 4, 4]
    with pytest.raises(ValueError, match="not by the hop length 320"):
        BiCodecConfig.from_dict(document)


def test_detokenize_gives_320_samples_per_token(vocoder):
    semantic, global_ = random_tokens(vocoder, batch=2, length=37, seed=1)
    audio = vocoder.detokenize(semantic, global_)
    assert vocoder.samples_per_token == SAMPLES_PER_TOKEN
    assert audio.shape == (2, 37 * SAMPLES_PER_TOKEN)
    assert audio.dtype == torch.float32
    assert torch.isfinite(audio).all()
    assert audio.std() > 1e-2
    assert not torch.allclose(audio[0], audio[1])


def test_parts_keep_only_what_they_need(checkpoint, vocoder):
    assert vocoder.encoder is None and vocoder.mel_spectrogram is None
    assert vocoder.speaker_encoder.speaker_encoder is None and vocoder.quantizer.in_project is None
    assert not any(name.startswith(("encoder.", "postnet.")) for name in vocoder.state_dict())
    tokenizer = BiCodec.load(checkpoint / "BiCodec", parts=("tokenizer",))
    assert tokenizer.decoder is None and tokenizer.prenet is None and tokenizer.quantizer.out_project is None
    with pytest.raises(RuntimeError, match="without its vocoder"):
        tokenizer.detokenize(*random_tokens(tokenizer, batch=1, length=4, seed=0))


def test_state_dict_round_trips_with_weight_norm_folded(checkpoint):
    written = load_file(checkpoint / "BiCodec" / "model.safetensors")
    model = BiCodec.load(checkpoint / "BiCodec")
    loaded = model.state_dict()
    assert not any("weight_g" in name or "weight_v" in name for name in loaded)
    folded = 0
    for name, value in loaded.items():
        if name in written:
            assert torch.equal(value, written[name]), name
            continue
        prefix = name.removesuffix("weight")
        magnitude, direction = written[prefix + "weight_g"], written[prefix + "weight_v"]
        norm = direction.flatten(1).norm(dim=1).view(magnitude.shape)
        torch.testing.assert_close(value, magnitude * direction / norm, rtol=1e-6, atol=1e-7)
        folded += 1
    assert folded == 2 + 1 + 4 * (1 + 3 * 2) + 1  # quantizer, first conv, upsampling blocks, last conv


def test_new_style_weight_norm_keys_load_the_same(checkpoint, vocoder, tmp_path):
    renamed = {
        name.replace("weight_g", "parametrizations.weight.original0").replace(
            "weight_v", "parametrizations.weight.original1"
        ): tensor
        for name, tensor in load_file(checkpoint / "BiCodec" / "model.safetensors").items()
    }
    save_file(renamed, tmp_path / "model.safetensors")
    (tmp_path / "config.yaml").write_bytes((checkpoint / "BiCodec" / "config.yaml").read_bytes())
    other = BiCodec.load(tmp_path, parts=("vocoder",))
    tokens = random_tokens(vocoder, batch=1, length=12, seed=2)
    assert torch.equal(other.detokenize(*tokens), vocoder.detokenize(*tokens))

    del renamed["decoder.model.0.bias"]
    renamed["prenet.linear_pre.scale"] = torch.zeros(1)
    save_file(renamed, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match="missing \\['decoder.model.0.bias'\\], unexpected \\['prenet.linear_pre.scale'\\]"
    ):
        BiCodec.load(tmp_path)


def test_chunked_detokenize_matches_whole_sequence_inside_chunks(vocoder):
    radius = vocoder.vocoder_receptive_radius
    assert radius == 3 * (2 * 3 + 1 + 2) + 11  # prenet: 9 convs of kernel 7; generator: 11 (see layers.py)
    length, chunk = 150, 40
    semantic, global_ = random_tokens(vocoder, batch=1, length=length, seed=3)
    whole = vocoder.detokenize(semantic, global_)

    def chunked(context: int) -> torch.Tensor:
        pieces = []
        for start in range(0, length, chunk):
            end = min(start + chunk, length)
            left, right = max(0, start - context), min(length, end + context)
            audio = vocoder.detokenize(semantic[:, left:right], global_)
            pieces.append(audio[:, (start - left) * SAMPLES_PER_TOKEN : (end - left) * SAMPLES_PER_TOKEN])
        return torch.cat(pieces, dim=1)

    torch.testing.assert_close(chunked(radius), whole, rtol=0, atol=1e-5)
    assert not torch.allclose(chunked(radius // 2), whole, rtol=0, atol=1e-5)


def test_audio_tokenizer_batch_equals_single_requests(checkpoint):
    tokenizer = AudioTokenizer.load(checkpoint)
    rng = np.random.default_rng(4)
    lengths = (16_000, 41_000, 7_000)
    wavs = [(0.1 * rng.standard_normal(length)).astype(np.float32) for length in lengths]

    batch = tokenizer.tokenize(wavs)
    for wav, length, (global_, semantic) in zip(wavs, lengths, batch, strict=True):
        assert global_.dtype == np.int32 and global_.shape == (32,)
        assert global_.min() >= 0 and global_.max() < 4**6
        assert semantic.dtype == np.int32 and semantic.shape == (wav2vec2_frames(length),)
        assert semantic.min() >= 0 and semantic.max() < tokenizer.codec.config.quantizer.codebook_size
        [(single_global, single_semantic)] = tokenizer.tokenize([wav])
        np.testing.assert_array_equal(global_, single_global)
        np.testing.assert_array_equal(semantic, single_semantic)
    assert len(np.unique(batch[1][1])) > 10

    features, frames = tokenizer.features(wavs)
    assert frames.tolist() == [wav2vec2_frames(length) for length in lengths]
    alone, _ = tokenizer.features(wavs[2:])
    torch.testing.assert_close(features[2, : frames[2]], alone[0], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(
    not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="the fused snake kernel compiles on a GPU; without one, it runs under Triton's interpreter (next test)",
)
def test_fused_snake_matches_the_plain_expression():
    from trtdeploy_spark_tts.bicodec import layers

    pytest.importorskip("triton")
    generator = torch.Generator().manual_seed(5)
    snake = layers.Snake1d(24)
    snake.alpha.data = torch.rand(1, 24, 1, generator=generator) + 0.2
    x = 3 * torch.randn(2, 24, 1000, generator=generator)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.inference_mode():
        expected = x + (snake.alpha + 1e-9).reciprocal() * torch.sin(snake.alpha * x).pow(2)
        fused = snake.to(device)(x.to(device)).cpu()
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", reason="runs where the kernel compiles"
)
def test_the_fused_snake_under_tritons_interpreter(trtdeploy_triton_interpreter):
    pytest.importorskip("triton")
    trtdeploy_triton_interpreter(__file__, "-k", "test_fused_snake_matches_the_plain_expression")
