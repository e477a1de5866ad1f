"""Triton python model ``speaker_embedding``: the code lives in the installed plugin."""

from trtdeploy_cosyvoice.backends.speaker_embedding import TritonPythonModel

__all__ = ["TritonPythonModel"]
