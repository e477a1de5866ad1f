"""A stand-in for a text LLM behind the ensemble's text contract, for testing the perf client.

It "generates" max_tokens words by cycling through the prompt's words, one token per word, with
token_delay_ms between tokens. Decoupled: one response per token from a thread per request, then the final
flag alone. Offline: the whole text at once. A prompt containing FAIL gets an error response; one containing
EMPTY generates nothing (as a model whose first token is end-of-sequence).

With the parameter tokenizer_dir (a folder with tokenizer.json) it generates real token ids instead: the
prompt's ids, cycled, and like TRT-LLM's postprocessing it decodes each streamed response's ids on their own, so
a character whose bytes span two tokens comes out as U+FFFD pieces.
"""

import json
import os
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
        self.tokenizer = None
        if params.get("tokenizer_dir"):
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(os.path.join(params["tokenizer_dir"], "tokenizer.json"))

    def _read(self, request):
        """The prompt and the generated (text piece, token id) pairs."""
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
        count = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
        if "EMPTY" in text:
            count = 0
        if self.tokenizer is not None:
            ids = self.tokenizer.encode(text).ids or [0]
            generated = [ids[i % len(ids)] for i in range(count)]
            return text, [(self.tokenizer.decode([token]), token) for token in generated]
        words = text.split() or ["empty"]
        return text, [((" " if i else "") + words[i % len(words)], i) for i in range(count)]

    def _response(self, pieces):
        text = self.tokenizer.decode([t for _, t in pieces]) if self.tokenizer else "".join(p for p, _ in pieces)
        tensors = [pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_))]
        if self.with_ids:
            tensors.append(pb_utils.Tensor("output_ids", np.array([[t for _, t in pieces]], dtype=np.int32)))
        return pb_utils.InferenceResponse(tensors)

    def execute(self, requests):
        responses = []
        for request in requests:
            text, pieces = self._read(request)
            if self.decoupled:
                sender = request.get_response_sender()
                threading.Thread(target=self._stream, args=(text, pieces, sender), daemon=True).start()
                continue
            if "FAIL" in text:
                responses.append(pb_utils.InferenceResponse([], error=pb_utils.TritonError("fake failure")))
                continue
            time.sleep(self.delay * len(pieces))
            responses.append(self._response(pieces))
        return None if self.decoupled else responses

    def _stream(self, text, pieces, sender):
        if "FAIL" in text:
            error = pb_utils.TritonError("fake failure")
            sender.send(
                pb_utils.InferenceResponse([], error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
            return
        for piece in pieces:
            time.sleep(self.delay)
            sender.send(self._response([piece]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
