"""Triton python model ``audio_tokenizer``: the code lives in the installed plugin."""

from trtdeploy_cosyvoice.backends.audio_tokenizer import TritonPythonModel

__all__ = ["TritonPythonModel"]
