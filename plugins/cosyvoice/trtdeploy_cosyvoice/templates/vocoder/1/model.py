"""Triton python model ``vocoder``: the code lives in the installed plugin."""

from trtdeploy_cosyvoice.backends.vocoder import TritonPythonModel

__all__ = ["TritonPythonModel"]
