"""The Triton python models of a CosyVoice deployment (the templates' model.py files import them)."""
