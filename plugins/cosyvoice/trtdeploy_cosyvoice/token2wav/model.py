"""The whole token2wav of one generation, loaded from an official checkpoint folder: ``<generation>.yaml`` for the
sizes, ``flow.pt`` and ``hift.pt`` for the weights.

:meth:`Token2Wav.mels` runs the flow over a batch of requests (speech tokens and a prompt each) and returns each
request's target mel; :meth:`Token2Wav.speech` (CosyVoice2) and :meth:`Token2Wav.causal_speech` (CosyVoice3) turn
mels into 24 kHz audio, offline or as one call of a stream. Nothing is kept per request between calls: CosyVoice2's
stream state travels in a :class:`~trtdeploy_cosyvoice.token2wav.hift.StreamCache` that the caller hands back, and
CosyVoice3's caller sends the whole mel so far each time.

Precision: the flow runs in the dtype asked for (its mel comes back in float32, as upstream casts it). The vocoder
stays in float32 whatever that dtype, as the official deployments run it, and CosyVoice3's F0 predictor holds and
computes in float64 (upstream converts that predictor to float64 before it runs).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

from trtdeploy import UsageError

from .. import FLOW_WEIGHTS, VOCODER_WEIGHTS
from ..generations import GenerationName
from ..model_yaml import TARGET, read_model_yaml
from ..prompt_mel import SAMPLE_RATE
from .cfm import CFMParams
from .conformer import UpsampleConformerEncoderConfig
from .conv_kernels import vocoder_kernels
from .dit import DiTEstimator, DiTEstimatorConfig
from .flow import CosyVoice2Flow, CosyVoice2FlowConfig, CosyVoice3Flow, CosyVoice3FlowConfig
from .hift import (
    STREAM_MEL_CACHE_FRAMES,
    CausalHiFTConfig,
    CausalHiFTGenerator,
    F0PredictorConfig,
    HiFTConfig,
    HiFTGenerator,
    StreamCache,
    gaussian_source_noise,
    stream_vocode,
)
from .unet import UNetEstimator, UNetEstimatorConfig

#: Rows per flow (and vocoder) batch unless :meth:`Token2Wav.load` is told otherwise.
DEFAULT_MAX_BATCH = 16
#: The prefix a hift.pt saved from the GAN trainer puts before every key.
_GAN_PREFIX = "generator."


@dataclass(frozen=True)
class Token2WavConfig:
    """The sizes of one generation's token2wav: what ``<generation>.yaml`` says about the flow, its estimator and
    the vocoder."""

    generation: GenerationName
    flow: CosyVoice2FlowConfig | CosyVoice3FlowConfig
    estimator: UNetEstimatorConfig | DiTEstimatorConfig
    hift: HiFTConfig | CausalHiFTConfig

    @classmethod
    def released(cls, generation: GenerationName) -> Token2WavConfig:
        """The released model's sizes."""
        if generation == "cosyvoice2":
            return cls(generation, CosyVoice2FlowConfig(), UNetEstimatorConfig(), HiFTConfig())
        return cls(generation, CosyVoice3FlowConfig(), DiTEstimatorConfig(), CausalHiFTConfig())

    @classmethod
    def from_yaml(cls, path: Path, generation: GenerationName) -> Token2WavConfig:
        """Read from the official yaml; an argument that would build a network other than ours is refused (UsageError
        naming it), one that does not shape inference (dropouts, training losses) is ignored."""
        return _YamlReader(Path(path), generation).config()

    def build(self) -> tuple[CosyVoice2Flow | CosyVoice3Flow, HiFTGenerator | CausalHiFTGenerator]:
        """The flow and the vocoder, freshly initialised."""
        return self.build_flow(), self.build_vocoder()

    def build_flow(self) -> CosyVoice2Flow | CosyVoice3Flow:
        if self.generation == "cosyvoice2":
            return CosyVoice2Flow(self.flow, UNetEstimator(self.estimator))
        return CosyVoice3Flow(self.flow, DiTEstimator(self.estimator))

    def build_vocoder(self) -> HiFTGenerator | CausalHiFTGenerator:
        return HiFTGenerator(self.hift) if self.generation == "cosyvoice2" else CausalHiFTGenerator(self.hift)


@dataclass(frozen=True, eq=False)
class FlowJob:
    """One request's flow input.

    :param tokens: speech tokens ``[T]`` (ids below 6561): while streaming, all received so far, the last 3 read ahead
        only unless the call finalizes.
    :param prompt_tokens: the prompt's speech tokens ``[P]``.
    :param prompt_mel: the prompt's mel ``[2P, 80]`` (``flow.match_prompt_lengths`` trims a prompt to that).
    :param embedding: the prompt's speaker embedding ``[192]``.
    :param token_offset: the first token whose frames to return (a streaming call returns its new frames only).
    """

    tokens: np.ndarray
    prompt_tokens: np.ndarray
    prompt_mel: np.ndarray
    embedding: np.ndarray
    token_offset: int = 0


class Token2Wav:
    """Speech tokens to 24 kHz audio for one generation; requests are batched (see the module's docstring)."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        config: Token2WavConfig,
        flow: CosyVoice2Flow | CosyVoice3Flow | None,
        vocoder: HiFTGenerator | CausalHiFTGenerator | None,
        *,
        device: str | torch.device = "cpu",
        max_batch: int = DEFAULT_MAX_BATCH,
    ):
        if max_batch < 1:
            raise UsageError(f"max_batch must be at least 1, not {max_batch}")
        self.config = config
        self._flow_module = flow
        self._vocoder_module = vocoder
        self._device = torch.device(device)
        self.max_batch = max_batch

    @property
    def flow(self) -> CosyVoice2Flow | CosyVoice3Flow:
        if self._flow_module is None:
            raise UsageError("this token2wav was loaded without its flow", hint="load it with parts including 'flow'")
        return self._flow_module

    @property
    def vocoder(self) -> HiFTGenerator | CausalHiFTGenerator:
        if self._vocoder_module is None:
            raise UsageError(
                "this token2wav was loaded without its vocoder", hint="load it with parts including 'vocoder'"
            )
        return self._vocoder_module

    @property
    def generation(self) -> GenerationName:
        return self.config.generation

    @property
    def device(self) -> torch.device:
        return self._device

    @classmethod
    def load(
        cls,
        checkpoint_dir: str | Path,
        generation: GenerationName,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch: int = DEFAULT_MAX_BATCH,
        parts: Collection[str] = ("flow", "vocoder"),
        cuda_graphs: bool = True,
        capture_modes: Collection[bool] = (),
    ) -> Token2Wav:
        """Build the generation's modules from ``<generation>.yaml`` and load ``flow.pt`` and ``hift.pt`` strictly
        (keys of ``hift.pt`` may carry the GAN trainer's ``generator.`` prefix); ``parts`` says which of the two
        (a server that runs only the vocoder need not hold the flow). The flow is moved to ``dtype``; the vocoder,
        its weight norm folded, stays float32 (CosyVoice3's F0 predictor float64). On a GPU the flow's solver runs
        as CUDA graphs (``cuda_graphs``), those of the streaming modes in ``capture_modes`` (False: offline, True:
        streaming) captured now rather than on first use."""
        if generation not in ("cosyvoice2", "cosyvoice3"):
            raise UsageError(f"unknown CosyVoice generation {generation!r}", hint="use cosyvoice2 or cosyvoice3")
        unknown = set(parts) - {"flow", "vocoder"}
        if unknown or not parts:
            raise UsageError(f"token2wav parts {sorted(parts)} are not some of 'flow' and 'vocoder'")
        folder = Path(checkpoint_dir)
        config = Token2WavConfig.from_yaml(folder / f"{generation}.yaml", generation)
        flow = vocoder = None
        if "flow" in parts:
            flow = config.build_flow()
            _load_weights(flow, folder / FLOW_WEIGHTS, _read_state(folder / FLOW_WEIGHTS))
            flow = flow.to(device=device, dtype=dtype).eval()
            if cuda_graphs and torch.device(device).type == "cuda":
                flow.solver = GraphedSolver(flow.decoder, max_batch=max_batch)
                with torch.inference_mode():
                    flow.solver.capture_all(
                        config.flow.output_size, streaming=capture_modes, dtype=dtype, device=torch.device(device)
                    )
        if "vocoder" in parts:
            vocoder = config.build_vocoder()
            vocoder_state = {
                key.removeprefix(_GAN_PREFIX): value for key, value in _read_state(folder / VOCODER_WEIGHTS).items()
            }
            _load_weights(vocoder, folder / VOCODER_WEIGHTS, vocoder_state)
            if isinstance(vocoder, CausalHiFTGenerator):
                # upstream computes this predictor's weight norm in float64 on every call: folded in float64, the
                # weights are the same to the bit (folded in float32, F0 differs by rounding its phase integrates)
                vocoder.f0_predictor.double()
            vocoder.fold_weight_norm()
            vocoder = vocoder.to(device=device).eval()
        return cls(config, flow, vocoder, device=device, max_batch=max_batch)

    # -- the flow ----------------------------------------------------------------------------------------------------

    def mels(self, jobs: Sequence[FlowJob], *, streaming: bool, finalize: bool) -> list[np.ndarray]:
        """Each job's target mel ``[80, frames]`` float32 from frame ``2 * token_offset`` on.

        :param streaming: chunk-causal attention (the calls of a stream but its last).
        :param finalize: False while a stream goes on: each job's last 3 tokens are lookahead only.
        :raises ValueError: a job's input is invalid (a token id out of range, a prompt mel not twice its tokens, ...).
        """
        for index, job in enumerate(jobs):
            self._check_job(index, job, finalize)
        mels: list[np.ndarray | None] = [None] * len(jobs)
        by_length = sorted(range(len(jobs)), key=lambda i: len(jobs[i].prompt_tokens) + len(jobs[i].tokens))
        for rows in _batches(by_length, self.max_batch):
            for row, mel in zip(rows, self._flow([jobs[row] for row in rows], streaming, finalize), strict=True):
                mels[row] = mel
        return mels

    def _flow(self, jobs: list[FlowJob], streaming: bool, finalize: bool) -> list[np.ndarray]:
        device, dtype = self.device, self.flow.input_embedding.weight.dtype

        def padded(arrays: list[np.ndarray], tensor_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
            tensors = [torch.as_tensor(array) for array in arrays]
            lengths = torch.tensor([len(tensor) for tensor in tensors], device=device)
            batch = nn.utils.rnn.pad_sequence(tensors, batch_first=True)
            return batch.to(device=device, dtype=tensor_dtype), lengths

        tokens, token_lengths = padded([job.tokens for job in jobs], torch.long)
        prompt_tokens, prompt_lengths = padded([job.prompt_tokens for job in jobs], torch.long)
        prompt_mels, prompt_mel_lengths = padded([job.prompt_mel for job in jobs], dtype)
        embeddings = torch.as_tensor(np.stack([job.embedding for job in jobs])).to(device=device, dtype=dtype)
        mels = self.flow.inference(
            tokens,
            token_lengths,
            prompt_tokens,
            prompt_lengths,
            prompt_mels,
            prompt_mel_lengths,
            embeddings,
            streaming=streaming,
            finalize=finalize,
        )
        ratio = self.flow.token_mel_ratio
        return [mel[:, job.token_offset * ratio :].cpu().numpy() for mel, job in zip(mels, jobs, strict=True)]

    def _check_job(self, index: int, job: FlowJob, finalize: bool) -> None:
        flow = self.config.flow
        for name in ("tokens", "prompt_tokens"):
            ids = np.asarray(getattr(job, name))
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"request {index}: {name} must be a 1-d integer array, not {ids.dtype} {ids.shape}")
            bad = ids[(ids < 0) | (ids >= flow.vocab_size)]
            if bad.size:
                raise ValueError(
                    f"request {index}: speech token {int(bad[0])} in {name} is outside 0..{flow.vocab_size - 1}"
                )
        prompt_mel, ratio = np.asarray(job.prompt_mel), self.flow.token_mel_ratio
        if prompt_mel.shape != (ratio * len(job.prompt_tokens), flow.output_size):
            raise ValueError(
                f"request {index}: the prompt mel {prompt_mel.shape} is not [{ratio} x {len(job.prompt_tokens)} prompt "
                f"tokens, {flow.output_size}]: trim the prompt with match_prompt_lengths"
            )
        if np.shape(job.embedding) != (flow.spk_embed_dim,):
            raise ValueError(
                f"request {index}: the speaker embedding is {np.shape(job.embedding)}, not [{flow.spk_embed_dim}]"
            )
        spoken = len(job.tokens) - (0 if finalize else flow.pre_lookahead_len)
        if not 0 <= job.token_offset <= max(spoken, 0):
            raise ValueError(
                f"request {index}: token_offset {job.token_offset} is outside 0..{max(spoken, 0)}, the tokens this "
                f"call speaks ({len(job.tokens)} sent{'' if finalize else ', the last 3 read ahead only'})"
            )

    # -- the vocoders ------------------------------------------------------------------------------------------------

    def speech(
        self,
        mels: Sequence[np.ndarray],
        caches: Sequence[StreamCache | None],
        *,
        finalize: bool,
        seeds: Sequence[int | None] | None = None,
    ) -> list[tuple[np.ndarray, StreamCache | None]]:
        """CosyVoice2's audio: each request's samples (float32) and the cache its next call needs.

        A request with no cache and ``finalize`` is offline: its whole audio, ``480 x frames`` samples. Otherwise it is
        one call of a stream (``mels[i]`` the new frames only): the cached frames are vocoded again in front of them,
        the start is cross-faded with the audio the cache held back, and, unless ``finalize``, the last 3840 samples
        are held back in the returned cache (on ``finalize`` the rest comes out and the cache is None).

        :param seeds: per request, the seed of its source noise (the same seed gives the same audio), or None for
            fresh noise from torch's random state, as upstream draws it. A stream that seeds every call should vary
            the seed from call to call: the same seed gives every chunk the same noise.
        :raises ValueError: a mel is not ``[80, frames]``, or too short for a call that is not final.
        """
        self._require("cosyvoice2", "speech")
        seeds = [None] * len(mels) if seeds is None else list(seeds)
        if not len(mels) == len(caches) == len(seeds):
            raise ValueError(
                f"{len(mels)} mels, {len(caches)} caches and {len(seeds)} seeds: give one of each a request"
            )
        tensors = [self._mel_tensor(index, mel) for index, mel in enumerate(mels)]
        # the frames each request vocodes: its new ones after the ones its cache brings back
        frames = [
            mel.shape[-1] + (0 if cache is None else STREAM_MEL_CACHE_FRAMES)
            for mel, cache in zip(tensors, caches, strict=True)
        ]
        for index, (count, mel, cache) in enumerate(zip(frames, tensors, caches, strict=True)):
            if count == 0:
                raise ValueError(f"request {index}: no mel frames to vocode")
            if cache is not None and cache.mel.shape[0] != mel.shape[0]:
                raise ValueError(f"request {index}: the cache's mel has {cache.mel.shape[0]} bins, not {mel.shape[0]}")
            if not finalize and count < STREAM_MEL_CACHE_FRAMES:
                raise ValueError(
                    f"request {index}: {count} mel frames are too few to continue a stream from: send at least "
                    f"{STREAM_MEL_CACHE_FRAMES} before the final call"
                )
        results: list[tuple[np.ndarray, StreamCache | None]] = []
        for rows in _batches(range(len(mels)), self.max_batch):
            row_caches = [None if caches[row] is None else _moved(caches[row], self.device) for row in rows]
            noise = self._source_noise([frames[row] for row in rows], [seeds[row] for row in rows])
            with torch.inference_mode(), vocoder_kernels(len(rows), finalize=finalize):
                answers = stream_vocode(
                    self.vocoder, [tensors[row] for row in rows], row_caches, [finalize] * len(rows), noise=noise
                )
            results += [(speech.cpu().numpy(), cache) for speech, cache in answers]
        return results

    def _source_noise(self, frames: list[int], seeds: list[int | None]) -> torch.Tensor:
        """``[B, max samples, 9]``: each row's Gaussian noise over its own samples, drawn as upstream draws it for one
        request (after the dead initial-phase draw), from the row's seed or torch's random state."""
        samples_per_frame, harmonics = self.vocoder.config.samples_per_frame, self.vocoder.config.nb_harmonics + 1
        noise = torch.zeros(len(frames), max(frames) * samples_per_frame, harmonics, device=self.device)
        for row, (count, seed) in enumerate(zip(frames, seeds, strict=True)):
            generator = None if seed is None else torch.Generator(device=self.device).manual_seed(int(seed))
            torch.rand(1, harmonics, generator=generator, device=self.device)
            samples = count * samples_per_frame
            noise[row, :samples] = gaussian_source_noise(
                1, samples, harmonics, generator=generator, device=self.device
            )[0]
        return noise

    def causal_speech(self, mels: Sequence[np.ndarray], *, finalize: bool) -> list[np.ndarray]:
        """CosyVoice3's audio for each request's whole mel so far ``[80, frames]``: ``480 x frames`` samples with
        ``finalize``, else ``480 x (frames - 8)``, a prefix of what the finalized call gives (the last 7 frames are
        read ahead only and the audio of the one before would still change). The caller sends only the samples it
        has not sent yet.

        :raises ValueError: a mel is not ``[80, frames]``, or has fewer than 8 frames on a call that is not final.
        """
        self._require("cosyvoice3", "causal_speech")
        vocoder = self.vocoder
        least = 1 if finalize else vocoder.f0_predictor.lookahead + vocoder.config.conv_pre_look_right + 1
        tensors = [self._mel_tensor(index, mel) for index, mel in enumerate(mels)]
        for index, mel in enumerate(tensors):
            if mel.shape[-1] < least:
                raise ValueError(
                    f"request {index}: a mel of {mel.shape[-1]} frames is too short for finalize={finalize}: send at "
                    f"least {least}"
                )
        audio: list[np.ndarray] = []
        for rows in _batches(range(len(tensors)), self.max_batch):
            lengths = torch.tensor([tensors[row].shape[-1] for row in rows], device=self.device)
            batch = nn.utils.rnn.pad_sequence([tensors[row].T for row in rows], batch_first=True).transpose(1, 2)
            with torch.inference_mode(), vocoder_kernels(len(rows), finalize=finalize):
                out = vocoder(batch, lengths, finalize=finalize)
            audio += [out.speech[row, : int(length)].cpu().numpy() for row, length in enumerate(out.lengths)]
        return audio

    def _mel_tensor(self, index: int, mel: np.ndarray) -> torch.Tensor:
        bins = self.vocoder.config.in_channels
        if np.ndim(mel) != 2 or np.shape(mel)[0] != bins:
            raise ValueError(f"request {index}: the mel is {np.shape(mel)}, not [{bins}, frames]")
        return torch.as_tensor(np.asarray(mel, dtype=np.float32), device=self.device)

    def _require(self, generation: GenerationName, method: str) -> None:
        if self.generation != generation:
            other = "causal_speech" if method == "speech" else "speech"
            raise UsageError(
                f"{method}() is {generation}'s vocoder, and this token2wav is {self.generation}'s",
                hint=f"call {other}() for {self.generation}",
            )


class GraphedSolver:
    """The flow's solver (10 estimator steps, each a few hundred kernels) replayed as a CUDA graph per (batch,
    frames, streaming) bucket: eagerly, a short request costs as much in launches as a long one.

    A call's rows are right-padded to the bucket's frames (the padding is masked: each row's frames are what they
    are alone) and its batch to the bucket's rows with copies of its first row. The frame buckets grow by 1.5x and
    2x in turn (128, 192, 256, 384, ...): few buckets, so that :meth:`capture_all` can capture them all before the
    first request (a capture costs an eager run). Graphs not captured beforehand are captured on first use; all
    share one memory pool (calls are replayed one at a time). Requests longer than ``max_frames`` run eagerly.
    """

    def __init__(self, solver: nn.Module, *, max_batch: int, max_frames: int = 2048, smallest: int = 128):
        self.solver, self.max_batch, self.max_frames = solver, max_batch, max_frames
        sizes = {size for base in (smallest, smallest * 3 // 2) for size in _doublings(base, max_frames)}
        self.frame_buckets = sorted(sizes | {max_frames})
        #: Rows of a call padded to a power of two, at most ``max_batch``.
        self.batch_buckets = sorted({min(1 << power, max_batch) for power in range(max_batch.bit_length() + 1)})
        self._graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()

    def __call__(
        self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor, *, streaming: bool
    ) -> torch.Tensor:
        batch, _, frames = mu.shape
        if frames > self.max_frames or batch > self.max_batch:
            return self.solver(mu, mask, spks, cond, streaming=streaming)
        rows = self.batch_buckets[bisect.bisect_left(self.batch_buckets, batch)]
        key = (rows, self.frame_buckets[bisect.bisect_left(self.frame_buckets, frames)], streaming)
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key, like=(mu, mask, spks, cond))
        graph, inputs, output = self._graphs[key]
        for static, value in zip(inputs, (mu, mask, spks, cond), strict=True):
            static.zero_()
            static[:batch, ..., : value.shape[-1] if value.dim() == 3 else None].copy_(value)
            static[batch:] = static[:1]
        graph.replay()
        return output[:batch, :, :frames].clone()

    def capture_all(
        self, mel_bins: int, *, streaming: Collection[bool], dtype: torch.dtype, device: torch.device
    ) -> None:
        """Capture the graph of every bucket (every batch bucket, every frame bucket) for each of the
        ``streaming`` modes."""
        like = (
            torch.zeros(1, mel_bins, 1, dtype=dtype, device=device),
            torch.zeros(1, 1, 1, dtype=dtype, device=device),
            torch.zeros(1, mel_bins, dtype=dtype, device=device),
            torch.zeros(1, mel_bins, 1, dtype=dtype, device=device),
        )
        for key in (
            (rows, frames, mode) for mode in streaming for rows in self.batch_buckets for frames in self.frame_buckets
        ):
            if key not in self._graphs:
                self._graphs[key] = self._capture(*key, like=like)

    def _capture(
        self, rows: int, frames: int, streaming: bool, *, like: tuple[torch.Tensor, ...]
    ) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor]:
        mu, mask, spks, cond = like
        inputs = [
            torch.zeros(rows, mu.shape[1], frames, dtype=mu.dtype, device=mu.device),
            torch.zeros(rows, 1, frames, dtype=mask.dtype, device=mask.device),
            torch.zeros(rows, spks.shape[1], dtype=spks.dtype, device=spks.device),
            torch.zeros(rows, cond.shape[1], frames, dtype=cond.dtype, device=cond.device),
        ]
        inputs[1][:, :, :1] = 1  # a valid frame in every row: the warm-up run sees no fully masked row
        side = torch.cuda.Stream(mu.device)
        side.wait_stream(torch.cuda.current_stream(mu.device))
        with torch.cuda.stream(side):  # warm-up: cuBLAS/cuDNN choose their kernels outside the capture
            self.solver(*inputs, streaming=streaming)
        torch.cuda.current_stream(mu.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = self.solver(*inputs, streaming=streaming)
        return graph, inputs, output


def _doublings(start: int, limit: int) -> Iterator[int]:
    while start <= limit:
        yield start
        start *= 2


def _batches(rows: Iterable[int], size: int) -> Iterator[list[int]]:
    rows = list(rows)
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _moved(cache: StreamCache, device: torch.device) -> StreamCache:
    return StreamCache(mel=cache.mel.to(device), source=cache.source.to(device), speech=cache.speech.to(device))


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"{path} is missing", hint="download the whole checkpoint folder") from None
    except Exception as exc:  # torch raises many kinds for a damaged file (RuntimeError, UnpicklingError, EOFError)
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot read {path}: {first_line}", hint="download the checkpoint again") from None
    if not isinstance(state, Mapping) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise UsageError(f"{path} is not a state dict of tensors", hint="download the checkpoint again")
    return dict(state)


def _load_weights(module: nn.Module, path: Path, state: Mapping[str, torch.Tensor]) -> None:
    """``module.load_state_dict(state)``, strictly, or a UsageError naming the file and the first keys that differ."""

    def named(keys: Sequence[str]) -> str:
        return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")

    hint = "does the yaml beside it belong to these weights? download the checkpoint again"
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches, even when not strict
        detail = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), str(exc))
        raise UsageError(f"{path} does not fit the yaml's sizes: {detail}", hint=hint) from None
    problems = []
    if result.missing_keys:
        problems.append(f"lacks {named(result.missing_keys)}")
    if result.unexpected_keys:
        problems.append(f"has unexpected {named(result.unexpected_keys)}")
    if problems:
        raise UsageError(f"{path} {' and '.join(problems)}", hint=hint)


# -- the yaml --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Constructor:
    """How the arguments of one upstream class in the yaml map onto one of our configs."""

    target: str
    #: Arguments to be given: upstream has no default for them, or one other than our config's.
    required: frozenset[str] = frozenset()
    #: Arguments that do not change inference (dropouts, training settings, values only stored).
    ignored: frozenset[str] = frozenset()
    #: Arguments implemented at one value only: name -> (that value, upstream's default where the yaml omits it).
    fixed: Mapping[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)


_NO_DEFAULT = object()
_ENCODER = _Constructor(
    "cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder",
    required=frozenset({"input_size", "output_size", "attention_heads", "static_chunk_size"}),
    ignored=frozenset(
        {
            "dropout_rate",
            "positional_dropout_rate",
            "attention_dropout_rate",
            "use_dynamic_chunk",
            "use_dynamic_left_chunk",
            "gradient_checkpointing",
            "positionwise_conv_kernel_size",
            # the convolution module's, which is off (use_cnn_module)
            "cnn_module_kernel",
            "cnn_module_norm",
            "causal",
        }
    ),
    fixed=MappingProxyType(
        {
            "input_layer": ("linear", "conv2d"),
            "pos_enc_layer_type": ("rel_pos_espnet", "rel_pos"),
            "selfattention_layer_type": ("rel_selfattn", "rel_selfattn"),
            "normalize_before": (True, True),
            "macaron_style": (False, True),
            "use_cnn_module": (False, True),
            "activation_type": ("swish", "swish"),
            "key_bias": (True, True),
            "global_cmvn": (None, None),
        }
    ),
)
_FLOW_IGNORED = frozenset({"output_type", "input_frame_rate", "only_mask_loss", "decoder_conf"})
_FLOWS = {
    "cosyvoice2": _Constructor(
        "cosyvoice.flow.flow.CausalMaskedDiffWithXvec",
        required=frozenset({"vocab_size"}),
        ignored=_FLOW_IGNORED,
        # the conformer upsamples x2 in code, whatever this says
        fixed=MappingProxyType({"token_mel_ratio": (2, 2)}),
    ),
    "cosyvoice3": _Constructor(
        "cosyvoice.flow.flow.CausalMaskedDiffWithDiT",
        required=frozenset({"vocab_size", "input_size"}),
        ignored=_FLOW_IGNORED,
    ),
}
_LOOKAHEAD = _Constructor(
    "cosyvoice.transformer.upsample_encoder.PreLookaheadLayer",
    required=frozenset({"in_channels", "channels", "pre_lookahead_len"}),
)
_CFM = _Constructor(
    "cosyvoice.flow.flow_matching.CausalConditionalCFM",
    # sizes upstream stores without building anything from them
    ignored=frozenset({"in_channels", "n_spks", "spk_emb_dim"}),
)
_CFM_PARAMS = _Constructor(
    "omegaconf.DictConfig",
    required=frozenset({"inference_cfg_rate"}),
    # the solver is Euler whatever it says; the rest is training's
    ignored=frozenset({"solver", "sigma_min", "training_cfg_rate", "reg_loss_type"}),
    fixed=MappingProxyType({"t_scheduler": ("cosine", _NO_DEFAULT)}),
)
_ESTIMATORS = {
    "cosyvoice2": _Constructor(
        "cosyvoice.flow.decoder.CausalConditionalDecoder",
        required=frozenset(
            {"in_channels", "out_channels", "channels", "n_blocks", "num_mid_blocks", "num_heads", "act_fn"}
        ),
    ),
    "cosyvoice3": _Constructor(
        "cosyvoice.flow.DiT.dit.DiT",
        # upstream's spk_dim default (None) means no speaker input, which the released model has
        required=frozenset({"dim", "depth", "heads", "ff_mult", "spk_dim"}),
        fixed=MappingProxyType({"long_skip_connection": (False, False)}),
    ),
}
_HIFT_REQUIRED = frozenset(
    {
        "sampling_rate",
        "upsample_rates",
        "upsample_kernel_sizes",
        "source_resblock_kernel_sizes",
        "source_resblock_dilation_sizes",
    }
)
_HIFTS = {
    "cosyvoice2": _Constructor("cosyvoice.hifigan.generator.HiFTGenerator", required=_HIFT_REQUIRED),
    "cosyvoice3": _Constructor("cosyvoice.hifigan.generator.CausalHiFTGenerator", required=_HIFT_REQUIRED),
}
_F0_PREDICTORS = {
    "cosyvoice2": _Constructor("cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor"),
    "cosyvoice3": _Constructor("cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor"),
}


def _upstream_fields(config_class: type) -> set[str]:
    """A flow config's fields that are arguments of upstream's flow class (not the parts read from other sections)."""
    return {field.name for field in dataclasses.fields(config_class)} - {
        "encoder",
        "cfm_params",
        "pre_lookahead_channels",
    }


class _YamlReader:
    """Maps the yaml's ``flow`` and ``hift`` sections onto our configs, naming the file and the key it refuses."""

    def __init__(self, path: Path, generation: GenerationName):
        self.path = path
        self.generation = generation
        self.document = read_model_yaml(path)

    def config(self) -> Token2WavConfig:
        v2 = self.generation == "cosyvoice2"
        flow = self._node(self.document.get("flow"), "flow")
        decoder = self._node(flow.get("decoder"), "flow.decoder")
        self._arguments(decoder, "flow.decoder", _CFM, (), nested=("cfm_params", "estimator"))  # nothing of its own
        cfm_params = self._cfm_params(decoder.get("cfm_params"))
        estimator_node = self._node(decoder.get("estimator"), "flow.decoder.estimator")
        if v2:
            estimator = self._build(
                UNetEstimatorConfig,
                self._arguments(
                    estimator_node, "flow.decoder.estimator", _ESTIMATORS[self.generation], UNetEstimatorConfig
                ),
                "flow.decoder.estimator",
            )
            encoder_node = self._node(flow.get("encoder"), "flow.encoder")
            encoder = self._build(
                UpsampleConformerEncoderConfig,
                self._arguments(encoder_node, "flow.encoder", _ENCODER, UpsampleConformerEncoderConfig),
                "flow.encoder",
            )
            flow_arguments = self._arguments(
                flow,
                "flow",
                _FLOWS[self.generation],
                _upstream_fields(CosyVoice2FlowConfig),
                nested=("encoder", "decoder"),
            )
            flow_config = self._build(
                CosyVoice2FlowConfig, {**flow_arguments, "encoder": encoder, "cfm_params": cfm_params}, "flow"
            )
            mel_width = estimator.out_channels
        else:
            estimator_arguments = self._arguments(
                estimator_node, "flow.decoder.estimator", _ESTIMATORS[self.generation], DiTEstimatorConfig
            )
            # upstream's default for these is the mel's width
            mel_dim = estimator_arguments.get("mel_dim", DiTEstimatorConfig.mel_dim)
            for name in ("mu_dim", "out_channels"):
                if estimator_arguments.get(name) is None:
                    estimator_arguments[name] = mel_dim
            estimator = self._build(DiTEstimatorConfig, estimator_arguments, "flow.decoder.estimator")
            flow_arguments = self._arguments(
                flow,
                "flow",
                _FLOWS[self.generation],
                _upstream_fields(CosyVoice3FlowConfig),
                nested=("pre_lookahead_layer", "decoder"),
            )
            lookahead = self._arguments(
                self._node(flow.get("pre_lookahead_layer"), "flow.pre_lookahead_layer"),
                "flow.pre_lookahead_layer",
                _LOOKAHEAD,
                ("in_channels", "channels", "pre_lookahead_len"),
            )
            flow_config = self._build(
                CosyVoice3FlowConfig,
                {**flow_arguments, "pre_lookahead_channels": lookahead["channels"], "cfm_params": cfm_params},
                "flow",
            )
            for name, flow_name in (("in_channels", "input_size"), ("pre_lookahead_len", "pre_lookahead_len")):
                if lookahead[name] != getattr(flow_config, flow_name):
                    self._refuse(
                        f"flow.pre_lookahead_layer.{name} is {lookahead[name]} and flow.{flow_name} "
                        f"{getattr(flow_config, flow_name)}",
                        "set them equal, as the released yaml does",
                    )
            mel_width = estimator.mel_dim
        hift = self._hift()
        for name, width in (("flow.decoder.estimator", mel_width), ("hift", hift.in_channels)):
            if width != flow_config.output_size:
                self._refuse(
                    f"{name} works on {width} mel bins and flow.output_size is {flow_config.output_size}",
                    "give every part the same mel width (80)",
                )
        return Token2WavConfig(self.generation, flow_config, estimator, hift)

    def _cfm_params(self, node: Any) -> CFMParams:
        where = "flow.decoder.cfm_params"
        node = self._node(node, where)
        content = node.get("content")
        if not isinstance(content, dict):
            self._refuse(f"{where} has no content mapping", "write it as the released yaml does")
        arguments = self._arguments({TARGET: node[TARGET], **content}, where, _CFM_PARAMS, ("inference_cfg_rate",))
        return self._build(CFMParams, arguments, where)

    def _hift(self) -> HiFTConfig | CausalHiFTConfig:
        node = self._node(self.document.get("hift"), "hift")
        config_class = HiFTConfig if self.generation == "cosyvoice2" else CausalHiFTConfig
        f0_node = self._node(node.get("f0_predictor"), "hift.f0_predictor")
        f0 = self._build(
            F0PredictorConfig,
            self._arguments(f0_node, "hift.f0_predictor", _F0_PREDICTORS[self.generation], F0PredictorConfig),
            "hift.f0_predictor",
        )
        arguments = self._arguments(node, "hift", _HIFTS[self.generation], config_class, nested=("f0_predictor",))
        return self._build(config_class, {**arguments, "f0_predictor": f0}, "hift")

    def _node(self, node: Any, where: str) -> dict[str, Any]:
        if not isinstance(node, dict) or TARGET not in node:
            self._refuse(f"has no {where} section", "pass the yaml shipped with the checkpoint")
        return node

    def _arguments(
        self,
        node: dict[str, Any],
        where: str,
        constructor: _Constructor,
        fields: type | Iterable[str],
        *,
        nested: Iterable[str] = (),
    ) -> dict[str, Any]:
        """The arguments of ``node`` that our config takes (``fields``: a dataclass or names), the others checked."""
        if node[TARGET] != constructor.target:
            self._refuse(
                f"{where} builds {node[TARGET]}, not {constructor.target}",
                f"this plugin implements {self.generation}'s classes only: pass the yaml shipped with the checkpoint",
            )
        names = {field.name for field in dataclasses.fields(fields)} if isinstance(fields, type) else set(fields)
        names -= set(nested)
        nested = set(nested)
        arguments = {}
        for key, value in node.items():
            if key == TARGET or key in nested or key in constructor.ignored:
                continue
            if key in constructor.fixed:
                continue
            if key not in names:
                self._refuse(f"{where}.{key} is an argument this plugin does not know", "remove it, or ask for it")
            arguments[key] = value
        for key, (supported, default) in constructor.fixed.items():
            value = node.get(key, default)
            if value is _NO_DEFAULT:
                self._refuse(f"{where} has no {key}", f"set it to {supported!r}, as the released yaml does")
            if value != supported:
                given = f"is {value!r}" if key in node else f"is not given, and upstream's default is {value!r}"
                self._refuse(f"{where}.{key} {given}; only {supported!r} is implemented", f"set {key}: {supported!r}")
        missing = sorted(constructor.required - set(node))
        if missing:
            self._refuse(
                f"{where} has no {missing[0]} (upstream has no default, or another than the released model's)",
                "pass the yaml shipped with the checkpoint",
            )
        return arguments

    def _build(self, config_class: Callable[..., Any], arguments: dict[str, Any], where: str) -> Any:
        try:
            return config_class(**arguments)
        except UsageError as exc:
            raise UsageError(f"{self.path}: {where}: {exc.message}", hint=exc.hint) from None
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{self.path}: {where}: {exc}", hint="pass the yaml shipped with the checkpoint") from None

    def _refuse(self, problem: str, hint: str) -> None:
        raise UsageError(f"{self.path}: {problem}", hint=hint)
