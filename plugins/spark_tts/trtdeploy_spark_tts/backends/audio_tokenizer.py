"""``audio_tokenizer``: 16 kHz reference audio → 32 global tokens + its semantic tokens, batched.

Requests of different lengths run as one batch with attention masks and masked convolutions, so each request
gets exactly the tokens it would get alone (the official model pads with zeros and no mask, which gives a shorter
request extra tokens from the padding).
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import ModelParameters, reference_wav

from ..prompt import SAMPLE_RATE


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import torch

        from trtdeploy_spark_tts.bicodec import AudioTokenizer

        params = ModelParameters(args)
        # TF32 convolutions make a batch's features differ from a single request's enough to flip semantic
        # tokens; this process runs only this model, so the global switch is safe here
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        self.max_samples = int(params.float("max_reference_seconds") * SAMPLE_RATE)
        self.tokenizer = AudioTokenizer.load(params.str("model_dir"), device=params.str("device", "cpu"))

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        wavs, slots = [], []
        for index, request in enumerate(requests):
            try:
                wavs.append(reference_wav(request, self.max_samples, SAMPLE_RATE))
                slots.append(index)
            except ValueError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if wavs:
            for index, (global_codes, semantic_codes) in zip(slots, self.tokenizer.tokenize(wavs), strict=True):
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("global_tokens", global_codes.astype(np.int32).reshape(1, -1)),
                        pb_utils.Tensor("semantic_tokens", semantic_codes.astype(np.int32).reshape(1, -1)),
                    ]
                )
        return responses
