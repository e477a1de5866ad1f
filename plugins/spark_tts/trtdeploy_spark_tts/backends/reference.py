"""Reading the reference audio of a request: what ``spark_tts`` and ``audio_tokenizer`` both check."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy.backend_utils import optional_scalar

from ..prompt import SAMPLE_RATE


def reference_wav(request, max_samples: int) -> np.ndarray:
    """The request's ``reference_wav`` cut to ``reference_wav_len``, as float32; ValueError naming what is wrong."""
    tensor = pb_utils.get_input_tensor_by_name(request, "reference_wav")
    if tensor is None:
        raise ValueError("input 'reference_wav' is missing")
    wav = tensor.as_numpy().reshape(-1)
    length = int(optional_scalar(request, "reference_wav_len", wav.size))
    if wav.size == 0 or length == 0:
        raise ValueError(
            "the reference audio is empty (0 samples): send the voice to clone, a few seconds of speech at 16 kHz"
        )
    if not 0 < length <= wav.size:
        raise ValueError(f"reference_wav_len {length} does not fit reference_wav of {wav.size} samples")
    if length > max_samples:
        raise ValueError(
            f"reference audio is {length / SAMPLE_RATE:.1f} s, longer than the {max_samples / SAMPLE_RATE:g} s "
            "this deployment takes: use a shorter reference"
        )
    wav = np.array(wav[:length], dtype=np.float32)
    if not np.isfinite(wav).all():
        raise ValueError("reference_wav holds NaN or infinite samples")
    return wav
