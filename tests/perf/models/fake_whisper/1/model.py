"""A stand-in for Whisper behind the whisper_bls contract, for testing the ASR client.

Its transcript describes the request, so a test can tell which answer belongs to which wav:
``"<language> <WAV_LENS> <samples received> <first sample>"``, e.g. ``"en 1600 1600 0.25"``. It waits
``abs(first sample) * 0.2`` s first, so requests can finish out of order. A prompt whose language token is
``<|xx|>`` gets an error response.
"""

import re
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            prefixes = _input(request, "TEXT_PREFIX").reshape(-1)
            wavs = _input(request, "WAV")
            lens = _input(request, "WAV_LENS").reshape(-1)
            texts = []
            failed = False
            for prefix, wav, declared in zip(prefixes, wavs, lens, strict=True):
                match = re.search(r"<\|(\w+)\|><\|transcribe\|>", prefix.decode())
                language = match.group(1) if match else "?"
                if language == "xx":
                    failed = True
                    break
                first = float(wav[0]) if wav.size else 0.0
                time.sleep(min(abs(first), 1.0) * 0.2)
                texts.append(f"{language} {int(declared)} {wav.shape[-1]} {first:g}".encode())
            if failed:
                error = pb_utils.TritonError("fake failure: no language xx")
                responses.append(pb_utils.InferenceResponse([], error=error))
                continue
            out = np.array(texts, dtype=np.object_).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TRANSCRIPTS", out)]))
        return responses
