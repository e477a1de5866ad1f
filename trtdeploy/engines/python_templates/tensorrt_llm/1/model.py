"""Triton python model serving the TRT-LLM inflight-batcher tensor contract with one of trtdeploy's generators.

The request handling is the contract's (:mod:`trtdeploy.engines.triton_model`); the generator comes from the
``generator_factory`` parameter of config.pbtxt (``module:function``, called with the model's parameters): the
torch runtime's continuous batch, or TensorRT-LLM's LLM API for the trtllm_pytorch engine.
"""

from __future__ import annotations

import importlib

from trtdeploy.backend_utils import ModelParameters
from trtdeploy.engines.triton_model import ContractGenerator, ContractModel


class TritonPythonModel(ContractModel):
    def load(self, params: ModelParameters) -> ContractGenerator:
        module, _, name = params.str("generator_factory").partition(":")
        return getattr(importlib.import_module(module), name)(params)
