"""``speaker_embedding``: 16 kHz reference audio → the 192-d CAM++ embedding of its speaker (float16, as the
official model answers)."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import ModelParameters, reference_wav

from ..speaker import SAMPLE_RATE as REFERENCE_RATE
from ..speaker import SpeakerEncoder


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.max_samples = int(params.float("max_reference_seconds") * REFERENCE_RATE)
        self.encoder = SpeakerEncoder(params.str("campplus"))

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:  # CAM++ pools over time: one reference at a time, no padding
            try:
                wav = reference_wav(request, self.max_samples, REFERENCE_RATE)
                embedding = self.encoder.embed([wav])[0]
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            tensor = pb_utils.Tensor("prompt_spk_embedding", embedding.astype(np.float16).reshape(1, -1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
