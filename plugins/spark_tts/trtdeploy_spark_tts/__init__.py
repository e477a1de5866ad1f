"""trtdeploy plugin for Spark-TTS (SparkAudio/Spark-TTS-0.5B): voice-cloning speech synthesis on Triton.

The deployment: ``audio_tokenizer`` (BiCodec + wav2vec2: reference audio → tokens), ``tensorrt_llm`` (the Qwen2
LLM in ``LLM/``, served by whichever engine the build chose), ``vocoder`` (BiCodec decoder: tokens → 16 kHz audio),
and the BLS entry ``spark_tts``. A streaming deployment adds ``spark_tts_offline``, the same model answering in one
piece, on the same LLM and vocoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trtdeploy
from trtdeploy import BuildContext, Deployment, Mode, ModelSpec, UsageError

from .prompt import GLOBAL_TOKENS, SAMPLE_RATE, TOKENS_PER_SECOND
from .streaming import STREAM_FORMATS

if TYPE_CHECKING:
    from trtdeploy import ModelInfo, TTSWorkload

__version__ = "0.1.0"

#: Files of the official checkpoint layout this plugin reads.
REQUIRED_FILES = (
    "config.yaml",
    "BiCodec/config.yaml",
    "BiCodec/model.safetensors",
    "wav2vec2-large-xlsr-53/config.json",
    "wav2vec2-large-xlsr-53/preprocessor_config.json",
    "LLM/config.json",
    "LLM/tokenizer_config.json",
)
#: Prompt tokens kept for the reference and target texts when deriving the longest reference audio accepted.
TEXT_TOKEN_ALLOWANCE = 256


@dataclass(frozen=True)
class SparkOptions:
    """Settings of a spark_tts deployment (``trtdeploy build spark_tts -o KEY=VALUE``); requests may override the
    sampling settings and the token cap."""

    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.0
    #: Most semantic tokens generated per request (50 per second of audio); 0: the build's --max-output-len.
    max_new_tokens: int = 0
    #: Longest reference audio accepted; 0: as much as --max-input-len leaves room for (at most 30 s).
    max_reference_seconds: float = 0.0
    #: Streaming: audio in the first chunk, growth factor of the following chunks, and their largest size.
    chunk_seconds: float = 0.5
    chunk_growth: float = 4.0
    max_chunk_seconds: float = 30.0
    #: Streaming: audio cross-faded between consecutive chunks (the official client's --chunk-overlap-duration).
    chunk_overlap_seconds: float = 0.1
    #: Streaming: "overlapped" (the official wire format: chunks overlap by chunk_overlap_seconds, which the client
    #: cross-fades) or "finished" (chunks that play one after another); requests may choose with ``stream_format``.
    stream_format: str = "overlapped"
    #: Streaming: tokens before a chunk re-read by the vocoder; -1: the vocoder's receptive radius.
    vocoder_context_tokens: int = -1
    #: Streaming: tokens at the end of each chunk held back for the next vocoder call, which sees their future; -1:
    #: the receptive radius (the stream is then the offline audio exactly, that many tokens later); 0: cross-fade.
    vocoder_lookahead_tokens: int = 0
    #: Instances of the BLS entry (each serves one request at a time); 0: --max-batch-size.
    bls_instances: int = 0
    tokenizer_instances: int = 1
    vocoder_instances: int = 1

    def __post_init__(self) -> None:
        checks = {
            "temperature": self.temperature >= 0,
            "top_k": self.top_k >= 0,
            "top_p": 0 <= self.top_p <= 1,
            "repetition_penalty": self.repetition_penalty > 0,
            "max_new_tokens": self.max_new_tokens >= 0,
            "max_reference_seconds": self.max_reference_seconds >= 0,
            "chunk_seconds": self.chunk_seconds * TOKENS_PER_SECOND >= 1,
            "chunk_growth": self.chunk_growth >= 1,
            "max_chunk_seconds": self.max_chunk_seconds >= self.chunk_seconds,
            "chunk_overlap_seconds": 0 <= 2 * self.chunk_overlap_seconds <= self.chunk_seconds,
            "stream_format": self.stream_format in STREAM_FORMATS,
            "vocoder_context_tokens": self.vocoder_context_tokens >= -1,
            "vocoder_lookahead_tokens": self.vocoder_lookahead_tokens >= -1,
            "bls_instances": self.bls_instances >= 0,
            "tokenizer_instances": self.tokenizer_instances >= 1,
            "vocoder_instances": self.vocoder_instances >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"-o {bad[0]}={getattr(self, bad[0])} is out of range (see the plugin's README)")
        overlap_tokens = self.chunk_overlap_seconds * TOKENS_PER_SECOND
        if abs(overlap_tokens - round(overlap_tokens)) > 1e-6:
            # the overlap the server holds back (in tokens) and the one official clients cut (in samples) must match
            raise ValueError(
                f"-o chunk_overlap_seconds={self.chunk_overlap_seconds:g} is not a whole number of semantic tokens "
                f"(1/{TOKENS_PER_SECOND} s each): use e.g. {round(overlap_tokens) / TOKENS_PER_SECOND:g}"
            )
        if self.stream_format == "overlapped" and not self.chunk_overlap_seconds:
            raise ValueError(
                "-o stream_format=overlapped needs chunk_overlap_seconds > 0 (official clients cross-fade that much "
                "of each chunk): set -o chunk_overlap_seconds=0.1, or -o stream_format=finished"
            )


class SparkTTS(ModelSpec):
    name = "spark_tts"
    description = "Spark-TTS-0.5B voice cloning: BiCodec + Qwen2 LLM, offline and streaming (16 kHz)"
    default_repo = "SparkAudio/Spark-TTS-0.5B"
    llm_subfolder = "LLM"
    templates_dir = Path(__file__).parent / "templates"
    #: 30 s of reference audio (1,500 semantic tokens) with the texts fits 2,048; 3,000 tokens are 60 s of speech
    #: (the official deployment caps at 512, which cuts speech at about 10 s).
    default_max_input_len = 2048
    default_max_output_len = 3000
    Options = SparkOptions
    #: The BLS asks the LLM for one chunk's tokens at a time (non-decoupled calls) instead of reading a token stream:
    #: python-backend BLS models reading a decoupled model's stream crash under concurrent load (see the README).
    llm_streams = False

    def validate_checkpoint(self, checkpoint_dir: Path) -> None:
        missing = [name for name in REQUIRED_FILES if not (checkpoint_dir / name).is_file()]
        if missing:
            raise UsageError(
                f"{checkpoint_dir} is not a Spark-TTS checkpoint (missing {', '.join(missing)})",
                hint="pass the folder downloaded from SparkAudio/Spark-TTS-0.5B (config.yaml, BiCodec/, LLM/, "
                "wav2vec2-large-xlsr-53/)",
            )
        if not any((checkpoint_dir / "LLM").glob("*.safetensors")):
            raise UsageError(f"{checkpoint_dir / 'LLM'} holds no *.safetensors weights")
        wav2vec2 = checkpoint_dir / "wav2vec2-large-xlsr-53"
        if not any(wav2vec2.glob(pattern) for pattern in ("*.safetensors", "pytorch_model.bin")):
            raise UsageError(f"{wav2vec2} holds no weights (pytorch_model.bin or *.safetensors)")
        tokenizer = checkpoint_dir / "LLM" / "tokenizer.json"
        if tokenizer.is_file() and "<|bicodec_semantic_0|>" not in tokenizer.read_text(encoding="utf-8"):
            raise UsageError(f"{tokenizer} has no Spark-TTS tokens (<|bicodec_semantic_N|>): is LLM/ Spark-TTS's?")

    def write_random_checkpoint(self, dest: Path, *, seed: int = 0) -> None:
        from .checkpoint import write_random_checkpoint

        write_random_checkpoint(dest, seed=seed)

    def entry_model(self, mode: Mode) -> str:
        return "spark_tts"

    def offline_model(self, mode: Mode) -> str | None:
        return "spark_tts_offline" if mode == "streaming" else None

    def triton_models(self, mode: Mode) -> tuple[str, ...]:
        models = ("audio_tokenizer", "spark_tts", "vocoder")
        offline = self.offline_model(mode)
        return (*models, offline) if offline else models

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        options = dict(ctx.options)
        point = ctx.point
        room = (point.max_input_len - GLOBAL_TOKENS - TEXT_TOKEN_ALLOWANCE) / TOKENS_PER_SECOND
        if room <= 0:
            raise UsageError(
                f"--max-input-len {point.max_input_len} leaves no room for reference audio",
                hint="Spark-TTS prompts hold 50 tokens per second of reference audio: build with at least 1024",
            )
        asked = options["max_reference_seconds"]
        if asked > room:
            raise UsageError(
                f"-o max_reference_seconds={asked:g} does not fit --max-input-len {point.max_input_len} "
                f"(room for {room:.1f} s of reference audio at {TOKENS_PER_SECOND} tokens/s)",
                hint="lower it, or build with a larger --max-input-len",
            )
        options["max_reference_seconds"] = round(asked or min(30.0, room), 2)
        if options["max_new_tokens"] > point.max_output_len:
            raise UsageError(
                f"-o max_new_tokens={options['max_new_tokens']} is more than --max-output-len {point.max_output_len}"
            )
        options["max_new_tokens"] = options["max_new_tokens"] or point.max_output_len
        options["bls_instances"] = options["bls_instances"] or point.max_batch_size
        _check_lookahead(options, ctx.checkpoint_dir / "BiCodec" / "config.yaml")
        return options

    def notes(self, ctx: BuildContext) -> list[str]:
        """How this deployment departs from the official runtime/triton_trtllm recipe (run.sh and its configs)."""
        options = self.template_context(ctx)
        point = ctx.point
        lines = [
            f"output cap {options['max_new_tokens']} tokens ({options['max_new_tokens'] / TOKENS_PER_SECOND:g} s of "
            "speech), settable per request: the official BLS asks for 512 tokens and cuts speech at about 10 s",
            f"the LLM takes prompts of up to {ctx.llm_max_input_len} tokens, room for "
            f"{options['max_reference_seconds']:g} s of reference audio: the official engine keeps trtllm-build's "
            "default max_input_len 1024 (about 19 s of reference, less its text)",
            f"{options['bls_instances']} spark_tts instances, one request each (official: 4 sharing threads)",
        ]
        eos_note = _end_token_note(ctx.llm_dir)
        if eos_note:
            lines.append(eos_note)
        if point.mode == "streaming":
            lines.append(
                f"streamed audio goes out {options['stream_format']} by default"
                + (
                    f" (the official wire format: each chunk repeats the last {options['chunk_overlap_seconds']:g} s "
                    "of the chunk before, which official clients cross-fade; pass the same --chunk-overlap-duration)"
                    if options["stream_format"] == "overlapped"
                    else " (chunks that play one after another; the official client needs stream_format overlapped)"
                )
                + "; requests may choose with the stream_format input"
            )
            lines.append(
                "streaming asks the LLM for one chunk's tokens per non-decoupled call (the prompt plus what was said "
                "so far) instead of reading a decoupled LLM stream: BLS stubs reading decoupled streams crash under "
                "concurrency (triton-inference-server/server#8882); "
                + (
                    "the same seed gives the same tokens either way"
                    if ctx.llm_noise_keyed_by_position
                    else "each segment gets its own seed, derived from the request's (one seed for all would replay "
                    "the same sampling noise in every segment)"
                )
            )
        if point.engine == "trtllm":
            lines.append(
                f"KV-cache pool of {point.kv_cache_tokens} tokens (max_batch_size x max_seq_len): "
                "the official config caps it at 2560 tokens with kv_cache_free_gpu_mem_fraction 0.5, room for two "
                "long requests at a time, whatever the batch size"
            )
        return lines

    def workload(self, deployment: Deployment) -> TTSWorkload:
        options = dict(deployment.point.options)
        # a deployment built before stream_format existed sends finished chunks
        return _workload(
            deployment.entry_model, deployment.decoupled, options.get("stream_format"), options["chunk_overlap_seconds"]
        )

    def recognizes(self, model: ModelInfo) -> bool:
        from trtdeploy import TTSWorkload

        # CosyVoice speaks the same tensors: Spark-TTS is told by its name (the official runtime's, and trtdeploy's
        # spark_tts and spark_tts_offline) or by the stream settings trtdeploy's configuration holds
        named = model.name.startswith(self.name) or "chunk_overlap_seconds" in model.parameters
        return named and TTSWorkload.speaks(model)

    def served_workload(self, model: ModelInfo, *, tokenizer_dir: Path | None) -> TTSWorkload:
        # a server whose configuration does not say how it streams: as the defaults, the official wire format
        defaults = SparkOptions()
        overlap = model.parameters.get("chunk_overlap_seconds", str(defaults.chunk_overlap_seconds))
        try:
            overlap_seconds = float(overlap)
        except ValueError:
            raise UsageError(
                f"model {model.name!r} has the parameter chunk_overlap_seconds {overlap!r}, not a number of seconds"
            ) from None
        stream_format = model.parameters.get("stream_format", defaults.stream_format)
        return _workload(model.name, model.decoupled, stream_format, overlap_seconds)


def _workload(model_name: str, decoupled: bool, stream_format: str | None, overlap_seconds: float) -> TTSWorkload:
    """The TTS workload of a Spark-TTS model: streamed chunks overlap by ``overlap_seconds`` when the model streams
    in the ``overlapped`` format."""
    from trtdeploy import TTSWorkload

    overlapped = decoupled and stream_format == "overlapped"
    return TTSWorkload(
        model_name=model_name,
        decoupled=decoupled,
        sample_rate=SAMPLE_RATE,
        tokens_per_second=TOKENS_PER_SECOND,
        chunk_overlap_samples=round(overlap_seconds * SAMPLE_RATE) if overlapped else 0,
    )


def _check_lookahead(options: dict[str, Any], bicodec_config: Path) -> None:
    """A lookahead leaves the first chunk a whole overlap to send (the receptive radius is known once downloaded)."""
    lookahead = options["vocoder_lookahead_tokens"]
    if lookahead < 0 and bicodec_config.is_file():
        from .bicodec import BiCodecConfig, vocoder_receptive_radius

        lookahead = vocoder_receptive_radius(BiCodecConfig.from_yaml(bicodec_config))
    first = round(options["chunk_seconds"] * TOKENS_PER_SECOND)
    needed = lookahead + round(options["chunk_overlap_seconds"] * TOKENS_PER_SECOND)
    if lookahead > 0 and first < needed:
        raise UsageError(
            f"-o vocoder_lookahead_tokens holds back {lookahead} tokens, more than the first chunk of "
            f"{first} tokens leaves room for",
            hint=f"set -o chunk_seconds={needed / TOKENS_PER_SECOND:g} or more",
        )


def _end_token_note(llm_dir: Path) -> str | None:
    """The plan's note when the checkpoint's two end-of-sequence settings disagree (None before the download)."""
    if not (llm_dir / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    from .prompt import end_token

    vocab = Tokenizer.from_file(str(llm_dir / "tokenizer.json")).get_vocab(with_added_tokens=True)
    return end_token(llm_dir, vocab)[1]


@trtdeploy.hookimpl
def register_models(register: Any) -> None:
    register(SparkTTS())
