"""trtdeploy plugin for CosyVoice2-0.5B and Fun-CosyVoice3-0.5B: zero-shot speech synthesis on Triton.

Under construction: the LLM's conversion (:mod:`.convert`), the speaker embedding (:mod:`.speaker`) and the text
normalisation (:mod:`.text`) are here; the Triton models and the model's registration come next (see the README).
"""

__version__ = "0.1.0"
