"""Triton python model ``cosyvoice3_offline``: the code lives in the installed plugin."""

from trtdeploy_cosyvoice.backends.tts import TritonPythonModel

__all__ = ["TritonPythonModel"]
