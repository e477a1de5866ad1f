"""``vocoder``: 32 global tokens + semantic tokens → 16 kHz waveform (320 samples per semantic token), batched.

Requests with the same number of semantic tokens run together; other lengths run as their own batch, so padding
never changes a request's audio.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import ModelParameters

from ..prompt import GLOBAL_CODES, GLOBAL_TOKENS, SEMANTIC_CODES


def _codes(request, name: str, limit: int) -> np.ndarray:
    codes = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
    if codes.size and (codes.min() < 0 or codes.max() >= limit):
        raise ValueError(f"{name} must be in [0, {limit}), got values from {codes.min()} to {codes.max()}")
    return codes.astype(np.int64)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from trtdeploy_spark_tts.bicodec import BiCodec

        params = ModelParameters(args)
        self.device = params.str("device", "cpu")
        self.codec = BiCodec.load(params.str("bicodec_dir"), device=self.device, parts=("vocoder",))

    def execute(self, requests: list) -> list:
        import torch

        responses: list = [None] * len(requests)
        groups: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = defaultdict(list)
        for index, request in enumerate(requests):
            try:
                global_codes = _codes(request, "global_tokens", GLOBAL_CODES)
                semantic_codes = _codes(request, "semantic_tokens", SEMANTIC_CODES)
                if global_codes.size != GLOBAL_TOKENS:
                    raise ValueError(f"global_tokens must hold {GLOBAL_TOKENS} tokens, got {global_codes.size}")
                if semantic_codes.size == 0:
                    raise ValueError("semantic_tokens is empty: there is nothing to vocode")
            except ValueError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
                continue
            groups[semantic_codes.size].append((index, global_codes, semantic_codes))
        for group in groups.values():
            semantic = torch.from_numpy(np.stack([item[2] for item in group])).to(self.device)
            global_ = torch.from_numpy(np.stack([item[1] for item in group])).to(self.device)
            waves = self.codec.detokenize(semantic, global_).float().cpu().numpy()
            for (index, _, _), wave in zip(group, waves, strict=True):
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("waveform", wave.reshape(1, -1))]
                )
        return responses
