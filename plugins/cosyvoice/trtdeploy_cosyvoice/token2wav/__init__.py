"""CosyVoice's token2wav, written from its architecture: speech tokens to a mel spectrogram by flow matching, then
to 24 kHz audio by the HiFT vocoder.

Every module's parameters carry the names of the official checkpoint's keys (``flow.pt``, ``hift.pt``), so the
official files load strictly and a random checkpoint is a state dict of these modules.
"""
