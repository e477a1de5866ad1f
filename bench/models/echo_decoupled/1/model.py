"""Decoupled echo: streams CHUNKS copies of INPUT0 as OUTPUT0, the last one sent with the final flag."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            chunks = max(1, int(pb_utils.get_input_tensor_by_name(request, "CHUNKS").as_numpy()[0]))
            sender = request.get_response_sender()
            for _ in range(chunks - 1):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
