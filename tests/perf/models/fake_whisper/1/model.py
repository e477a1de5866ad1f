"""A stand-in for Whisper behind the whisper_bls contract, for testing the ASR client and workload.

Its transcript describes the request, so a test can tell which answer belongs to which wav:
``"<language> <WAV_LENS> <samples received> <first sample>"``, e.g. ``"en 1600 1600 0.25"``. It waits
``abs(first sample) * 0.2`` s first, so requests can finish out of order. A prompt whose language token is
``<|xx|>`` gets an error response. ``MAX_NEW_TOKENS`` n keeps the first n words of the transcript; with
``IGNORE_EOS`` true it pads them with "la" to exactly n words.

Decoupled (a config with ``model_transaction_policy { decoupled: true }``), it streams as whisper_bls does: first an
empty transcript, then the transcript so far after each word, 10 ms apart, then the final flag alone.
"""

import re
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _transcript(prefix, wav, declared, max_new_tokens, ignore_eos):
    """The words of the answer, or None for the language that fails."""
    match = re.search(r"<\|(\w+)\|><\|transcribe\|>", prefix.decode())
    language = match.group(1) if match else "?"
    if language == "xx":
        return None
    first = float(wav[0]) if wav.size else 0.0
    time.sleep(min(abs(first), 1.0) * 0.2)
    words = [language, str(int(declared)), str(wav.shape[-1]), f"{first:g}"]
    if max_new_tokens is not None:
        words = words[:max_new_tokens]
        if ignore_eos:
            words += ["la"] * (max_new_tokens - len(words))
    return words


def _response(text):
    out = np.array([[text.encode()]], dtype=np.object_)
    return pb_utils.InferenceResponse([pb_utils.Tensor("TRANSCRIPTS", out)])


class TritonPythonModel:
    def initialize(self, args):
        import json

        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            prefixes = _input(request, "TEXT_PREFIX").reshape(-1)
            wavs = _input(request, "WAV")
            lens = _input(request, "WAV_LENS").reshape(-1)
            max_new = _input(request, "MAX_NEW_TOKENS")
            ignore = _input(request, "IGNORE_EOS")
            texts = []
            for index, (prefix, wav, declared) in enumerate(zip(prefixes, wavs, lens, strict=True)):
                words = _transcript(
                    prefix,
                    wav,
                    declared,
                    None if max_new is None else int(max_new.reshape(-1)[index]),
                    ignore is not None and bool(ignore.reshape(-1)[index]),
                )
                if words is None:
                    texts = None
                    break
                texts.append(words)
            if texts is None:
                error = pb_utils.InferenceResponse([], error=pb_utils.TritonError("fake failure: no language xx"))
                if self.decoupled:
                    sender = request.get_response_sender()
                    sender.send(error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    responses.append(error)
                continue
            if self.decoupled:
                (words,) = texts  # whisper_bls takes one utterance per request
                sender = request.get_response_sender()
                sender.send(_response(""))
                for count in range(1, len(words) + 1):
                    time.sleep(0.01)
                    sender.send(_response(" ".join(words[:count])))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            out = np.array([" ".join(words).encode() for words in texts], dtype=np.object_).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TRANSCRIPTS", out)]))
        return None if self.decoupled else responses
