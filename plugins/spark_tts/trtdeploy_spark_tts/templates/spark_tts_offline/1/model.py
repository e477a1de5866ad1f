"""Triton python model ``spark_tts_offline``: the code lives in the installed plugin."""

from trtdeploy_spark_tts.backends.tts import TritonPythonModel

__all__ = ["TritonPythonModel"]
