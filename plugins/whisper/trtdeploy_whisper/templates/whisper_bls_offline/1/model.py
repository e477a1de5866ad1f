"""Triton python model ``whisper_bls_offline``: the code lives in the installed plugin."""

from trtdeploy_whisper.backend import TritonPythonModel

__all__ = ["TritonPythonModel"]
