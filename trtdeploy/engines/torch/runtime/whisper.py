"""Whisper's forward pass of our own over the weights of transformers' ``WhisperForConditionalGeneration``.

The encoder (two convolutions with GELU, the checkpoint's sinusoidal positions, pre-LayerNorm layers, a final
LayerNorm) runs batched over the sequences admitted together (:meth:`WhisperModel.encode`), on up to
``2 * max_source_positions`` mel frames each (3000): ``T`` frames give ``T // 2`` encoder frames, and the frames
past them (padding up to the longest features of the batch) are masked out of the encoder's self-attention and of
the decoder's cross-attention. As TensorRT-LLM's encoder does without input padding, a sequence's encoder output is
that of its own frames, never of zeros appended to them.

Each decoder layer's cross-attention K/V of a sequence is computed once, at admission, into a static cache
``[layers, slots + 1, heads, max_source_positions, head_dim]``; the self-attention KV cache, the decode step's
static inputs, its buckets and CUDA graphs, and the padded prefill are :class:`SlotModel`'s. On a
GPU the encoder of whole windows runs as a CUDA graph per batch bucket, on the generator's admission stream beside
the decode steps; a decode step masks the cross-attention only while some slot's encoder output is partial. On a
GPU with Triton, the residual adds and LayerNorms, the decode step's self-attention with its K/V writes, and the
cross-attention K/V writes are fused kernels (:mod:`.kernels`); the step then does not depend on the attention
span, and one CUDA graph serves each batch bucket.
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
from .host import to_device
from .kernels import add_layer_norm, decode_self_attention, fused, write_cross_kv
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
class _EncoderBatch:
    """Inputs of one encoder pass, on the device: ``mels [n, T, n_mels]``, each input's encoder frames, the input
    row of each slot to fill, the slots, and whether the CUDA graph of its size runs it (else: eagerly)."""

    mels: torch.Tensor
    lengths: torch.Tensor
    rows: torch.Tensor
    slot_index: torch.Tensor
    graphed: bool


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
    #: The encoder (~6 ms a window on an H200) and a prefill over it would otherwise stall every running sequence.
    overlap_admission = True

    def __init__(
        self,
        whisper: torch.nn.Module,
        *,
        max_slots: int,
        max_seq_len: int,
        cuda_graphs: bool = True,
        overlap_admission: bool | None = None,
    ):
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
            overlap_admission=overlap_admission,
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
        self.act = encoder.layers[0].activation_fn  # config.activation_function, the encoder's and decoder's
        self.conv1 = _linear(encoder.conv1)
        self.conv2 = _linear(encoder.conv2)
        self.encoder_positions = encoder.embed_positions.weight.detach()
        self.encoder_layers = [self._encoder_layer(layer) for layer in encoder.layers]
        self.encoder_norm = _norm(encoder.layer_norm)
        self.layers = [self._decoder_layer(layer) for layer in decoder.layers]
        self.embed = decoder.embed_tokens.weight.detach()
        self.decoder_positions = decoder.embed_positions.weight.detach()
        self.final_norm = _norm(decoder.layer_norm)
        #: The LayerNorm after each layer, fused with its last residual add: the next layer's first, the stack's
        #: final one after the last.
        self._encoder_next_norms = [layer.attn_norm for layer in self.encoder_layers[1:]] + [self.encoder_norm]
        self._decoder_next_norms = [layer.self_norm for layer in self.layers[1:]] + [self.final_norm]
        # cuBLAS runs a slow kernel for rows of 51,866 fp16 logits (not 16-byte aligned): the LM head writes rows
        # padded to a multiple of 64, and the logits are a view of their first vocab_size columns. The head is tied
        # to the token embedding in Whisper's checkpoints: both then are views of one padded table.
        padded = -(-self.vocab_size // 64) * 64
        self.lm_head = F.pad(head.detach(), (0, 0, 0, padded - self.vocab_size))
        if head.data_ptr() == self.embed.data_ptr():
            self.embed = self.lm_head[: self.vocab_size]
        self._head_out = torch.zeros(max_slots, padded, dtype=self.dtype, device=self.device)
        self.logits = self._head_out[:, : self.vocab_size]

        cache_shape = (len(self.layers), max_slots + 1, self.num_heads, max_seq_len, self.head_dim)
        self.k_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)
        cross_shape = (len(self.layers), max_slots + 1, self.num_heads, self.max_frames, self.head_dim)
        self.cross_k = torch.zeros(cross_shape, dtype=self.dtype, device=self.device)
        self.cross_v = torch.zeros(cross_shape, dtype=self.dtype, device=self.device)
        #: Each slot's number of encoder frames (the scratch slot's are all zeros, and all attended).
        self.encoder_lengths = torch.full((max_slots + 1,), self.max_frames, dtype=torch.long, device=self.device)
        self._frames = torch.arange(self.max_frames, device=self.device)
        #: Slots whose encoder output is shorter than ``max_frames``: only a decode step over one of them masks the
        #: cross-attention (whole windows, what Whisper's feature extractor makes, need no mask, and SDPA runs
        #: ~30% faster without one at batch 16).
        self._partial_slots: set[int] = set()
        self._full_lengths = torch.full((ENCODER_BATCH,), self.max_frames, dtype=torch.long, device=self.device)
        self._encoder_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        #: The fused self-attention reads each slot's own keys whatever the span: one decode graph per batch bucket.
        self._span_free = fused(self.k_cache, dim=self.head_dim)
        if self.use_graphs:
            self._capture_graphs()

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """Capture the CUDA graphs of every encoder batch size and of the whole-window decode step of every batch
        bucket now, at load: a graph captured where it is first met stalls every running sequence (up to a second
        under load). The captures' writes go to slots that no sequence owns yet."""
        try:
            for rows in range(1, min(ENCODER_BATCH, self.max_slots) + 1):
                self._encoder_graph(rows)
            if self._span_free:
                self._step_form = False
                for batch in sorted({self.buckets(count, 1)[0] for count in range(1, self.max_slots + 1)}):
                    self._graph(batch, self.max_seq_len)
        except RuntimeError:
            self._give_up_graphs()

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

    @staticmethod
    def _transformers_model(model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
        from transformers import WhisperForConditionalGeneration

        return WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=dtype)

    def buckets(self, batch: int, span: int) -> tuple[int, int]:
        batch, span = super().buckets(batch, span)
        return batch, self.max_seq_len if self._span_free else span

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

        Slots given the same features object (the return sequences of one prompt) share one encoder pass. Every
        input is on its way to the device (through pinned memory) before the first batch is queued. With CUDA
        graphs, batches of whole windows (``max_features`` frames each, as Whisper's
        feature extractor pads them), one slot per input, replay a graph per batch bucket: eagerly, a window's ~20
        kernels per layer cost more in launches than on the GPU.
        """
        for slot, item in zip(slots, features, strict=True):
            if len(item) // 2 < self.max_frames:
                self._partial_slots.add(slot)
            else:
                self._partial_slots.discard(slot)
        distinct: dict[int, int] = {}
        owners = [distinct.setdefault(id(item), len(distinct)) for item in features]
        inputs = list({id(item): item for item in features}.values())
        staged = []
        for start in range(0, len(inputs), ENCODER_BATCH):
            chunk = inputs[start : start + ENCODER_BATCH]
            members = [i for i, owner in enumerate(owners) if start <= owner < start + len(chunk)]
            rows = [owners[i] - start for i in members]
            staged.append(self._stage(chunk, rows, [slots[i] for i in members]))
        for batch in staged:
            if batch.graphed:
                try:
                    graph, mels, slot_index = self._encoder_graph(len(batch.mels))
                except RuntimeError:
                    self._give_up_graphs()
                else:
                    mels.copy_(batch.mels)
                    slot_index.copy_(batch.slot_index)
                    graph.replay()
                    continue
            hidden = self._encoder_stack(batch.mels, batch.lengths)
            count = len(batch.rows)
            self._write_cross(hidden[batch.rows], batch.slot_index[:count], batch.lengths[batch.rows])

    def _stage(self, chunk: list[np.ndarray], rows: list[int], slots: list[int]) -> _EncoderBatch:
        """An encoder batch on the device: whole windows, one slot each, run by the CUDA graph of exactly that many
        rows (at most :data:`ENCODER_BATCH` graphs: a window costs as much as a decode step, so padding a batch to
        a bucket, 5 windows to 8, would cost more than the captures); else the features zero-padded to the longest
        (an odd last frame makes no encoder frame, and is dropped)."""
        one_slot_each = rows == list(range(len(chunk)))
        graphed = self.use_graphs and one_slot_each and all(len(item) == self.max_features for item in chunk)
        longest = max(len(item) // 2 * 2 for item in chunk)
        mels = np.zeros((len(chunk), longest, self.n_mels), dtype=chunk[0].dtype)
        for row, item in enumerate(chunk):
            frames = len(item) // 2 * 2
            mels[row, :frames] = item[:frames]
        return _EncoderBatch(
            mels=to_device(mels, self.device).to(self.dtype),
            lengths=self._ids([len(item) // 2 for item in chunk]),
            rows=self._ids(rows),
            slot_index=self._ids(slots),
            graphed=graphed,
        )

    def _encoder_graph(self, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        """The CUDA graph encoding ``rows`` whole windows into the slots of its static ``slot_index``."""
        entry = self._encoder_graphs.get(rows)
        if entry is None:
            mels = torch.zeros(rows, self.max_features, self.n_mels, dtype=self.dtype, device=self.device)
            slot_index = torch.full((rows,), self.max_slots, dtype=torch.long, device=self.device)  # warm-up: scratch

            def forward() -> None:
                hidden = self._encoder_stack(mels, None)
                self._write_cross(hidden, slot_index, self._full_lengths[:rows])

            graph, _ = self.capture(forward, admission=True)
            entry = self._encoder_graphs[rows] = (graph, mels, slot_index)
        return entry

    def _write_cross(self, hidden: torch.Tensor, slot_index: torch.Tensor, lengths: torch.Tensor) -> None:
        """Each decoder layer's cross-attention K/V of ``hidden [n, frames, hidden]`` into slots ``slot_index``."""
        for index, layer in enumerate(self.layers):
            write_cross_kv(F.linear(hidden, *layer.cross_kv), self.cross_k[index], self.cross_v[index], slot_index)
        self.encoder_lengths[slot_index] = lengths

    def _encoder_stack(self, mels: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """The encoder over ``mels [n, T, n_mels]`` (T even); ``lengths`` (encoder frames per input, None when all
        are whole) masks the frames past each input's own out of the self-attention."""
        x = mels.transpose(1, 2)
        # Zero padding after T frames leaves the first T // 2 outputs as they are without it: conv1 pads with zeros,
        # and conv2's output i reads conv1's outputs up to 2i + 1 < T.
        x = F.gelu(F.conv1d(x, *self.conv1, padding=1))
        # Contiguous frames-major activations: elementwise ops keep their first input's layout, so a transposed view
        # here would make every residual add and LayerNorm of the stack a strided copy (40% of its GPU time).
        x = F.gelu(F.conv1d(x, *self.conv2, stride=2, padding=1)).transpose(1, 2).contiguous()
        frames = x.shape[1]
        x = x + self.encoder_positions[:frames]
        mask = None
        if lengths is not None and bool((lengths < frames).any()):
            mask = (self._frames[None, :frames] < lengths[:, None])[:, None, None, :]
        # fp16 activations are clamped after each layer, as transformers' encoder layer keeps them finite.
        bound = torch.finfo(torch.float16).max - 1000 if x.dtype == torch.float16 else None
        heads = self.encoder_heads
        h = F.layer_norm(x, (self.hidden,), *self.encoder_layers[0].attn_norm, self.eps)
        for layer, next_norm in zip(self.encoder_layers, self._encoder_next_norms, strict=True):
            qkv = F.linear(h, *layer.qkv).unflatten(-1, (3 * heads, -1)).transpose(1, 2)
            q, k, v = qkv.chunk(3, 1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
            x, h = add_layer_norm(x, F.linear(out.transpose(1, 2).flatten(2), *layer.out), layer.mlp_norm, self.eps)
            x, h = add_layer_norm(x, self._mlp(layer, h), next_norm, self.eps, clamp=bound)
        return h  # the encoder's final LayerNorm, fused with the last layer's residual add

    # --- decoder ------------------------------------------------------------------------------------------------

    def _mlp(self, layer: _EncoderLayer | _DecoderLayer, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act(F.linear(h, *layer.fc1)), *layer.fc2)

    def _prefill_forward(self, ids: torch.Tensor, slot_index: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        rows, length = ids.shape
        heads = self.num_heads
        x = F.embedding(ids, self.embed) + self.decoder_positions[:length]
        h = F.layer_norm(x, (self.hidden,), *self.layers[0].self_norm, self.eps)
        attended = (self._frames[None, :] < self.encoder_lengths[slot_index][:, None])[:, None, None, :]
        for index, (layer, next_norm) in enumerate(zip(self.layers, self._decoder_next_norms, strict=True)):
            q, k, v = F.linear(h, *layer.qkv).unflatten(-1, (3 * heads, -1)).transpose(1, 2).chunk(3, 1)
            self.k_cache[index, slot_index, :, :length] = k
            self.v_cache[index, slot_index, :, :length] = v
            # Right padding: a real query never attends past its own position, so causal masking suffices.
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
            x, h = add_layer_norm(
                x, F.linear(out.transpose(1, 2).flatten(2), *layer.self_out), layer.cross_norm, self.eps
            )
            q = F.linear(h, *layer.cross_q).unflatten(-1, (heads, -1)).transpose(1, 2)
            keys, values = self.cross_k[index, slot_index], self.cross_v[index, slot_index]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attended, scale=1.0)
            x, h = add_layer_norm(
                x, F.linear(out.transpose(1, 2).flatten(2), *layer.cross_out), layer.mlp_norm, self.eps
            )
            x, h = add_layer_norm(x, self._mlp(layer, h), next_norm, self.eps)
        if last is not None:
            h = h[torch.arange(rows, device=self.device), last]
        return F.linear(h, self.lm_head)[..., : self.vocab_size].float()

    def _choose_step_form(self, batch: int) -> bool:
        """Whether the step masks the cross-attention: whether a slot in ``[0, batch)`` has a partial window."""
        return any(slot < batch for slot in self._partial_slots)

    def _decode_forward(self, batch: int, span: int) -> None:
        """One token for slots ``[0, batch)``. The self-attention writes the new K/V and attends to each slot's
        cache up to its position (:func:`decode_self_attention`); the cross-attention is SDPA's fused kernel, with
        an additive mask up to each slot's encoder length in the masked form of the step only."""
        heads, dim = self.num_heads, self.head_dim
        positions = self.positions[:batch]
        cross_mask = None
        if self._step_form:  # some slot's encoder output is shorter than max_frames
            cross_mask = torch.zeros(batch, 1, 1, self.max_frames, dtype=self.dtype, device=self.device)
            beyond = self._frames[None, :] >= self.encoder_lengths[:batch, None]
            cross_mask.masked_fill_(beyond[:, None, None, :], float("-inf"))
        x = F.embedding(self.tokens[:batch], self.embed)
        x, h = add_layer_norm(x, self.decoder_positions[positions], self.layers[0].self_norm, self.eps)
        for index, (layer, next_norm) in enumerate(zip(self.layers, self._decoder_next_norms, strict=True)):
            qkv = F.linear(h, *layer.qkv)
            out = decode_self_attention(qkv, self.k_cache[index], self.v_cache[index], positions, span)
            x, h = add_layer_norm(x, F.linear(out, *layer.self_out), layer.cross_norm, self.eps)
            q = F.linear(h, *layer.cross_q).view(batch, heads, 1, dim)
            out = F.scaled_dot_product_attention(
                q, self.cross_k[index, :batch], self.cross_v[index, :batch], attn_mask=cross_mask, scale=1.0
            )
            x, h = add_layer_norm(x, F.linear(out.reshape(batch, -1), *layer.cross_out), layer.mlp_norm, self.eps)
            x, h = add_layer_norm(x, self._mlp(layer, h), next_norm, self.eps)
        self._write_logits(h, batch)
