"""Triton python model ``token2wav``: the code lives in the installed plugin."""

from trtdeploy_cosyvoice.backends.token2wav import TritonPythonModel

__all__ = ["TritonPythonModel"]
