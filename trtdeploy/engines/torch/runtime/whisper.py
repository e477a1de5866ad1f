"""Whisper's forward pass of our own over the weights of transformers' ``WhisperForConditionalGeneration``.

The encoder (two convolutions with GELU, the checkpoint's sinusoidal positions, pre-LayerNorm layers, a final
LayerNorm) runs batched over the sequences admitted together (:meth:`WhisperModel.encode`), on up to
``2 * max_source_positions`` mel frames each (3000): ``T`` frames give ``T // 2`` encoder frames, and the frames
past them (padding up to the longest features of the batch) are masked out of the encoder's self-attention and of
the decoder's cross-attention. As TensorRT-LLM's encoder does without input padding, a sequence's encoder output is
that of its own frames, never of zeros appended to them.

Each decoder layer's cross-attention K/V of a sequence is computed once, at admission, into a static cache
``[layers, slots + 1, heads, max_source_positions, head_dim]``; the self-attention KV cache, the decode step's
static inputs, its ``(batch, span)`` buckets and CUDA graphs, and the padded prefill are :class:`SlotModel`'s.
The decoder has learned positions (``max_target_positions``, the longest a sequence can be) and the LM head tied
to the token embedding. q/k/v of every self-attention are one matmul, and so are k/v of each cross-attention.
Whisper's head size is 64, so the query scaling (1/8, a power of two) is folded into the query weights exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ....memory import ENCODER_BATCH  # inputs encoded in one batch (bounds the activations at admission)
from .model import SlotModel, _fuse

Linear = tuple[torch.Tensor, torch.Tensor | None]
Norm = tuple[torch.Tensor, torch.Tensor]


def _linear(module: torch.nn.Linear, scale: float = 1.0) -> Linear:
    weight = module.weight.detach()
    bias = None if module.bias is None else module.bias.detach()
    if scale == 1.0:
        return weight, bias
    return weight * scale, None if bias is None else bias * scale


def _norm(module: torch.nn.LayerNorm) -> Norm:
    return module.weight.detach(), module.bias.detach()


@dataclass
class _EncoderLayer:
    attn_norm: Norm
    qkv: Linear
    out: Linear
    mlp_norm: Norm
    fc1: Linear
    fc2: Linear


@dataclass
class _DecoderLayer:
    self_norm: Norm
    qkv: Linear
    self_out: Linear
    cross_norm: Norm
    cross_q: Linear
    cross_kv: Linear
    cross_out: Linear
    mlp_norm: Norm
    fc1: Linear
    fc2: Linear


class WhisperModel(SlotModel):
    """Whisper's encoder and decoder over static self- and cross-attention caches of ``max_slots`` sequences."""

    encoder_decoder = True

    def __init__(self, whisper: torch.nn.Module, *, max_slots: int, max_seq_len: int, cuda_graphs: bool = True):
        config = whisper.config
        if max_seq_len > config.max_target_positions:
            raise ValueError(
                f"max_seq_len {max_seq_len} exceeds Whisper's max_target_positions {config.max_target_positions}"
            )
        head = whisper.proj_out.weight
        super().__init__(
            device=head.device,
            dtype=head.dtype,
            vocab_size=head.shape[0],
            max_slots=max_slots,
            max_seq_len=max_seq_len,
            cuda_graphs=cuda_graphs,
        )
        encoder, decoder = whisper.model.encoder, whisper.model.decoder
        self.hidden = config.d_model
        self.encoder_heads = config.encoder_attention_heads
        self.num_heads = config.decoder_attention_heads
        self.head_dim = self.hidden // self.num_heads
        self.n_mels = config.num_mel_bins
        #: Encoder frames a sequence attends to at most, and the mel frames that make them.
        self.max_frames = config.max_source_positions
        self.max_features = self.max_frames * encoder.conv1.stride[0] * encoder.conv2.stride[0]
        self.eps = encoder.layer_norm.eps
        self.encoder_act = encoder.layers[0].activation_fn
        self.decoder_act = decoder.layers[0].activation_fn
        self.conv1 = _linear(encoder.conv1)
        self.conv2 = _linear(encoder.conv2)
        self.encoder_positions = encoder.embed_positions.weight.detach()
        self.encoder_layers = [self._encoder_layer(layer) for layer in encoder.layers]
        self.encoder_norm = _norm(encoder.layer_norm)
        self.layers = [self._decoder_layer(layer) for layer in decoder.layers]
        self.embed = decoder.embed_tokens.weight.detach()
        self.decoder_positions = decoder.embed_positions.weight.detach()
        self.final_norm = _norm(decoder.layer_norm)
        self.lm_head = head.detach()

        cache_shape = (len(self.layers), max_slots + 1, self.num_heads, max_seq_len, self.head_dim)
        self.k_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)
        cross_shape = (len(self.layers), max_slots + 1, self.num_heads, self.max_frames, self.head_dim)
        self.cross_k = torch.zeros(cross_shape, dtype=self.dtype, device=self.device)
        self.cross_v = torch.zeros(cross_shape, dtype=self.dtype, device=self.device)
        #: Each slot's number of encoder frames (the scratch slot's are all zeros, and all attended).
        self.encoder_lengths = torch.full((max_slots + 1,), self.max_frames, dtype=torch.long, device=self.device)
        self._frames = torch.arange(self.max_frames, device=self.device)

    @staticmethod
    def _encoder_layer(layer: torch.nn.Module) -> _EncoderLayer:
        attn = layer.self_attn
        return _EncoderLayer(
            attn_norm=_norm(layer.self_attn_layer_norm),
            qkv=_fuse([attn.q_proj, attn.k_proj, attn.v_proj], [attn.scaling, 1.0, 1.0]),
            out=_linear(attn.out_proj),
            mlp_norm=_norm(layer.final_layer_norm),
            fc1=_linear(layer.fc1),
            fc2=_linear(layer.fc2),
        )

    @staticmethod
    def _decoder_layer(layer: torch.nn.Module) -> _DecoderLayer:
        attn, cross = layer.self_attn, layer.encoder_attn
        return _DecoderLayer(
            self_norm=_norm(layer.self_attn_layer_norm),
            qkv=_fuse([attn.q_proj, attn.k_proj, attn.v_proj], [attn.scaling, 1.0, 1.0]),
            self_out=_linear(attn.out_proj),
            cross_norm=_norm(layer.encoder_attn_layer_norm),
            cross_q=_linear(cross.q_proj, cross.scaling),
            cross_kv=_fuse([cross.k_proj, cross.v_proj]),
            cross_out=_linear(cross.out_proj),
            mlp_norm=_norm(layer.final_layer_norm),
            fc1=_linear(layer.fc1),
            fc2=_linear(layer.fc2),
        )

    @classmethod
    def from_pretrained(
        cls, model_dir: str, *, dtype: torch.dtype, device: str, max_slots: int, max_seq_len: int, cuda_graphs: bool
    ) -> WhisperModel:
        """Load a checkpoint folder with transformers and keep only the weights this forward pass uses."""
        from transformers import WhisperForConditionalGeneration

        whisper = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        return cls(whisper, max_slots=max_slots, max_seq_len=max_seq_len, cuda_graphs=cuda_graphs)

    def weight_bytes(self) -> int:
        """Bytes of weights a decode step reads (the decoder's layers, its final norm and the LM head)."""
        tensors = [*self.final_norm, self.lm_head]
        for layer in self.layers:
            for pair in vars(layer).values():
                tensors.extend(value for value in pair if value is not None)
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    def features_problem(self, features: np.ndarray) -> str | None:
        """Why these ``[frames, n_mels]`` input features cannot be encoded, in one line, or None."""
        if features.ndim != 2 or features.shape[1] != self.n_mels:
            return (
                f"encoder_input_features of shape {list(features.shape)}: this model takes [frames, {self.n_mels}] "
                f"log-mel features per prompt"
            )
        if not 2 <= features.shape[0] <= self.max_features:
            return (
                f"encoder_input_features hold {features.shape[0]} mel frames: this model takes 2 to {self.max_features}"
            )
        return None

    # --- encoder ------------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, slots: list[int], features: list[np.ndarray]) -> None:
        """Encode each slot's ``[frames, n_mels]`` features and fill its cross-attention K/V, batched.

        Slots given the same features object (the return sequences of one prompt) share one encoder pass.
        """
        distinct: dict[int, int] = {}
        owners = [distinct.setdefault(id(item), len(distinct)) for item in features]
        inputs = list({id(item): item for item in features}.values())
        for start in range(0, len(inputs), ENCODER_BATCH):
            chunk = inputs[start : start + ENCODER_BATCH]
            hidden, lengths = self._encoder_forward(chunk)
            members = [i for i, owner in enumerate(owners) if start <= owner < start + len(chunk)]
            rows = torch.as_tensor([owners[i] - start for i in members], device=self.device)
            slot_index = torch.as_tensor([slots[i] for i in members], device=self.device)
            frames = hidden.shape[1]
            hidden = hidden[rows]
            for index, layer in enumerate(self.layers):
                kv = F.linear(hidden, *layer.cross_kv).unflatten(-1, (2 * self.num_heads, self.head_dim))
                k, v = kv.transpose(1, 2).chunk(2, 1)
                self.cross_k[index, slot_index, :, :frames] = k
                self.cross_v[index, slot_index, :, :frames] = v
            self.encoder_lengths[slot_index] = lengths[rows]

    def _encoder_forward(self, features: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output ``[n, frames, hidden]`` over features zero-padded to the longest, and each input's
        number of valid frames (``T // 2``: an odd last mel frame is dropped, so that the output is the encoder's
        over its own frames alone)."""
        even = [item[: len(item) // 2 * 2] for item in features]  # an odd last frame makes no encoder frame
        longest = max(len(item) for item in even)
        mels = torch.zeros(len(even), longest, self.n_mels, dtype=self.dtype, device=self.device)
        for row, item in enumerate(even):
            mels[row, : len(item)] = torch.from_numpy(np.array(item)).to(self.device)
        x = mels.transpose(1, 2)
        # Zero padding after T frames leaves the first T // 2 outputs as they are without it: conv1 pads with zeros,
        # and conv2's output i reads conv1's outputs up to 2i + 1 < T.
        x = F.gelu(F.conv1d(x, *self.conv1, padding=1))
        x = F.gelu(F.conv1d(x, *self.conv2, stride=2, padding=1)).transpose(1, 2)
        count, frames = x.shape[:2]
        x = x + self.encoder_positions[:frames]
        lengths = torch.as_tensor([len(item) // 2 for item in features], device=self.device)
        mask = None
        if bool((lengths < frames).any()):
            mask = (self._frames[None, :frames] < lengths[:, None])[:, None, None, :]
        heads = self.encoder_heads
        for layer in self.encoder_layers:
            h = F.layer_norm(x, (self.hidden,), *layer.attn_norm, self.eps)
            qkv = F.linear(h, *layer.qkv).unflatten(-1, (3 * heads, -1)).transpose(1, 2)
            q, k, v = qkv.chunk(3, 1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
            x = x + F.linear(out.transpose(1, 2).flatten(2), *layer.out)
            h = F.layer_norm(x, (self.hidden,), *layer.mlp_norm, self.eps)
            x = x + F.linear(self.encoder_act(F.linear(h, *layer.fc1)), *layer.fc2)
            if x.dtype == torch.float16:  # as transformers' encoder layer keeps fp16 activations finite
                bound = torch.finfo(torch.float16).max - 1000
                x = x.clamp(-bound, bound)
        return F.layer_norm(x, (self.hidden,), *self.encoder_norm, self.eps), lengths

    # --- decoder ------------------------------------------------------------------------------------------------

    def _mlp(self, layer: _DecoderLayer, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (self.hidden,), *layer.mlp_norm, self.eps)
        return x + F.linear(self.decoder_act(F.linear(h, *layer.fc1)), *layer.fc2)

    def _prefill_forward(self, ids: torch.Tensor, slot_index: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        rows, length = ids.shape
        heads = self.num_heads
        x = F.embedding(ids, self.embed) + self.decoder_positions[:length]
        attended = (self._frames[None, :] < self.encoder_lengths[slot_index][:, None])[:, None, None, :]
        for index, layer in enumerate(self.layers):
            h = F.layer_norm(x, (self.hidden,), *layer.self_norm, self.eps)
            q, k, v = F.linear(h, *layer.qkv).unflatten(-1, (3 * heads, -1)).transpose(1, 2).chunk(3, 1)
            self.k_cache[index, slot_index, :, :length] = k
            self.v_cache[index, slot_index, :, :length] = v
            # Right padding: a real query never attends past its own position, so causal masking suffices.
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
            x = x + F.linear(out.transpose(1, 2).flatten(2), *layer.self_out)
            h = F.layer_norm(x, (self.hidden,), *layer.cross_norm, self.eps)
            q = F.linear(h, *layer.cross_q).unflatten(-1, (heads, -1)).transpose(1, 2)
            keys, values = self.cross_k[index, slot_index], self.cross_v[index, slot_index]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attended, scale=1.0)
            x = x + F.linear(out.transpose(1, 2).flatten(2), *layer.cross_out)
            x = self._mlp(layer, x)
        if last is not None:
            x = x[torch.arange(rows, device=self.device), last]
        x = F.layer_norm(x, (self.hidden,), *self.final_norm, self.eps)
        return F.linear(x, self.lm_head).float()

    def _decode_forward(self, batch: int, span: int) -> None:
        """One token for slots ``[0, batch)``. Both attentions go through SDPA, one fused kernel each (a third less
        time per step than scores, softmax and weighted sum as three, on an H200 at batch 64), with additive masks
        that broadcast over the heads: the self-attention's up to each slot's position, the cross-attention's up to
        its encoder length."""
        heads, dim = self.num_heads, self.head_dim
        positions = self.positions[:batch]
        write_index = positions.view(batch, 1, 1, 1).expand(batch, heads, 1, dim)
        keys = torch.arange(span, device=self.device)
        mask = torch.zeros(batch, 1, 1, span, dtype=self.dtype, device=self.device)
        mask.masked_fill_((keys[None, :] > positions[:, None])[:, None, None, :], float("-inf"))
        cross_mask = torch.zeros(batch, 1, 1, self.max_frames, dtype=self.dtype, device=self.device)
        beyond = self._frames[None, :] >= self.encoder_lengths[:batch, None]
        cross_mask.masked_fill_(beyond[:, None, None, :], float("-inf"))
        x = F.embedding(self.tokens[:batch], self.embed) + self.decoder_positions[positions]
        for index, layer in enumerate(self.layers):
            h = F.layer_norm(x, (self.hidden,), *layer.self_norm, self.eps)
            q, k, v = F.linear(h, *layer.qkv).view(batch, 3 * heads, dim).chunk(3, 1)
            k_cache, v_cache = self.k_cache[index, :batch], self.v_cache[index, :batch]
            k_cache.scatter_(2, write_index, k.unsqueeze(2))
            v_cache.scatter_(2, write_index, v.unsqueeze(2))
            out = F.scaled_dot_product_attention(
                q.unsqueeze(2), k_cache[:, :, :span], v_cache[:, :, :span], attn_mask=mask, scale=1.0
            )
            x = x + F.linear(out.reshape(batch, -1), *layer.self_out)
            h = F.layer_norm(x, (self.hidden,), *layer.cross_norm, self.eps)
            q = F.linear(h, *layer.cross_q).view(batch, heads, 1, dim)
            out = F.scaled_dot_product_attention(
                q, self.cross_k[index, :batch], self.cross_v[index, :batch], attn_mask=cross_mask, scale=1.0
            )
            x = x + F.linear(out.reshape(batch, -1), *layer.cross_out)
            x = self._mlp(layer, x)
        x = F.layer_norm(x, (self.hidden,), *self.final_norm, self.eps)
        torch.mm(x, self.lm_head.t(), out=self.logits[:batch])
