"""The Triton side of the LLM contract, shared by the python models of the torch and trtllm_pytorch engines.

``execute`` parses each request into a :class:`~trtdeploy.engines.contract.GenerationRequest` and hands it, with
its response sender, to the engine's generator, then returns at once (decoupled or not): the generator runs a
continuous batch and answers through the sender. Decoupled streaming sends the new token ids as they come, then an
empty final response; otherwise one response carries everything. Importable only inside Triton's python backend.

Inputs as in TRT-LLM: ``end_id`` missing (or negative) stops at the checkpoint's end-of-sequence ids, ``end_id`` -1
never stops early (benchmarks use it to force exact lengths), and the end token is left out of the output;
``runtime_top_k`` 0 with ``runtime_top_p`` 0 (the defaults), ``temperature`` 0 or ``runtime_top_k`` 1 is greedy;
``random_seed`` (``seed`` as TRT-LLM 0.20+ names it) defaults to 0; ``streaming`` defaults to on in a decoupled
model; ``pad_id`` fills the rows of a multi-sequence request's ``output_ids`` past their ``sequence_length``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np
import triton_python_backend_utils as pb_utils

from ..backend_utils import ModelParameters
from .contract import GenerationRequest, ResponseSink, SamplingParams, output_arrays

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class ContractGenerator(Protocol):
    """What an engine's generator offers the Triton model."""

    pad_id: int

    def submit(self, request: GenerationRequest, sink: ResponseSink) -> None: ...

    def close(self) -> None: ...


def _optional(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def _response(outputs: list[list[int]], pad_id: int) -> pb_utils.InferenceResponse:
    ids, lengths = output_arrays(outputs, pad_id)
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("output_ids", ids), pb_utils.Tensor("sequence_length", lengths)]
    )


class _Sink:
    """Turns a generator's calls for one request into Triton responses."""

    def __init__(self, sender, pad_id: int, decoupled: bool):
        self.sender = sender
        self.pad_id = pad_id
        self.decoupled = decoupled

    def send_tokens(self, tokens: list[int]) -> None:
        self.sender.send(_response([tokens], self.pad_id))

    def send_final(self, outputs: list[list[int]] | None) -> None:
        if outputs is None:
            self.sender.send(flags=FINAL)
        elif self.decoupled:
            self.sender.send(_response(outputs, self.pad_id))
            self.sender.send(flags=FINAL)
        else:
            self.sender.send(_response(outputs, self.pad_id), flags=FINAL)

    def send_error(self, message: str, cancelled: bool = False) -> None:
        code = pb_utils.TritonError.CANCELLED if cancelled else pb_utils.TritonError.INVALID_ARG
        self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)

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
        self.generator = self.load(params)
        self.default_pad_id = self.generator.pad_id

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed, pad_id = self._parse(request)
            except ValueError as exc:
                _Sink(sender, 0, self.decoupled).send_error(str(exc))
                continue
            self.generator.submit(parsed, _Sink(sender, pad_id, self.decoupled))
        return None

    def _parse(self, request) -> tuple[GenerationRequest, int]:
        input_ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
        input_ids = input_ids.reshape(-1, input_ids.shape[-1])
        lengths = pb_utils.get_input_tensor_by_name(request, "input_lengths").as_numpy().reshape(-1)
        output_len = pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().reshape(-1)
        if len(lengths) != len(input_ids) or np.any(lengths > input_ids.shape[1]) or np.any(lengths < 0):
            raise ValueError(f"input_lengths {lengths.tolist()} do not fit input_ids of shape {input_ids.shape}")

        def scalar(names: tuple[str, ...], kind: type, default):
            for name in names:
                values = _optional(request, name)
                if values is not None and values.size:
                    return kind(values[0])
            return default

        streaming = scalar(("streaming",), bool, self.decoupled)
        if streaming and not self.decoupled:
            raise ValueError("streaming=true needs a decoupled model (this deployment is offline)")
        sampling = SamplingParams(
            temperature=scalar(("temperature",), float, 1.0),
            top_k=scalar(("runtime_top_k",), int, 0),
            top_p=scalar(("runtime_top_p",), float, 0.0),
            repetition_penalty=scalar(("repetition_penalty",), float, 1.0),
            seed=scalar(("random_seed", "seed"), int, 0),
        )
        parsed = GenerationRequest(
            input_ids=[row[:length].tolist() for row, length in zip(input_ids, lengths, strict=True)],
            max_new_tokens=int(output_len[0]),
            end_id=scalar(("end_id",), int, None),
            sampling=sampling,
            streaming=streaming,
            exclude_input=scalar(("exclude_input_in_output",), bool, self.exclude_input),
        )
        return parsed, scalar(("pad_id",), int, self.default_pad_id)

    def finalize(self) -> None:
        self.generator.close()
