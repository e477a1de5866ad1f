"""Triton python model ``vocoder``: the code lives in the installed plugin."""

from trtdeploy_spark_tts.backends.vocoder import TritonPythonModel

__all__ = ["TritonPythonModel"]
