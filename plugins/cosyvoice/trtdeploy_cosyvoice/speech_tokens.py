"""Speech tokens of the 16 kHz reference: the checkpoint's speech tokenizer run in torch by the s3tokenizer package.

The tokenizer (``speech_tokenizer_v2.onnx`` in CosyVoice2, ``speech_tokenizer_v3.onnx`` in CosyVoice3) is a
Whisper-style encoder over 128-bin log-mel frames (100 per second) that halves time twice and quantises each output
frame to one of 3^8 = 6,561 codes: 25 tokens per second, ``ceil(frames / 4)`` for ``frames = samples // 160``.
s3tokenizer reads the weights out of the ONNX file into its own torch module (no onnxruntime), so it runs batched on
the CPU or a GPU. Its log-mel floors an utterance at the utterance's own maximum minus 8 (log10), so features are
computed one utterance at a time and padded afterwards. s3tokenizer cuts an input over 30 s into 30 s windows that
overlap by 4 s and joins their tokens again (the official offline front end refuses such a reference instead).
"""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

import numpy as np
import torch

from trtdeploy import UsageError

from .generations import SPEECH_TOKENIZER_FILES, GenerationName

MEL_BINS = 128
#: The log-mel's STFT reflects 200 samples (half its 400-sample window) at each end, so it needs more than that.
MIN_SAMPLES = 201


class _Unimportable(types.ModuleType):
    """Stands in for a module that failed to import: using any of its functions raises that failure."""

    def __init__(self, name: str, error: BaseException):
        super().__init__(name)
        self._error = error

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):  # introspection (hasattr(module, "__file__")) sees an ordinary module
            raise AttributeError(attribute)
        raise ImportError(
            f"{self.__name__}.{attribute} is unavailable: {self.__name__} failed to import ({self._error})"
        )


@functools.cache
def import_s3tokenizer() -> types.ModuleType:
    """The s3tokenizer package, imported even where torchaudio cannot be.

    s3tokenizer imports torchaudio when it is imported, but only its ``load_audio`` (not used here) calls it. The
    torchaudio wheels on the package index are CUDA builds, which fail to load next to a CPU-only torch; there a
    placeholder stands in for torchaudio while s3tokenizer is imported. Only s3tokenizer keeps it (a use of it raises
    an ImportError naming torchaudio): it leaves ``sys.modules`` right after, so anyone else importing torchaudio meets
    the real failure.
    """
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError) as error:  # not installed, or its native library does not load
        sys.modules["torchaudio"] = _Unimportable("torchaudio", error)
        try:
            import s3tokenizer
        finally:
            del sys.modules["torchaudio"]
    else:
        import s3tokenizer
    return s3tokenizer


def new_s3tokenizer_model(generation: GenerationName) -> torch.nn.Module:
    """s3tokenizer's module for the generation's tokenizer, randomly initialised on torch's default device.

    The class comes from the generation, never from a path: s3tokenizer's ``load_model`` picks it by 'v2' or 'v3'
    anywhere in the path it is given. The names passed are s3tokenizer's own for these models (nothing downloads).
    """
    s3tokenizer = import_s3tokenizer()
    if generation == "cosyvoice2":
        return s3tokenizer.S3TokenizerV2("speech_tokenizer_v2_25hz")
    return s3tokenizer.S3TokenizerV3("speech_tokenizer_v3_25hz")


def load_s3tokenizer_model(onnx_path: Path, generation: GenerationName) -> torch.nn.Module:
    """s3tokenizer's module with every weight from the ONNX file, on the CPU; a file that does not hold exactly the
    generation's weights is refused, the missing and foreign ones named."""
    s3tokenizer = import_s3tokenizer()
    hint = f"pass the {SPEECH_TOKENIZER_FILES[generation]} of the official {generation} checkpoint"
    if not Path(onnx_path).is_file():
        raise UsageError(f"{onnx_path} does not exist", hint=hint)
    convert = s3tokenizer.onnx2torch if generation == "cosyvoice2" else s3tokenizer.onnx2torch_v3
    try:
        # the converters find each weight by the official export's node or initializer name and leave out what they
        # do not find (s3tokenizer's own CosyVoice3 loader then keeps a random weight: it loads with strict=False)
        weights = convert(str(onnx_path))
    except Exception as error:  # not ONNX, or an ONNX model of another layout: protobuf and assertion errors alike
        reason = (str(error).strip() or type(error).__name__).splitlines()[0][:200]
        raise UsageError(f"cannot read {onnx_path} as {generation}'s speech tokenizer ({reason})", hint=hint) from None
    model = new_s3tokenizer_model(generation)
    expected = model.state_dict()
    problems = {
        "missing": [key for key in expected if key not in weights],
        "unexpected": [key for key in weights if key not in expected],
        "of another shape": [key for key in weights if key in expected and weights[key].shape != expected[key].shape],
    }
    if any(problems.values()):
        found = "; ".join(f"{_some(keys)} {problem}" for problem, keys in problems.items() if keys)
        raise UsageError(f"{onnx_path} is not {generation}'s speech tokenizer: {found}", hint=hint)
    model.load_state_dict(weights, strict=True)
    return model


class SpeechTokenizer:
    """A generation's speech tokenizer from its ONNX file, on a torch device, in float32 (as s3tokenizer runs it)."""

    def __init__(self, onnx_path: Path, generation: GenerationName, *, device: str | torch.device = "cpu"):
        self.generation = generation
        self.device = torch.device(device)
        self._s3tokenizer = import_s3tokenizer()
        self._model = load_s3tokenizer_model(onnx_path, generation).to(self.device).eval()

    @classmethod
    def load(
        cls, checkpoint_dir: Path, generation: GenerationName, *, device: str | torch.device = "cpu"
    ) -> SpeechTokenizer:
        """The tokenizer file of an official checkpoint folder."""
        return cls(Path(checkpoint_dir) / SPEECH_TOKENIZER_FILES[generation], generation, device=device)

    def tokens(self, waves: list[np.ndarray]) -> list[np.ndarray]:
        """Int32 speech tokens in [0, 6561) of each 16 kHz mono waveform in [-1, 1], run as one padded batch."""
        if not waves:
            return []
        mels = [self._log_mel(wave) for wave in waves]
        mel, mel_lengths = self._s3tokenizer.padding(mels)
        codes, code_lengths = self._model.quantize(mel, mel_lengths.to(self.device))
        codes = codes.to(torch.int32).cpu().numpy()  # int64 when an input is over 30 s (s3tokenizer's windowed path)
        return [codes[row, :length].copy() for row, length in enumerate(code_lengths.tolist())]

    def _log_mel(self, wave: np.ndarray) -> torch.Tensor:
        """128 log-mel bins by ``samples // 160`` frames, floored at this utterance's own maximum."""
        if wave.ndim != 1 or len(wave) < MIN_SAMPLES:
            raise ValueError(f"speech tokens need at least {MIN_SAMPLES} samples of 16 kHz mono audio")
        samples = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32)).to(self.device)
        return self._s3tokenizer.log_mel_spectrogram(samples, n_mels=MEL_BINS)


def _some(keys: list[str]) -> str:
    """``'N weights (first, second, ...)'``."""
    shown = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
    return f"{len(keys)} weight{'s' if len(keys) != 1 else ''} ({shown})"
