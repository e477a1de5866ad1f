"""Triton python model serving the TRT-LLM inflight-batcher tensor contract with trtdeploy's torch runtime.

``execute`` parses each request and hands it, with its response sender, to the runtime's decode loop, then returns
at once (decoupled or not): the loop runs a continuous batch and answers through the sender. Decoupled streaming
sends the new token ids of each step, then an empty final response; otherwise one response carries everything.
The model's settings come from the ``parameters`` of config.pbtxt (see the torch engine's template).

Inputs as in TRT-LLM: ``end_id`` missing (or negative) stops at the checkpoint's end-of-sequence ids, ``end_id`` -1
never stops early (benchmarks use it to force exact lengths), and the end token is left out of the output;
``runtime_top_k`` 0 with ``runtime_top_p`` 0 (the defaults), ``temperature`` 0 or ``runtime_top_k`` 1 is greedy;
``random_seed`` defaults to 0; ``streaming`` defaults to on in a decoupled model; ``pad_id`` fills the rows of a
multi-sequence request's ``output_ids`` past their ``sequence_length``.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy.backend_utils import ModelParameters
from trtdeploy.engines.torch.runtime import GenerationRequest, SamplingParams, load_generator, output_arrays

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _optional(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def _response(outputs: list[list[int]], pad_id: int) -> pb_utils.InferenceResponse:
    ids, lengths = output_arrays(outputs, pad_id)
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("output_ids", ids), pb_utils.Tensor("sequence_length", lengths)]
    )


class _Sink:
    """Turns the runtime's calls for one request into Triton responses."""

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


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.exclude_input = params.bool("exclude_input_in_output", True)
        self.generator = load_generator(
            params.str("hf_model_dir"),
            precision=params.str("precision", "fp32"),
            device=params.str("device", "cpu"),
            max_slots=params.int("max_slots"),
            max_input_len=params.int("max_input_len"),
            max_seq_len=params.int("max_seq_len"),
            max_num_tokens=params.int("max_num_tokens", 8192),
            cuda_graphs=params.bool("cuda_graphs", True),
            cancel_check_period=params.int("cancellation_check_period_ms", 100) / 1000,
        )
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

        def scalar(name: str, kind: type, default):
            values = _optional(request, name)
            return default if values is None or values.size == 0 else kind(values[0])

        streaming = scalar("streaming", bool, self.decoupled)
        if streaming and not self.decoupled:
            raise ValueError("streaming=true needs a decoupled model (this deployment is offline)")
        end_id = scalar("end_id", int, None)
        pad_id = scalar("pad_id", int, self.default_pad_id)
        sampling = SamplingParams(
            temperature=scalar("temperature", float, 1.0),
            top_k=scalar("runtime_top_k", int, 0),
            top_p=scalar("runtime_top_p", float, 0.0),
            repetition_penalty=scalar("repetition_penalty", float, 1.0),
            seed=scalar("random_seed", int, 0),
        )
        parsed = GenerationRequest(
            input_ids=[row[:length].tolist() for row, length in zip(input_ids, lengths, strict=True)],
            max_new_tokens=int(output_len[0]),
            end_id=end_id,
            sampling=sampling,
            streaming=streaming,
            exclude_input=scalar("exclude_input_in_output", bool, self.exclude_input),
        )
        return parsed, pad_id

    def finalize(self) -> None:
        self.generator.close()
