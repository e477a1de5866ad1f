"""Parity of ``trtdeploy_spark_tts.bicodec`` with the official Spark-TTS code, on random weights (nothing downloaded).

Writes a random checkpoint in the official layout with our writer, loads it with both implementations, and prints:

- the mel spectrogram's max abs difference from torchaudio's ``MelSpectrogram`` (ours is meant to be bit-exact);
- the detokenized waveform's max abs difference on random tokens;
- whether the global and semantic tokens agree on a few waveforms of different lengths: the official
  ``BiCodecTokenizer.tokenize`` one file at a time, ours one batch of all of them.

It exits non-zero when a token differs or the waveform differs by more than ``--tolerance``. It needs the official
code importable: ``spark-tts-lib`` (a copy of SparkAudio's ``sparktts`` package; install it with ``--no-deps``, since
it pins numpy 2) and what it imports (einx, einops, omegaconf, torchaudio, soundfile, soxr, retrying)::

    PYTHONPATH=.:plugins/spark_tts python bench/spark_tts_bicodec_parity.py [--size tiny|full] [--skip-tokenize]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile
import torch
from trtdeploy_spark_tts.bicodec import AudioTokenizer, BiCodec, write_random_checkpoint_parts


def mel_difference(codec: BiCodec) -> float:
    import torchaudio.transforms

    params = codec.config.mel_params
    reference = torchaudio.transforms.MelSpectrogram(
        params.sample_rate,
        params.n_fft,
        params.win_length,
        params.hop_length,
        params.mel_fmin,
        params.mel_fmax,
        n_mels=params.num_mels,
        power=1,
        norm="slaney",
        mel_scale="slaney",
    )
    wavs = 0.3 * torch.randn(3, 6 * params.sample_rate, generator=torch.Generator().manual_seed(1))
    return (reference(wavs) - codec.mel_spectrogram(wavs)).abs().max().item()


def detokenize_difference(official, codec: BiCodec, tokens: int) -> tuple[float, float]:
    generator = torch.Generator().manual_seed(2)
    semantic = torch.randint(0, codec.config.quantizer.codebook_size, (2, tokens), generator=generator)
    levels = codec.config.speaker_encoder.fsq_levels
    global_ = torch.randint(0, int(np.prod(levels)), (2, codec.config.speaker_encoder.token_num), generator=generator)
    with torch.no_grad():
        expected = official.detokenize(semantic, global_.unsqueeze(1)).squeeze(1)
    started = time.perf_counter()
    ours = codec.detokenize(semantic, global_)
    print(f"  ours: {time.perf_counter() - started:.2f} s for 2 x {tokens} tokens on CPU")
    return (expected - ours).abs().max().item(), expected.std().item()


def tokenize_agreement(checkpoint: Path, wavs: list[np.ndarray]) -> bool:
    from spark_tts_lib.models.audio_tokenizer import BiCodecTokenizer

    official = BiCodecTokenizer(model_dir=checkpoint, device=torch.device("cpu"))
    ours = AudioTokenizer.load(checkpoint).tokenize(wavs)
    agree = True
    with tempfile.TemporaryDirectory() as folder:
        for index, (wav, (our_global, our_semantic)) in enumerate(zip(wavs, ours, strict=True)):
            path = Path(folder) / f"{index}.wav"
            soundfile.write(path, wav, 16000, subtype="FLOAT")
            global_, semantic = official.tokenize(str(path))
            global_ = global_.flatten().numpy()
            semantic = semantic.flatten().numpy()
            same_global = np.array_equal(global_, our_global)
            same_semantic = np.array_equal(semantic, our_semantic)
            print(
                f"  wav of {len(wav)} samples: global tokens {'equal' if same_global else 'DIFFER'}, "
                f"{len(semantic)} semantic tokens ({len(np.unique(semantic))} distinct) "
                f"{'equal' if same_semantic else 'DIFFER'}"
                + ("" if same_semantic else f" ({np.sum(semantic != our_semantic)} differ)")
            )
            agree = agree and same_global and same_semantic
    return agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--tokens", type=int, default=150, help="semantic tokens per row for detokenize")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest waveform difference that passes")
    parser.add_argument("--skip-tokenize", action="store_true", help="only the mel and detokenize checks")
    args = parser.parse_args()

    from spark_tts_lib.models.bicodec import BiCodec as OfficialBiCodec

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder)
        started = time.perf_counter()
        write_random_checkpoint_parts(checkpoint, size=args.size)
        print(f"{args.size} random checkpoint written in {time.perf_counter() - started:.1f} s")
        official = OfficialBiCodec.load_from_checkpoint(checkpoint / "BiCodec")
        codec = BiCodec.load(checkpoint / "BiCodec")

        mel = mel_difference(codec)
        print(f"mel spectrogram vs torchaudio: max abs difference {mel:.3g}")
        difference, scale = detokenize_difference(official, codec, args.tokens)
        print(f"detokenize: max abs difference {difference:.3g} (waveform std {scale:.3g})")
        passed = difference <= args.tolerance
        if not args.skip_tokenize:
            rng = np.random.default_rng(3)
            # Lengths below, at and above the 6 s reference clip; quiet and loud, to exercise volume normalization.
            wavs = [
                (gain * rng.standard_normal(length)).astype(np.float32)
                for gain, length in ((0.02, 16000), (0.3, 53_333), (0.1, 96_000), (0.5, 131_000))
            ]
            print("tokenize (official one at a time, ours batched):")
            passed = tokenize_agreement(checkpoint, wavs) and passed
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
