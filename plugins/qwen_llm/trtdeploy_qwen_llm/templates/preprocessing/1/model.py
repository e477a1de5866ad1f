"""Triton python model: text → token ids (and end/pad ids) for the LLM contract."""

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from trtdeploy.backend_utils import ModelParameters, decode_text, optional_scalar


class TritonPythonModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(params.str("tokenizer_dir"), local_files_only=True)
        self.max_input_len = params.int("max_input_len")
        self.max_output_len = params.int("max_output_len")
        self.chat_template = params.bool("chat_template", False)
        self.add_special_tokens = params.bool("add_special_tokens", True)
        self.end_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._tokenize(request)))
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses

    def _tokenize(self, request):
        text = decode_text(request, "QUERY")
        if not text:
            raise ValueError("text_input is empty")
        if self.chat_template:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
            )
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"]
        if len(ids) > self.max_input_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than max_input_len={self.max_input_len}")
        output_len = optional_scalar(request, "REQUEST_OUTPUT_LEN")
        if output_len is None or output_len < 1:
            raise ValueError(f"max_tokens must be >= 1, got {output_len}")
        if output_len > self.max_output_len:
            raise ValueError(
                f"max_tokens={output_len} is more than this deployment's max_output_len={self.max_output_len}"
            )
        end_id = optional_scalar(request, "END_ID", self.end_id)
        pad_id = optional_scalar(request, "PAD_ID", self.pad_id)

        def scalar(name, value):
            return pb_utils.Tensor(name, np.array([[value]], dtype=np.int32))

        return [
            pb_utils.Tensor("INPUT_ID", np.array([ids], dtype=np.int32)),
            scalar("REQUEST_INPUT_LEN", len(ids)),
            scalar("REQUEST_OUTPUT_LEN_OUT", output_len),
            scalar("OUT_END_ID", end_id),
            scalar("OUT_PAD_ID", pad_id),
        ]
