"""A decoder forward pass of our own over a Hugging Face causal LM's weights.

The weights come from the loaded transformers model (q/k/v and gate/up fused into one matmul each); rotary cos/sin
come from the model's own rotary module for positions ``[0, max_seq_len)``, so every rope scaling type it knows is
honoured (a dynamic one as it stands at ``max_seq_len``). The KV cache is static: per layer
``[slots + 1, kv_heads, max_seq_len, head_dim]``, one slot per running sequence plus a scratch slot. A decode step
runs over the slots ``[0, batch)`` and attends to the first ``span`` positions, so K/V are plain slice views; on CUDA
each ``(batch, span)`` bucket is captured once as a CUDA graph. Prefill is right-padded and causal; small prefills
are padded to (rows, length) buckets and replayed as CUDA graphs too, from a memory pool and capture stream of their
own, since the generator may run them beside decode steps (:attr:`SlotModel.overlap_admission`).

:class:`SlotModel` holds what does not depend on the architecture (the per-slot decode inputs, buckets, prefill
padding and CUDA graph capture); :class:`DecoderModel` and the Whisper model
(:mod:`trtdeploy.engines.torch.runtime.whisper`) supply the forward passes.
"""

from __future__ import annotations

import bisect
import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .host import to_device
from .kernels import add_rms_norm, rope_write_kv, rotate, silu_mul

log = logging.getLogger(__name__)

#: Batch and attention-span buckets a decode step is rounded up to (then capped by the slots / max_seq_len).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
SPAN_BUCKETS = tuple(64 * 2**i for i in range(12))
#: Prompt-length buckets of a padded prefill, and the most padded tokens a prefill CUDA graph may hold.
PREFILL_LENGTHS = tuple(16 * 2**i for i in range(12))
PREFILL_GRAPH_TOKENS = 8192


@dataclass
class _Layer:
    """One decoder layer's weights, with q/k/v and gate/up fused."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None


@dataclass
class PrefillInputs:
    """A prefill on the device: right-padded ``ids [rows, length]``, each row's slot and last prompt position; the
    first ``count`` rows are prompts, and ``padded`` says the shape is a bucket a CUDA graph may replay."""

    ids: torch.Tensor
    slot_index: torch.Tensor
    last: torch.Tensor
    count: int
    padded: bool


def _fuse(
    linears: list[torch.nn.Linear], scales: list[float] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input, each scaled by ``scales[i]`` if given."""
    scales = scales or [1.0] * len(linears)
    weight = torch.cat([linear.weight.detach() * scale for linear, scale in zip(linears, scales, strict=True)])
    if all(linear.bias is None for linear in linears):
        return weight, None
    biases = [
        linear.bias.detach() * scale if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
        for linear, scale in zip(linears, scales, strict=True)
    ]
    return weight, torch.cat(biases)


def _bias(linear: torch.nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def _bucket(value: int, buckets: tuple[int, ...], cap: int) -> int:
    index = bisect.bisect_left(buckets, value)
    return min(buckets[index], cap) if index < len(buckets) else cap


class SlotModel(ABC):
    """Prefill and decode over ``max_slots`` sequences of up to ``max_seq_len`` tokens, one cache slot each.

    The decode step reads its inputs from static device buffers (:attr:`tokens`, :attr:`positions`,
    :attr:`active`) and writes :attr:`logits`, so that it can be replayed as a CUDA graph. Subclasses own the
    weights (the LM head as ``lm_head``) and the KV cache (one slot per sequence plus a scratch slot, index
    ``max_slots``, for the padding rows of a prefill) and implement :meth:`_prefill_forward` and
    :meth:`_decode_forward`.
    """

    #: Whether each sequence comes with encoder input features: such a model's ``encode(slots, features)`` fills the
    #: slots' cross-attention cache before their prefill, and its ``features_problem(features)`` checks them.
    encoder_decoder = False
    #: Whether admission (encoding and prefill) runs on a stream of its own while decode steps go on (on a GPU).
    overlap_admission = False

    def __init__(
        self,
        *,
        device: torch.device,
        dtype: torch.dtype,
        vocab_size: int,
        max_slots: int,
        max_seq_len: int,
        cuda_graphs: bool,
        overlap_admission: bool | None = None,
    ):
        if overlap_admission is not None:  # else the class's
            self.overlap_admission = overlap_admission
        self.device = device
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        #: The token each slot feeds into the next decode step, and the position it is written at.
        self.tokens = torch.zeros(max_slots, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(max_slots, dtype=torch.long, device=self.device)
        #: 1 for slots holding a running sequence (only those advance their position).
        self.active = torch.zeros(max_slots, dtype=torch.long, device=self.device)
        self.logits = torch.zeros(max_slots, self.vocab_size, dtype=self.dtype, device=self.device)
        #: What the decode step's LM head writes: ``logits`` itself, unless a subclass pads its rows (Whisper).
        self._head_out = self.logits
        #: The vocabulary's columns ``(first, end)`` the decode step computes (see :meth:`decode`).
        self._columns = (0, self.vocab_size)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        #: Pad prefills to (rows, length) buckets; on by default with graphs, which replay padded prefills.
        self.pad_prefill = self.use_graphs
        self._graphs: dict[tuple[int, int, Hashable, tuple[int, int]], torch.cuda.CUDAGraph] = {}
        #: CUDA graphs captured so far (decode, prefill, sampling, encoder), for stats.
        self.captures = 0
        self._step_form: Hashable = None
        self._prefill_graphs: dict[tuple[int, int], tuple] = {}
        #: (memory pool, capture stream) of the decode steps' graphs and, where admission overlaps decoding, of
        #: admission's (prefill, encoder): graphs that run at the same time must share neither memory nor the
        #: cuBLAS workspace, which PyTorch keys by the capturing stream (a shared one hangs split-K GEMMs).
        homes = 1 + self.overlap_admission if self.use_graphs else 0
        self._graph_homes = [(torch.cuda.graph_pool_handle(), torch.cuda.Stream(self.device)) for _ in range(homes)]

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str,
        *,
        dtype: torch.dtype,
        device: str,
        max_slots: int,
        max_seq_len: int,
        cuda_graphs: bool,
        overlap_admission: bool | None = None,
    ) -> SlotModel:
        """Load a checkpoint folder with transformers and keep only the weights this forward pass uses (a
        subclass's constructor takes the transformers model first)."""
        loaded = cls._transformers_model(model_dir, dtype).to(device).eval()
        return cls(
            loaded,
            max_slots=max_slots,
            max_seq_len=max_seq_len,
            cuda_graphs=cuda_graphs,
            overlap_admission=overlap_admission,
        )

    @staticmethod
    @abstractmethod
    def _transformers_model(model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
        """The checkpoint as transformers loads it (on the CPU), whose weights this forward pass takes."""

    def buckets(self, batch: int, span: int) -> tuple[int, int]:
        """The (batch, span) bucket a decode step over ``batch`` slots attending to ``span`` positions runs in."""
        return _bucket(batch, BATCH_BUCKETS, self.max_slots), _bucket(span, SPAN_BUCKETS, self.max_seq_len)

    @abstractmethod
    def _prefill_forward(self, ids: torch.Tensor, slot_index: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        """Prefill right-padded ``ids [rows, length]`` into ``slot_index``; float32 logits at positions ``last``
        (``[rows, vocab]``), or at every position when ``last`` is None (``[rows, length, vocab]``)."""

    @abstractmethod
    def _decode_forward(self, batch: int, span: int) -> None:
        """One token for slots ``[0, batch)``: reads the static inputs, writes K/V and, last, the step's logits by
        :meth:`_write_logits`."""

    # --- prefill ------------------------------------------------------------------------------------------------

    def prefill(self, prompts: list[list[int]], slots: list[int]) -> torch.Tensor:
        """Run the prompts (one per slot) through the model, filling their slots' KV cache from position 0.

        :returns: float32 logits ``[len(prompts), vocab]`` of each prompt's last token.
        """
        return self.run_prefill(self.stage_prefill(prompts, slots))

    @torch.inference_mode()
    def stage_prefill(self, prompts: list[list[int]], slots: list[int]) -> PrefillInputs:
        """A prefill's inputs on the device (made before the work that reads them is queued on another stream).

        With :attr:`pad_prefill` (on with CUDA graphs), a small prefill is padded to a (rows, length) bucket and
        replayed as a CUDA graph; padding rows write their K/V into a scratch slot that no sequence owns.
        """
        count, longest = len(prompts), max(len(prompt) for prompt in prompts)
        bucket = self._prefill_bucket(count, longest) if self.pad_prefill else None
        rows, length = bucket or (count, longest)
        ids = torch.zeros(rows, length, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.as_tensor(prompt, dtype=torch.long)
        slot_index = torch.full((rows,), self.max_slots, dtype=torch.long)  # the scratch slot
        slot_index[:count] = torch.as_tensor(slots, dtype=torch.long)
        last = torch.zeros(rows, dtype=torch.long)
        last[:count] = torch.as_tensor([len(prompt) - 1 for prompt in prompts], dtype=torch.long)
        return PrefillInputs(
            *(to_device(tensor, self.device) for tensor in (ids, slot_index, last)), count, bucket is not None
        )

    @torch.inference_mode()
    def run_prefill(self, inputs: PrefillInputs) -> torch.Tensor:
        """Run a staged prefill; float32 logits ``[count, vocab]`` of each prompt's last token."""
        tensors = (inputs.ids, inputs.slot_index, inputs.last)
        if inputs.padded and self.use_graphs:
            try:
                graph, buffers, logits = self._prefill_graph(*inputs.ids.shape)
            except RuntimeError:
                self._give_up_graphs()
            else:
                for buffer, value in zip(buffers, tensors, strict=True):
                    buffer.copy_(value)
                graph.replay()
                # A copy: the graph's output buffer is the next replay's, and with admissions queued one behind the
                # other that replay can run before the generator has sampled from these logits.
                return logits[: inputs.count].clone()
        return self._prefill_forward(*tensors)[: inputs.count]

    def _prefill_bucket(self, count: int, longest: int) -> tuple[int, int] | None:
        rows = _bucket(count, BATCH_BUCKETS, self.max_slots)
        length = _bucket(longest, PREFILL_LENGTHS, self.max_seq_len)
        return (rows, length) if rows * length <= PREFILL_GRAPH_TOKENS else None

    def _prefill_graph(self, rows: int, length: int):
        """The CUDA graph of a (rows, length) prefill bucket, its static inputs and its logits output."""
        entry = self._prefill_graphs.get((rows, length))
        if entry is None:
            inputs = (
                torch.zeros(rows, length, dtype=torch.long, device=self.device),
                torch.full((rows,), self.max_slots, dtype=torch.long, device=self.device),  # warm-up: scratch only
                torch.zeros(rows, dtype=torch.long, device=self.device),
            )
            graph, logits = self.capture(lambda: self._prefill_forward(*inputs), admission=True)
            entry = self._prefill_graphs[(rows, length)] = (graph, inputs, logits)
        return entry

    def capture(self, forward, admission: bool = False):
        """Capture ``forward`` as a CUDA graph (after warm-up runs on the capturing stream, whose cuBLAS workspace
        it keeps) with the decode steps' graphs, or with admission's; returns (graph, its output)."""
        pool, capture_stream = self._graph_homes[admission and self.overlap_admission]
        capture_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(capture_stream):
            for _ in range(2):
                forward()
        torch.cuda.current_stream(self.device).wait_stream(capture_stream)
        # Not torch.cuda.graph(): it synchronises the device and empties the allocator's caches (the pinned host
        # memory's too) first, which stalls every running sequence when a bucket is first met mid-load (then each
        # freed block is allocated again, synchronising too). The capture is this thread's alone, from its own pool.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(capture_stream):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                output = forward()
            finally:
                graph.capture_end()
        self.captures += 1
        return graph, output

    @torch.inference_mode()
    def decode(self, batch: int, span: int, columns: tuple[int, int] | None = None) -> torch.Tensor:
        """Run one decode step in bucket ``(batch, span)`` (see :meth:`buckets`); returns ``logits[:batch]``, or
        with ``columns`` ``(first, end)`` only those columns of them, ``[batch, end - first]``: the LM head then
        reads only those rows of its weights (a request whose bias leaves a part of the vocabulary, as a speech
        model's does, need not pay for the rest)."""
        self._step_form = self._choose_step_form(batch)
        self._columns = columns or (0, self.vocab_size)
        if self.use_graphs:
            try:
                graph = self._graph(batch, span)
            except RuntimeError:
                self._give_up_graphs()
            else:
                graph.replay()
                return self._step_logits(batch)
        self._decode_forward(batch, span)
        return self._step_logits(batch)

    def _step_logits(self, batch: int) -> torch.Tensor:
        first, end = self._columns
        if (first, end) == (0, self.vocab_size):
            return self.logits[:batch]
        return self._head_out.view(-1)[: batch * (end - first)].view(batch, end - first)

    def _write_logits(self, h: torch.Tensor, batch: int) -> None:
        """The decode step's last operation: the LM head (``self.lm_head``, whose rows may be padded beyond the
        vocabulary) over the step's columns."""
        first, end = self._columns
        if (first, end) == (0, self.vocab_size):
            torch.mm(h, self.lm_head.t(), out=self._head_out[:batch])
        else:
            torch.mm(h, self.lm_head[first:end].t(), out=self._step_logits(batch))

    def _give_up_graphs(self) -> None:
        log.exception("CUDA graph capture failed: running eagerly from now on")
        self.use_graphs = False

    def _choose_step_form(self, batch: int) -> Hashable:
        """The form of a decode step over slots ``[0, batch)``, for a model whose step has more than one (read by
        its ``_decode_forward``; a CUDA graph is captured per bucket and form)."""
        return None

    def _graph(self, batch: int, span: int) -> torch.cuda.CUDAGraph:
        key = (batch, span, self._step_form, self._columns)
        graph = self._graphs.get(key)
        if graph is None:
            # Warm-up runs compute exactly the step about to be replayed, so their K/V writes are harmless.
            graph, _ = self.capture(lambda: self._decode_forward(batch, span))
            self._graphs[key] = graph
        return graph

    def _ids(self, values: list[int]) -> torch.Tensor:
        return to_device(values, self.device, torch.long)

    @torch.inference_mode()
    def start(self, slots: list[int], tokens: list[int], positions: list[int]) -> None:
        """Make slots running: each feeds ``tokens[i]`` at ``positions[i]`` in the next decode step."""
        index = self._ids(slots)
        self.tokens.index_copy_(0, index, self._ids(tokens))
        self.positions.index_copy_(0, index, self._ids(positions))
        self.active.index_fill_(0, index, 1)

    @torch.inference_mode()
    def feed(self, slots: list[int], tokens: list[int]) -> None:
        """After a decode step: feed ``tokens`` next instead of the tokens it chose (prompts fed a token a step)."""
        self.tokens.index_copy_(0, self._ids(slots), self._ids(tokens))

    @torch.inference_mode()
    def park(self, slots: list[int]) -> None:
        """Point slots being prefilled beside decode steps at the last position, where the steps' writes of their
        (unused) K/V cannot meet the prompt's."""
        self.positions.index_fill_(0, self._ids(slots), self.max_seq_len - 1)

    @torch.inference_mode()
    def stop(self, slots: list[int]) -> None:
        """Mark slots free: their positions stop advancing, from 0. A free slot below a running one still takes part
        in the steps, so it must read and write inside the cache: the generator runs one more step over a sequence
        after its last token before it frees the slot, and that step's advance can take a sequence that filled
        its room to ``max_seq_len``."""
        index = self._ids(slots)
        self.active.index_fill_(0, index, 0)
        self.positions.index_fill_(0, index, 0)

    @torch.inference_mode()
    def advance(self, batch: int, next_tokens: torch.Tensor) -> None:
        """After a decode step: feed ``next_tokens`` next, one position further on (running slots only)."""
        self.tokens[:batch].copy_(next_tokens)
        self.positions[:batch].add_(self.active[:batch])


class DecoderModel(SlotModel):
    """A Hugging Face causal LM (Qwen2/Qwen3/Llama/Mistral) over a static KV cache."""

    def __init__(
        self,
        causal_lm: torch.nn.Module,
        *,
        max_slots: int,
        max_seq_len: int,
        cuda_graphs: bool = True,
        overlap_admission: bool | None = None,
    ):
        super().__init__(
            device=causal_lm.lm_head.weight.device,
            dtype=causal_lm.lm_head.weight.dtype,
            vocab_size=causal_lm.lm_head.weight.shape[0],
            max_slots=max_slots,
            max_seq_len=max_seq_len,
            cuda_graphs=cuda_graphs,
            overlap_admission=overlap_admission,
        )
        config = causal_lm.config
        base = causal_lm.model
        attention = base.layers[0].self_attn
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = attention.head_dim
        self.scaling = attention.scaling
        self.eps = config.rms_norm_eps
        self.act = base.layers[0].mlp.act_fn
        #: SiLU-gated MLPs (every architecture served so far) take the fused kernel on a GPU.
        self._silu = getattr(config, "hidden_act", None) in ("silu", "swish")
        self.layers = [self._extract(layer) for layer in base.layers]
        self.embed = base.embed_tokens.weight.detach()
        self.final_norm = base.norm.weight.detach()
        #: The RMSNorm after each layer, fused with its last residual add: the next layer's first, the final one.
        self._next_norms = [layer.input_norm for layer in self.layers[1:]] + [self.final_norm]
        self.lm_head = causal_lm.lm_head.weight.detach()
        with torch.no_grad():
            positions = torch.arange(max_seq_len, device=self.device)[None]
            cos, sin = base.rotary_emb(self.embed[:1], positions)
        half = self.head_dim // 2
        self.cos = cos[0].to(self.dtype).contiguous()
        # rotate_half(x) * sin == roll(x, half) * [-sin_low, sin_high]
        self.sin_signed = torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1).to(self.dtype).contiguous()

        # One slot per sequence, plus a scratch slot (index max_slots) for the padding rows of a prefill.
        cache_shape = (len(self.layers), max_slots + 1, self.num_kv_heads, max_seq_len, self.head_dim)
        self.k_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)

    @staticmethod
    def _extract(layer: torch.nn.Module) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_weight, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up_weight, gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj])
        q_norm = getattr(attn, "q_norm", None)
        k_norm = getattr(attn, "k_norm", None)
        return _Layer(
            input_norm=layer.input_layernorm.weight.detach(),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            qkv_weight=qkv_weight,
            qkv_bias=qkv_bias,
            o_weight=attn.o_proj.weight.detach(),
            o_bias=_bias(attn.o_proj),
            q_norm=None if q_norm is None else q_norm.weight.detach(),
            k_norm=None if k_norm is None else k_norm.weight.detach(),
            gate_up_weight=gate_up_weight,
            gate_up_bias=gate_up_bias,
            down_weight=mlp.down_proj.weight.detach(),
            down_bias=_bias(mlp.down_proj),
        )

    @staticmethod
    def _transformers_model(model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)

    def weight_bytes(self) -> int:
        """Bytes of weights a decode step reads (every layer, the final norm and the LM head)."""
        tensors = [self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors.extend(value for value in vars(layer).values() if value is not None)
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    # --- layers -------------------------------------------------------------------------------------------------

    def _qkv(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        """``h [..., hidden]`` projected to q, k and v ``[..., heads + 2 * kv_heads, head_dim]``, q and k
        RMS-normalised per head where the model does so (Qwen3), not yet rotated."""
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = F.linear(h, layer.qkv_weight, layer.qkv_bias).unflatten(-1, (heads + 2 * kv_heads, self.head_dim))
        if layer.q_norm is None:
            return qkv
        q = F.rms_norm(qkv[..., :heads, :], (self.head_dim,), layer.q_norm, self.eps)
        k = F.rms_norm(qkv[..., heads : heads + kv_heads, :], (self.head_dim,), layer.k_norm, self.eps)
        return torch.cat((q, k, qkv[..., heads + kv_heads :, :]), -2)

    def _rope_qkv(self, layer: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Project ``h [..., hidden]`` to rotated q ``[..., H, d]``, rotated k and v ``[..., KV, d]``."""
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self._qkv(layer, h)
        qk, v = qkv[..., : heads + kv_heads, :], qkv[..., heads + kv_heads :, :]
        qk = rotate(qk, cos, sin)
        return qk[..., :heads, :], qk[..., heads:, :], v

    def _mlp(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        """The MLP's output for its normalised input ``h`` (the residual add is the caller's)."""
        gate_up = F.linear(h, layer.gate_up_weight, layer.gate_up_bias)
        if self._silu:
            gated = silu_mul(gate_up.flatten(0, -2)).view(*gate_up.shape[:-1], -1)
        else:
            gate, up = gate_up.chunk(2, -1)
            gated = self.act(gate) * up
        return F.linear(gated, layer.down_weight, layer.down_bias)

    @torch.inference_mode()
    def prompt_logits(self, prompt: list[int]) -> torch.Tensor:
        """float32 logits ``[len(prompt), vocab]`` at every prompt position (TRT-LLM's context logits), computed
        eagerly through the scratch slot, whose K/V no sequence reads."""
        ids = self._ids([prompt])
        scratch = torch.full((1,), self.max_slots, dtype=torch.long, device=self.device)
        return self._prefill_forward(ids, scratch, None)[0]

    def _prefill_forward(self, ids: torch.Tensor, slot_index: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        """Prefill right-padded ``ids [rows, length]`` into ``slot_index``; float32 logits at positions ``last``
        (``[rows, vocab]``), or at every position when ``last`` is None (``[rows, length, vocab]``)."""
        rows, length = ids.shape
        cos, sin = self.cos[:length, None, :], self.sin_signed[:length, None, :]
        x = F.embedding(ids, self.embed)
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, x.shape[-1:], layer.input_norm, self.eps)
            q, k, v = (t.transpose(1, 2) for t in self._rope_qkv(layer, h, cos, sin))
            self.k_cache[index, slot_index, :, :length] = k
            self.v_cache[index, slot_index, :, :length] = v
            # Right padding: a real query never attends past its own position, so causal masking suffices.
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling, enable_gqa=True)
            x = x + F.linear(out.transpose(1, 2).flatten(2), layer.o_weight, layer.o_bias)
            x = x + self._mlp(layer, F.rms_norm(x, x.shape[-1:], layer.post_norm, self.eps))
        if last is not None:
            x = x[torch.arange(rows, device=self.device), last]
        x = F.rms_norm(x, x.shape[-1:], self.final_norm, self.eps)
        return F.linear(x, self.lm_head).float()

    # --- decode -------------------------------------------------------------------------------------------------

    def _decode_forward(self, batch: int, span: int) -> None:
        """One token for slots ``[0, batch)``: reads the static inputs, writes K/V and the step's logits. The new
        queries and keys are rotated and the new K/V written by one kernel (:func:`rope_write_kv`), and each
        residual add is fused with the RMSNorm after it."""
        kv_heads, dim = self.num_kv_heads, self.head_dim
        groups = self.num_heads // kv_heads
        positions = self.positions[:batch]
        rope = (self.cos, self.sin_signed)
        keys = torch.arange(span, device=self.device)
        mask = torch.zeros(batch, span, dtype=self.dtype, device=self.device)
        mask.masked_fill_(keys[None, :] > positions[:, None], float("-inf"))
        mask = mask[:, None, None, :].expand(batch, kv_heads, groups, span).reshape(batch * kv_heads, groups, span)
        x = F.embedding(self.tokens[:batch], self.embed)
        h = F.rms_norm(x, x.shape[-1:], self.layers[0].input_norm, self.eps)
        for index, (layer, next_norm) in enumerate(zip(self.layers, self._next_norms, strict=True)):
            k_cache, v_cache = self.k_cache[index], self.v_cache[index]
            q = rope_write_kv(self._qkv(layer, h), k_cache, v_cache, positions, rope)
            q = q.reshape(batch * kv_heads, groups, dim)
            keys_view = k_cache[:batch, :, :span].flatten(0, 1)
            values_view = v_cache[:batch, :, :span].flatten(0, 1)
            scores = torch.baddbmm(mask, q, keys_view.transpose(1, 2), alpha=self.scaling)
            probs = torch.softmax(scores, -1)  # accumulates in float32 for half types
            out = torch.bmm(probs, values_view).view(batch, -1)
            x, h = add_rms_norm(x, F.linear(out, layer.o_weight, layer.o_bias), layer.post_norm, self.eps)
            x, h = add_rms_norm(x, self._mlp(layer, h), next_norm, self.eps)
        self._write_logits(h, batch)
