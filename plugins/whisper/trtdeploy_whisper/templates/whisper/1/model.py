"""Triton python model ``whisper`` (the offline entry under Triton-ASR-Client's model name): the code lives in the
installed plugin."""

from trtdeploy_whisper.backend import TritonPythonModel

__all__ = ["TritonPythonModel"]
