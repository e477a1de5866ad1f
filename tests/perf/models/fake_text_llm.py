"""A stand-in for a text LLM behind the ensemble's text contract, for testing the perf client.

It "generates" max_tokens words by cycling through the prompt's words, one token per word, with
token_delay_ms between tokens. Decoupled: one response per token from a thread per request, then the final
flag alone. Offline: the whole text at once. A prompt containing FAIL gets an error response.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.delay = float(params.get("token_delay_ms", "0")) / 1000.0
        self.with_ids = params.get("with_ids", "true") == "true"
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def _read(self, request):
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
        count = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
        words = text.split() or ["empty"]
        return text, [words[i % len(words)] for i in range(count)]

    def _response(self, pieces, ids):
        tensors = [pb_utils.Tensor("text_output", np.array([["".join(pieces).encode()]], dtype=np.object_))]
        if self.with_ids:
            tensors.append(pb_utils.Tensor("output_ids", np.array([ids], dtype=np.int32)))
        return pb_utils.InferenceResponse(tensors)

    def execute(self, requests):
        responses = []
        for request in requests:
            text, words = self._read(request)
            if self.decoupled:
                sender = request.get_response_sender()
                threading.Thread(target=self._stream, args=(text, words, sender), daemon=True).start()
                continue
            if "FAIL" in text:
                responses.append(pb_utils.InferenceResponse([], error=pb_utils.TritonError("fake failure")))
                continue
            time.sleep(self.delay * len(words))
            responses.append(self._response([" ".join(words)], list(range(len(words)))))
        return None if self.decoupled else responses

    def _stream(self, text, words, sender):
        if "FAIL" in text:
            error = pb_utils.TritonError("fake failure")
            sender.send(
                pb_utils.InferenceResponse([], error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
            return
        for index, word in enumerate(words):
            time.sleep(self.delay)
            sender.send(self._response([word if index == 0 else " " + word], [index]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
