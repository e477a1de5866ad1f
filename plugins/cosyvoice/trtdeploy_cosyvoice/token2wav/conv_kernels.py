"""Which convolution kernels a call runs on a GPU: cuDNN's, or PyTorch's own.

cuDNN chooses its kernels per input shape, and the first time it sees a shape the choice costs more than the
convolutions: about 2 ms of host time per convolution. On an H200, HiFT's ~40 convolutions over 7 s of audio take
70-100 ms at a length cuDNN has not seen, 12 ms at one it has, and 36 ms with PyTorch's own kernels, which choose
nothing; the flow (its encoder eager, its solver a CUDA graph) takes 75-85 ms at a new length with cuDNN, 55-60 ms
at a seen one, and 55-60 ms with PyTorch's kernels for its encoder, new length or not (a streamed chunk's encoder
reads the prompt too, so its lengths do not repeat across streams). Requests bring lengths of their own (and cuDNN
keeps a bounded number of choices), so a single row runs PyTorch's kernels, except the streamed chunks before the
last, whose shapes repeat from stream to stream. PyTorch's kernels loop over the rows of a batch (HiFT over 4 rows:
130 ms, against 30-70 ms with cuDNN), so batches keep cuDNN.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch


def _pytorch_kernels(use: bool) -> AbstractContextManager:
    return torch.backends.cudnn.flags(enabled=False) if use else nullcontext()


def encoder_kernels(rows: int) -> AbstractContextManager:
    """The flow encoder's kernels for a batch of ``rows``."""
    return _pytorch_kernels(rows == 1)


def vocoder_kernels(rows: int, *, finalize: bool) -> AbstractContextManager:
    """The vocoder's kernels for a batch of ``rows``; ``finalize`` False: a streamed chunk before the last."""
    return _pytorch_kernels(rows == 1 and finalize)
