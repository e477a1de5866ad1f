"""The Triton side of the LLM contract, shared by the python models of the torch and trtllm_pytorch engines.

``execute`` parses each request into a :class:`~trtdeploy.engines.contract.GenerationRequest` and hands it, with
its response sender, to the engine's generator, then returns at once (decoupled or not): the generator runs a
continuous batch and answers through the sender. Importable only inside Triton's python backend.

The tensors are TRT-LLM's ``tensorrt_llm`` model's (:data:`~trtdeploy.engines.contract.INPUTS`, ``OUTPUTS``), with
its semantics: ``end_id`` missing (or negative) stops at the checkpoint's end-of-sequence ids, ``end_id`` -1 never
stops early (benchmarks use it to force exact lengths), and the end token is left out of the output;
``runtime_top_k`` 0 with ``runtime_top_p`` 0 (the defaults), ``temperature`` 0 or ``runtime_top_k`` 1 is greedy;
``random_seed`` defaults to 0; ``min_length`` holds the end token back (TRT-LLM 0.20+'s C++ backend calls these
two ``seed`` and ``min_tokens``; these models take the contract's names); ``stop_words_list``/``bad_words_list``
take TRT-LLM's ``[2, n]`` word-list layout; ``streaming`` defaults to on in a decoupled model;
``exclude_input_in_output`` false puts the prompt before an offline answer's ids (never before streamed ones);
``pad_id`` has nothing to pad (one sequence of one beam per response).

Responses, as TRT-LLM's backend sends them, hold one sequence each. A model that is not decoupled answers a request
of one prompt and one sequence with one response, and refuses streaming, several prompts and several return
sequences by name (the backend refuses a batch there, and would send one response per sequence, which such a model
cannot). A decoupled one sends each sequence (or, streaming, each piece of it) in its own response, with
``batch_index``/``sequence_index`` when the request has several rows/sequences, then an empty final response.
``cum_log_probs``/``output_log_probs``, ``context_logits``, ``generation_logits`` and ``num_input_tokens``/
``num_output_tokens`` come when their ``return_*`` input asks. An input an engine cannot honour
is refused with one line naming it (:func:`~trtdeploy.engines.contract.refusal`).

An encoder-decoder model (config.pbtxt parameter ``encoder_decoder`` true) takes TensorRT-LLM's encoder-decoder
inputs instead of ``input_ids``: ``encoder_input_features`` (passed on as the numpy arrays of its declared data
type), ``encoder_output_lengths``, ``decoder_input_ids`` and ``decoder_input_lengths``, with ``input_lengths``
counting mel frames (:func:`~trtdeploy.engines.contract.parse_request`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np
import triton_python_backend_utils as pb_utils

from ..backend_utils import ModelParameters
from .contract import GenerationRequest, ResponseSink, SequenceOutput, parse_request, response_arrays

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class ContractGenerator(Protocol):
    """What an engine's generator offers the Triton model."""

    def submit(self, request: GenerationRequest, sink: ResponseSink) -> None: ...

    def close(self) -> None: ...


def _error(message: str, cancelled: bool = False) -> pb_utils.InferenceResponse:
    code = pb_utils.TritonError.CANCELLED if cancelled else pb_utils.TritonError.INVALID_ARG
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class _Sink:
    """Turns a generator's calls for one request into Triton responses."""

    def __init__(self, sender, request: GenerationRequest, decoupled: bool):
        self.sender = sender
        self.request = request
        self.decoupled = decoupled

    def _response(self, output: SequenceOutput) -> pb_utils.InferenceResponse:
        arrays = response_arrays(self.request, output)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])

    def send_tokens(self, tokens: SequenceOutput) -> None:
        self.sender.send(self._response(tokens))

    def send_final(self, outputs: list[SequenceOutput] | None) -> None:
        if not self.decoupled:  # parse_request let through one prompt and one sequence only
            (output,) = outputs
            self.sender.send(self._response(output), flags=FINAL)
            return
        for output in outputs or ():
            self.sender.send(self._response(output))
        self.sender.send(flags=FINAL)

    def send_error(self, message: str, cancelled: bool = False) -> None:
        self.sender.send(_error(message, cancelled), flags=FINAL)

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


class ContractModel(ABC):
    """Base of a ``TritonPythonModel`` serving the contract: subclasses say how to load their generator."""

    @abstractmethod
    def load(self, params: ModelParameters) -> ContractGenerator:
        """The engine's generator, from the model's config.pbtxt ``parameters``."""

    def initialize(self, args: dict[str, Any]) -> None:
        params = ModelParameters(args)
        if args.get("model_instance_kind") == "GPU":  # a replica: this instance's GPU, as Triton assigned it
            params.raw["device"] = f"cuda:{args['model_instance_device_id']}"
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.exclude_input = params.bool("exclude_input_in_output", True)
        self.encoder_decoder = params.bool("encoder_decoder", False)
        self.generator = self.load(params)

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            inputs: dict[str, np.ndarray] = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            try:
                parsed = parse_request(
                    inputs,
                    decoupled=self.decoupled,
                    exclude_input=self.exclude_input,
                    encoder_decoder=self.encoder_decoder,
                )
            except ValueError as exc:
                sender.send(_error(str(exc)), flags=FINAL)
                continue
            self.generator.submit(parsed, _Sink(sender, parsed, self.decoupled))
        return None

    def finalize(self) -> None:
        self.generator.close()
