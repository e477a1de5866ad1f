"""``token2wav``: speech tokens and a prompt (its tokens, mel and speaker embedding) → CosyVoice2's 24 kHz audio, or
CosyVoice3's mel (``vocoder`` makes its audio).

The requests of a batch that share the flow's mode run through the flow as one batch. With ``token_offset`` the
request is a streaming call: the tokens so far, the last 3 read ahead only (unless ``finalize``), and the answer
starts at ``token_offset``. CosyVoice2's vocoder carries a state from one chunk to the next (the last mel frames,
the excitation and the audio held back for the cross-fade): this model answers it as ``cache_*`` outputs and takes
it back as inputs, so it keeps nothing per request between calls (any instance may serve the next chunk, and a
stream that stops leaves nothing behind).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import ModelParameters, optional_scalar

from ..token2wav.hift import StreamCache
from ..token2wav.model import FlowJob, Token2Wav

CACHE_NAMES = ("cache_mel", "cache_source", "cache_speech")
FLOW_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass
class _Call:
    index: int
    job: FlowJob
    streaming: bool
    finalize: bool
    cache: StreamCache | None
    seed: int | None


def _array(request, name: str, dtype) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().astype(dtype)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import torch

        params = ModelParameters(args)
        dtype = getattr(torch, FLOW_DTYPES[params.str("flow_precision")])
        device = params.str("device", "cpu")
        self.model = Token2Wav.load(
            params.str("checkpoint_dir"),
            params.str("generation"),
            device=device,
            dtype=dtype if device != "cpu" else torch.float32,
            # CosyVoice3's audio is the vocoder model's
            parts=["flow", "vocoder"] if params.str("generation") == "cosyvoice2" else ["flow"],
            # before the first request: a graph captured on first use costs that request an eager run
            capture_modes=((False, True) if params.bool("streaming") else (False,))
            if params.bool("flow_graphs_at_start")
            else (),
        )
        self.makes_audio = self.model.generation == "cosyvoice2"

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        calls = []
        for index, request in enumerate(requests):
            try:
                calls.append(self._read(index, request))
            except ValueError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        modes: dict[tuple[bool, bool], list[_Call]] = {}
        for call in calls:
            modes.setdefault((call.streaming, call.finalize), []).append(call)
        for (streaming, finalize), group in modes.items():
            for call, answer in zip(group, self._run(group, streaming, finalize), strict=True):
                responses[call.index] = answer
        return responses

    def _run(self, group: list[_Call], streaming: bool, finalize: bool) -> list:
        """The answers of calls sharing the flow's mode, as one batch; when one of them is refused, each alone
        (only the bad one gets the error)."""
        try:
            mels = self.model.mels([call.job for call in group], streaming=streaming, finalize=finalize)
            return self._answer(group, mels, finalize)
        except ValueError as exc:
            if len(group) == 1:
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))]
        return [answer for call in group for answer in self._run([call], streaming, finalize)]

    def _read(self, index: int, request) -> _Call:
        tokens = _array(request, "target_speech_tokens", np.int64)
        prompt_tokens = _array(request, "prompt_speech_tokens", np.int64)
        prompt_mel = _array(request, "prompt_speech_feat", np.float32)
        embedding = _array(request, "prompt_spk_embedding", np.float32)
        if prompt_tokens is None or prompt_mel is None or embedding is None:
            raise ValueError(
                "token2wav needs the prompt: prompt_speech_tokens, prompt_speech_feat and prompt_spk_embedding"
            )
        offset = optional_scalar(request, "token_offset")
        finalize = bool(optional_scalar(request, "finalize", True))
        cache, seed = None, optional_scalar(request, "random_seed")
        if self.makes_audio:
            arrays = [_array(request, name, np.float32) for name in CACHE_NAMES]
            if any(array is not None for array in arrays):
                if any(array is None for array in arrays):
                    raise ValueError(f"send all of {', '.join(CACHE_NAMES)} or none")
                cache = StreamCache.from_arrays(*(array.reshape(array.shape[-2:] if i == 0 else -1)
                                                  for i, array in enumerate(arrays)))  # fmt: skip
        job = FlowJob(
            tokens=tokens.reshape(-1),
            prompt_tokens=prompt_tokens.reshape(-1),
            prompt_mel=prompt_mel.reshape(-1, prompt_mel.shape[-1]),
            embedding=embedding.reshape(-1),
            token_offset=0 if offset is None else int(offset),
        )
        # a streaming call (token_offset given) runs the flow chunk-causally, but its last call does not (upstream)
        return _Call(
            index, job, streaming=offset is not None and not finalize, finalize=finalize, cache=cache, seed=seed
        )

    def _answer(self, group: list[_Call], mels: list[np.ndarray], finalize: bool) -> list:
        if not self.makes_audio:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("mel", mel[None].astype(np.float32))]) for mel in mels]
        audio = self.model.speech(
            mels, [call.cache for call in group], finalize=finalize, seeds=[call.seed for call in group]
        )
        answers = []
        for speech, cache in audio:
            tensors = [pb_utils.Tensor("waveform", speech.astype(np.float32).reshape(1, -1))]
            if cache is not None:
                mel, source, held = cache.to_arrays()
                tensors += [
                    pb_utils.Tensor("cache_mel", mel[None].astype(np.float32)),
                    pb_utils.Tensor("cache_source", source.reshape(1, -1).astype(np.float32)),
                    pb_utils.Tensor("cache_speech", held.reshape(1, -1).astype(np.float32)),
                ]
            answers.append(pb_utils.InferenceResponse(tensors))
        return answers
