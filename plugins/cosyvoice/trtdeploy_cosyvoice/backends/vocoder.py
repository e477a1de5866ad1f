"""``vocoder``: CosyVoice3's causal HiFT, mel → 24 kHz audio, the requests of a batch that share ``finalize``
together. Stateless, as the official model: a stream sends its whole mel so far each time and keeps the samples it
has not sent yet (with ``finalize`` false the last 8 frames are read ahead only)."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import ModelParameters, optional_scalar

from ..token2wav.model import Token2Wav


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        checkpoint, generation = params.str("checkpoint_dir"), params.str("generation")
        self.model = Token2Wav.load(checkpoint, generation, device=params.str("device", "cpu"), parts=["vocoder"])

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        groups: dict[bool, list[tuple[int, np.ndarray]]] = {}
        for index, request in enumerate(requests):
            mel = pb_utils.get_input_tensor_by_name(request, "mel").as_numpy().astype(np.float32)
            finalize = bool(optional_scalar(request, "finalize", True))
            groups.setdefault(finalize, []).append((index, mel.reshape(mel.shape[-2:])))
        for finalize, group in groups.items():
            for (index, _), answer in zip(group, self._run([mel for _, mel in group], finalize), strict=True):
                responses[index] = answer
        return responses

    def _run(self, mels: list[np.ndarray], finalize: bool) -> list:
        """The answers for mels sharing ``finalize``, as one batch; when one is refused, each alone (only the bad
        one gets the error)."""
        try:
            audio = self.model.causal_speech(mels, finalize=finalize)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("tts_speech", wave.reshape(1, -1))]) for wave in audio]
        except ValueError as exc:
            if len(mels) == 1:
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))]
        return [answer for mel in mels for answer in self._run([mel], finalize)]
