"""Triton python model: token ids from the LLM contract → text."""

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from trtdeploy.backend_utils import ModelParameters


class TritonPythonModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(params.str("tokenizer_dir"), local_files_only=True)
        self.skip_special_tokens = params.bool("skip_special_tokens", True)

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()  # [1, beams, len]
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()  # [1, beams]
            texts = [
                self.tokenizer.decode(tokens[0, beam, : lengths[0, beam]], skip_special_tokens=self.skip_special_tokens)
                for beam in range(tokens.shape[1])
            ]
            output = np.array([[text.encode("utf-8") for text in texts]], dtype=object)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", output)]))
        return responses
