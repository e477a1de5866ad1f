"""Triton python model: token ids from the LLM contract → text.

As tensorrtllm_backend's ``postprocessing``: every sequence of ``TOKENS_BATCH [rows, sequences, n]`` (cut to its
``SEQUENCE_LENGTH``) is decoded, and ``OUTPUT`` holds the texts one after the other, ``[rows x sequences]``, so that
a response of one sequence is ``[1]`` (what the official clients read as ``text_output[0]``). The ids and lengths
pass through as ``OUTPUT_IDS``/``OUTPUT_LENGTHS`` (the ensemble's ``output_ids``/``sequence_length``).
"""

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
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            flat = lengths.reshape(-1)
            sequences = [row[:length] for row, length in zip(tokens.reshape(len(flat), -1), flat, strict=True)]
            texts = self.tokenizer.batch_decode(sequences, skip_special_tokens=self.skip_special_tokens)
            output = np.array([text.encode("utf-8") for text in texts], dtype=object)
            tensors = [
                pb_utils.Tensor("OUTPUT", output),
                pb_utils.Tensor("OUTPUT_IDS", tokens),
                pb_utils.Tensor("OUTPUT_LENGTHS", lengths),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
