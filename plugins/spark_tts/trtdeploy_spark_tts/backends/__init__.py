"""The Triton python models of a Spark-TTS deployment; each template's ``1/model.py`` imports one of these."""
