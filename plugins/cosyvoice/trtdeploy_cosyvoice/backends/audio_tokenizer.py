"""``audio_tokenizer``: 16 kHz reference audio → speech tokens (25 a second), the requests of a batch together.

Each request's log-mel is its own (s3tokenizer's requirement); the padded batch gives each request the tokens it
gets alone. The ids are the speech tokens themselves, 0 to 6,560, for both generations.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import ModelParameters, reference_wav

from ..speaker import SAMPLE_RATE as REFERENCE_RATE
from ..speech_tokens import MIN_SAMPLES, SpeechTokenizer


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.max_samples = int(params.float("max_reference_seconds") * REFERENCE_RATE)
        self.tokenizer = SpeechTokenizer.load(
            params.str("checkpoint_dir"), params.str("generation"), device=params.str("device", "cpu")
        )

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        waves, rows = [], []
        for index, request in enumerate(requests):
            try:
                wave = reference_wav(request, self.max_samples, REFERENCE_RATE)
                if wave.size < MIN_SAMPLES:
                    raise ValueError(
                        f"the reference audio is {wave.size} samples, too short for a speech token: send at least "
                        f"{MIN_SAMPLES} (a few seconds of speech make a good reference)"
                    )
                waves.append(wave)
                rows.append(index)
            except ValueError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        for index, ids in zip(rows, self.tokenizer.tokens(waves) if waves else [], strict=True):
            tensor = pb_utils.Tensor("prompt_speech_tokens", ids.astype(np.int32).reshape(1, -1))
            responses[index] = pb_utils.InferenceResponse(output_tensors=[tensor])
        return responses
