"""A stand-in for the LLM contract (``tensorrt_llm``), for testing the perf client.

It "generates" request_output_len token ids by cycling through the prompt's ids, with token_delay_ms between
tokens. Decoupled: one response per token from a thread per request, then the final flag alone. Offline: as
TRT-LLM, the prompt followed by the generated ids, with sequence_length; only the generated ids when the request
sets exclude_input_in_output (an input the model may declare or not).
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
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    @staticmethod
    def _tokens(ids):
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("output_ids", np.array(ids, dtype=np.int32).reshape(1, 1, -1)),
                pb_utils.Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32)),
            ]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1).tolist()
            count = int(pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().reshape(-1)[0])
            exclude = pb_utils.get_input_tensor_by_name(request, "exclude_input_in_output")
            exclude = exclude is not None and bool(exclude.as_numpy().reshape(-1)[0])
            generated = [prompt[i % len(prompt)] for i in range(count)]
            if self.decoupled:
                sender = request.get_response_sender()
                threading.Thread(target=self._stream, args=(generated, sender), daemon=True).start()
            else:
                time.sleep(self.delay * count)
                responses.append(self._tokens(generated if exclude else prompt + generated))
        return None if self.decoupled else responses

    def _stream(self, generated, sender):
        for token in generated:
            time.sleep(self.delay)
            sender.send(self._tokens([token]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
