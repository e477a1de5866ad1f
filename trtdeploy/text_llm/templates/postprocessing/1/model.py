"""Triton python model: token ids from the LLM contract → text.

Offline (as tensorrtllm_backend's ``postprocessing``): every sequence of ``TOKENS_BATCH [rows, sequences, n]`` (cut
to its ``SEQUENCE_LENGTH``) is decoded, and ``OUTPUT`` holds the texts one after the other, ``[rows x sequences]``,
so that a response of one sequence is ``[1]`` (what the official clients read as ``text_output[0]``). The ids and
lengths pass through as ``OUTPUT_IDS``/``OUTPUT_LENGTHS`` (the ensemble's ``output_ids``/``sequence_length``).

Streaming (decoupled), it calls the LLM model itself with the request's LLM-contract inputs and sends each response
on with its ``OUTPUT`` text: each sequence's pieces are decoded in context, so that their texts joined are the whole
sequence's text whatever the tokenizer (:mod:`trtdeploy.text_llm.detokenize`). An ensemble cannot do this: a step
downstream of a decoupled model cannot also read what came from before it, so the pieces could not be told apart.
A response holding several sequences (beams, which TensorRT-LLM streams whole) has each decoded whole. Text is
decoded without clean-up of spaces (which would make a piece's text depend on the next one's).
"""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from trtdeploy.backend_utils import ModelParameters
from trtdeploy.text_llm.detokenize import TokenizerText

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _texts(texts):
    return pb_utils.Tensor("OUTPUT", np.array([text.encode("utf-8") for text in texts], dtype=object))


def _index(outputs, name):
    tensor = outputs.get(name)
    return 0 if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        params = ModelParameters(args)
        config = json.loads(args["model_config"])
        tokenizer = AutoTokenizer.from_pretrained(params.str("tokenizer_dir"), local_files_only=True)
        self.text = TokenizerText(tokenizer, skip_special_tokens=params.bool("skip_special_tokens", True))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        if self.decoupled:
            self.llm_model = params.str("llm_model")
            self.llm_outputs = [output["name"] for output in config["output"] if output["name"] != "OUTPUT"]

    def _decode_all(self, tokens, lengths):
        """The text of every sequence of ``tokens [rows, sequences, n]``, each cut to its length."""
        flat = lengths.reshape(-1)
        return [self.text.decode(row[:length]) for row, length in zip(tokens.reshape(len(flat), -1), flat, strict=True)]

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                # no request.trace(): the call runs after execute returns, when the request (and its trace) is released
                llm_request = pb_utils.InferenceRequest(
                    model_name=self.llm_model, inputs=request.inputs(), requested_output_names=self.llm_outputs
                )
                threading.Thread(
                    target=self._stream, args=(llm_request, request.get_response_sender()), daemon=True
                ).start()
            return None
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            tensors = [
                _texts(self._decode_all(tokens, lengths)),
                pb_utils.Tensor("OUTPUT_IDS", tokens),
                pb_utils.Tensor("OUTPUT_LENGTHS", lengths),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _stream(self, llm_request, sender):
        """Send on the LLM's responses to one request, each with the text its tokens add to their sequence's."""
        streams = {}  # (batch_index, sequence_index) -> (detokenizer, the index tensors of its responses)
        try:
            responses = llm_request.exec(decoupled=True)
            for response in responses:
                if sender.is_cancelled():
                    # newer python backends cancel the LLM's request; Triton 2.51's lets it run to its end
                    getattr(responses, "cancel", lambda: None)()
                    sender.send(flags=FINAL)
                    return
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=response.error()), flags=FINAL)
                    return
                outputs = {tensor.name(): tensor for tensor in response.output_tensors()}
                if "output_ids" not in outputs:  # the empty final response
                    continue
                tokens, lengths = outputs["output_ids"].as_numpy(), outputs["sequence_length"].as_numpy()
                if tokens.shape[1] > 1:
                    texts = self._decode_all(tokens, lengths)
                else:
                    key = (_index(outputs, "batch_index"), _index(outputs, "sequence_index"))
                    if key not in streams:
                        indices = [outputs[name] for name in ("batch_index", "sequence_index") if name in outputs]
                        streams[key] = (self.text.stream(), indices)
                    texts = [streams[key][0].add(tokens.reshape(-1)[: int(lengths.reshape(-1)[0])])]
                sender.send(pb_utils.InferenceResponse(output_tensors=[_texts(texts), *outputs.values()]))
            for detokenizer, indices in streams.values():
                held = detokenizer.flush()
                if held:  # a sequence ended inside a character: its text as the whole text has it, without tokens
                    empty = [
                        pb_utils.Tensor("output_ids", np.zeros((1, 1, 0), np.int32)),
                        pb_utils.Tensor("sequence_length", np.zeros((1, 1), np.int32)),
                    ]
                    sender.send(pb_utils.InferenceResponse(output_tensors=[_texts([held]), *empty, *indices]))
            sender.send(flags=FINAL)
        except Exception as exc:  # the client gets the error instead of a stream that never ends
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}")), flags=FINAL)
