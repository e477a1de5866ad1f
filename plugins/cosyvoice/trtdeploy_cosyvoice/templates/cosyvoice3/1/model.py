"""Triton python model ``cosyvoice3``: the code lives in the installed plugin."""

from trtdeploy_cosyvoice.backends.tts import TritonPythonModel

__all__ = ["TritonPythonModel"]
