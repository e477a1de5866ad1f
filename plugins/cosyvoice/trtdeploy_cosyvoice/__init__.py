"""trtdeploy plugin for CosyVoice2-0.5B and Fun-CosyVoice3-0.5B: zero-shot speech synthesis (24 kHz) on Triton.

Two models, named as the official runtime names their entry models: ``cosyvoice2`` and ``cosyvoice3``. A deployment
holds ``audio_tokenizer`` (reference → speech tokens, s3tokenizer), ``speaker_embedding`` (reference → CAM++
embedding), ``reference_voice`` (an ensemble running the two side by side), ``tensorrt_llm`` (the checkpoint's LLM
converted to a Qwen2 causal LM, served by whichever engine the build chose), ``token2wav`` (flow matching, then for
CosyVoice2 the HiFT vocoder; CosyVoice3 runs its vocoder as ``vocoder``) and the BLS entry. A streaming deployment
adds ``<entry>_offline``, the same model answering in one piece."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trtdeploy
from trtdeploy import BuildContext, Deployment, Mode, ModelSpec, UsageError

from .convert import BLANK_LLM, LLM_WEIGHTS, checkpoint_generation, convert_llm
from .generations import GENERATIONS, SPEECH_TOKENIZER_FILES, GenerationName
from .prompt_mel import SAMPLE_RATE
from .speaker import CAMPPLUS

if TYPE_CHECKING:
    from trtdeploy import ModelInfo, TTSWorkload

__version__ = "0.1.0"

#: Speech tokens per second of audio.
TOKENS_PER_SECOND = 25
#: The smallest streamed chunk: 8 mel frames, what the vocoder needs of a chunk before the last.
MIN_CHUNK_TOKENS = 4
FLOW_WEIGHTS, VOCODER_WEIGHTS = "flow.pt", "hift.pt"
FLOW_PRECISIONS = ("fp32", "fp16", "bf16")
#: The official stage 1 (runtime/triton_trtllm run.sh, run_cosyvoice3.sh): the stock Qwen converter at bfloat16, then
#: trtllm-build --max_batch_size N --max_num_tokens 32768 --gemm_plugin bfloat16, its other settings left at their
#: defaults (max_input_len 1024).
OFFICIAL_ENGINE_BATCH = {"cosyvoice2": 16, "cosyvoice3": 64}
OFFICIAL_MAX_NUM_TOKENS = 32768


@dataclass(frozen=True)
class CosyVoiceOptions:
    """Settings of a cosyvoice deployment (``trtdeploy build cosyvoice2 -o KEY=VALUE``); requests may override the
    sampling settings and the token cap."""

    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.1
    #: Most speech tokens generated per request (25 per second of audio); 0: the build's --max-output-len.
    max_new_tokens: int = 0
    #: Speech tokens per text token of the target text, at least and at most (the reference code's ratios): the
    #: LLM may not end before the first, and is stopped at the second.
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0
    #: Longest reference audio accepted (the speech tokenizer's and the official speaker encoder's limit).
    max_reference_seconds: float = 30.0
    #: Normalise numbers, dates and units of the texts before the LLM reads them (wetext).
    text_normalization: bool = True
    #: The flow's precision on a GPU (fp16: as the official TensorRT plans run it; fp32 on the CPU whatever this
    #: says); the vocoder runs in fp32.
    flow_precision: str = "fp16"
    #: Capture the flow's CUDA graphs when the server starts (about a minute on an H200, longer on smaller GPUs:
    #: give `serve --timeout` room), rather than each on the first request that needs it.
    flow_graphs_at_start: bool = True
    #: Streaming: speech tokens of the first chunk, then each chunk chunk_growth times the one before, at most
    #: max_chunk_tokens: 15, 30, 60, 100, ... (the official BLS: 15, then 25, 50, 100, 200, ...). At least 4: a
    #: chunk before the last must give the vocoder 8 mel frames (2 a token).
    first_chunk_tokens: int = 15
    chunk_growth: float = 2.0
    max_chunk_tokens: int = 100
    #: Streaming: after the first chunk, the LLM makes the next chunk's tokens while token2wav makes the last one's
    #: audio (two BLS calls at once from one entry instance); false: one after the other.
    stream_overlap: bool = True
    #: Instances of the BLS entry (each serves one request at a time); 0: --max-batch-size.
    bls_instances: int = 0
    #: Instances of ``<entry>_offline`` in a streaming deployment; 0: bls_instances.
    offline_instances: int = 0
    tokenizer_instances: int = 1
    speaker_instances: int = 1

    def __post_init__(self) -> None:
        checks = {
            "temperature": self.temperature >= 0,
            "top_k": self.top_k >= 0,
            "top_p": 0 <= self.top_p <= 1,
            "repetition_penalty": self.repetition_penalty > 0,
            "max_new_tokens": self.max_new_tokens >= 0,
            "min_token_text_ratio": self.min_token_text_ratio >= 0,
            "max_token_text_ratio": self.max_token_text_ratio >= self.min_token_text_ratio,
            "max_reference_seconds": 0 < self.max_reference_seconds <= 30,
            "flow_precision": self.flow_precision in FLOW_PRECISIONS,
            "first_chunk_tokens": self.first_chunk_tokens >= MIN_CHUNK_TOKENS,
            "chunk_growth": self.chunk_growth >= 1,
            "max_chunk_tokens": self.max_chunk_tokens >= self.first_chunk_tokens,
            "bls_instances": self.bls_instances >= 0,
            "offline_instances": self.offline_instances >= 0,
            "tokenizer_instances": self.tokenizer_instances >= 1,
            "speaker_instances": self.speaker_instances >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"-o {bad[0]}={getattr(self, bad[0])} is out of range (see the plugin's README)")


class CosyVoice(ModelSpec):
    """One generation of CosyVoice (the two differ in checkpoint, LLM layout, flow estimator and vocoder)."""

    templates_dir = Path(__file__).parent / "templates"
    #: 30 s of reference audio is 750 speech tokens; the texts and the system prompt take the rest.
    default_max_input_len = 2048
    #: 80 s of speech (the official BLS asks for 750 tokens: 30 s).
    default_max_output_len = 2000
    Options = CosyVoiceOptions
    llm_conversion = "cosyvoice-llm-1"
    #: The BLS asks the LLM for one chunk's tokens at a time (non-decoupled calls) instead of reading a token stream:
    #: python-backend BLS models reading a decoupled model's stream crash under concurrent load, and the official
    #: runtime's decoupled LLM hangs its streaming (see the README).
    llm_streams = False

    def __init__(self, generation: GenerationName, repo: str, description: str):
        self.generation = GENERATIONS[generation]
        self.name = generation
        self.default_repo = repo
        self.description = description

    @property
    def files(self) -> tuple[str, ...]:
        """The files of the official checkpoint layout this plugin reads."""
        return (
            f"{self.name}.yaml",
            LLM_WEIGHTS,
            f"{BLANK_LLM}/config.json",
            FLOW_WEIGHTS,
            VOCODER_WEIGHTS,
            CAMPPLUS,
            SPEECH_TOKENIZER_FILES[self.name],
        )

    def validate_checkpoint(self, checkpoint_dir: Path) -> None:
        found = checkpoint_generation(checkpoint_dir)
        if found.name != self.name:
            raise UsageError(
                f"{checkpoint_dir} is a {found.name} checkpoint, not {self.name}",
                hint=f"build it as {found.name}: trtdeploy build {found.name} --model-dir {checkpoint_dir}",
            )
        missing = [name for name in self.files if not (checkpoint_dir / name).is_file()]
        if missing:
            raise UsageError(
                f"{checkpoint_dir} is not a whole {self.name} checkpoint (missing {', '.join(missing)})",
                hint=f"pass the folder downloaded from {self.default_repo}",
            )

    def convert_llm(self, checkpoint_dir: Path, dest: Path) -> None:
        convert_llm(checkpoint_dir, dest)

    def write_random_checkpoint(self, dest: Path, *, seed: int = 0) -> None:
        from .checkpoint import write_random_checkpoint

        write_random_checkpoint(dest, self.name, seed=seed)

    def entry_model(self, mode: Mode) -> str:
        return self.name

    def offline_model(self, mode: Mode) -> str | None:
        return f"{self.name}_offline" if mode == "streaming" else None

    def triton_models(self, mode: Mode) -> tuple[str, ...]:
        models = ["audio_tokenizer", "speaker_embedding", "reference_voice", "token2wav", self.name]
        if self.name == "cosyvoice3":
            models.append("vocoder")
        offline = self.offline_model(mode)
        if offline:
            models.append(offline)
        return tuple(models)

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        options = dict(ctx.options)
        point = ctx.point
        reference_tokens = options["max_reference_seconds"] * TOKENS_PER_SECOND
        if reference_tokens >= point.max_input_len:
            raise UsageError(
                f"--max-input-len {point.max_input_len} leaves no room for the texts beside "
                f"{options['max_reference_seconds']:g} s of reference audio ({reference_tokens:g} speech tokens)",
                hint="build with --max-input-len 2048 (the default), or lower -o max_reference_seconds",
            )
        if options["max_new_tokens"] > point.max_output_len:
            raise UsageError(
                f"-o max_new_tokens={options['max_new_tokens']} is more than --max-output-len {point.max_output_len}"
            )
        options["max_new_tokens"] = options["max_new_tokens"] or point.max_output_len
        options["bls_instances"] = options["bls_instances"] or point.max_batch_size
        options["offline_instances"] = options["offline_instances"] or options["bls_instances"]
        options["generation"] = self.name
        # the torch engine ends on every stop token of the converted LLM (its generation_config end tokens) and bans
        # them all before min tokens; TensorRT-LLM's engines end on end_id alone, so the others go as stop words
        options["llm_reads_end_tokens"] = point.engine == "torch"
        options["speaker_dir"] = str(ctx.deployment_dir / "speakers")
        return options

    def notes(self, ctx: BuildContext) -> list[str]:
        """How this deployment departs from the official runtime/triton_trtllm recipe."""
        options = self.template_context(ctx)
        lines = [
            f"output cap {options['max_new_tokens']} speech tokens ({options['max_new_tokens'] / TOKENS_PER_SECOND:g} "
            "s of speech), settable per request, and at least min_token_text_ratio per text token: the official BLS "
            "asks for 750 (30 s) whatever the text",
            "the LLM's head bias and its speech-only mask go with each request as embedding_bias (the converted LLM "
            "is a standard Qwen2 causal LM): no text token can be sampled",
            "token2wav batches the requests that arrive together (the official one runs them one at a time)",
            "voices registered once (speaker_id with a reference) are used by id afterwards, from any BLS instance: "
            "the official deployment reads one fixed spk2info.pt",
            f"{options['bls_instances']} {self.name} instances, one request each (official: "
            + ("4 sharing threads)" if self.name == "cosyvoice2" else "10)"),
        ]
        if options["text_normalization"]:
            lines.append("texts are normalised with wetext before the LLM (numbers, dates, units), where it installs")
        if ctx.decoupled:
            lines.append(
                f"streaming sends audio chunks of {options['first_chunk_tokens']} speech tokens, then "
                f"{options['chunk_growth']:g} times more each, up to {options['max_chunk_tokens']}; the LLM is asked "
                "for each chunk's tokens by a non-decoupled call (the prompt plus the tokens so far), so the "
                "decoupled-LLM hang cannot happen: the official CosyVoice2 streaming's decoupled tensorrt_llm model "
                "stops generating after the first streamed request (CosyVoice issue 1866)"
                + (
                    "; after the first chunk, the LLM makes the next chunk's tokens while token2wav makes the last "
                    "one's audio"
                    if options["stream_overlap"]
                    else ""
                )
                + (
                    ", which the official CosyVoice3 runtime avoids by serving its LLM with trtllm-serve"
                    if self.name == "cosyvoice3"
                    else ""
                )
            )
        if ctx.point.engine == "trtllm":
            lines.append(self._engine_note(ctx))
            lines.append(
                "min_length holds back end_id alone, not the other stop tokens (stop words): an answer's tokens "
                "before its minimum come from a call whose embedding_bias masks every stop token, the rest from a "
                "second call that may stop"
            )
            official = (
                "caps it at 2560 tokens (max_tokens_in_paged_kv_cache, and max_attention_window_size 2560) with "
                "kv_cache_free_gpu_mem_fraction 0.5, which caps concurrency whatever the batch size"
                if self.name == "cosyvoice2"
                else "serves the LLM with trtllm-serve --max_batch_size 64 --kv_cache_free_gpu_memory_fraction 0.4"
            )
            lines.append(
                f"KV-cache pool of {ctx.point.kv_cache_tokens} tokens (max_batch_size x max_seq_len): the official "
                f"deployment {official}"
            )
        return lines

    def _engine_note(self, ctx: BuildContext) -> str:
        """The trtllm engine's build settings against the official stage 1's."""
        point = ctx.point
        official_batch = OFFICIAL_ENGINE_BATCH[self.name]
        batch = "as the official" if point.max_batch_size == official_batch else f"official {official_batch}"
        precision = "" if point.precision == "bf16" else f"precision {point.precision} (official bf16), "
        return (
            f"trtllm-build: {precision}max_batch_size {point.max_batch_size} ({batch}); max_num_tokens "
            f"{point.max_num_tokens} (official {OFFICIAL_MAX_NUM_TOKENS}): the tokens of one engine step, prompts "
            "being prefilled and requests decoding together, which bounds how long prefills hold up the requests "
            "already speaking; gemm_plugin auto, the "
            "converter's dtype (bfloat16 at bf16, what the official names), none at fp8; max_input_len "
            f"{ctx.llm_max_input_len} (official: trtllm-build's default 1024): each chunk's call sends the prompt "
            "plus the speech tokens so far"
        )

    def workload(self, deployment: Deployment) -> TTSWorkload:
        return _workload(deployment.entry_model, deployment.decoupled)

    def recognizes(self, model: ModelInfo) -> bool:
        from trtdeploy import TTSWorkload

        # Spark-TTS speaks the same tensors: a CosyVoice model is told by the generation trtdeploy's configuration
        # names, else by its name (the official runtime's: cosyvoice2, cosyvoice3, and their _offline twins)
        generation = model.parameters.get("generation")
        named = generation == self.name if generation else model.name.startswith(self.name)
        return named and TTSWorkload.speaks(model)

    def served_workload(self, model: ModelInfo, *, tokenizer_dir: Path | None) -> TTSWorkload:
        return _workload(model.name, model.decoupled)


def _workload(model_name: str, decoupled: bool) -> TTSWorkload:
    from trtdeploy import TTSWorkload

    return TTSWorkload(
        model_name=model_name, decoupled=decoupled, sample_rate=SAMPLE_RATE, tokens_per_second=TOKENS_PER_SECOND
    )


@trtdeploy.hookimpl
def register_models(register: Any) -> None:
    register(CosyVoice("cosyvoice2", "FunAudioLLM/CosyVoice2-0.5B", "CosyVoice2-0.5B zero-shot TTS (24 kHz)"))
    register(
        CosyVoice("cosyvoice3", "FunAudioLLM/Fun-CosyVoice3-0.5B-2512", "Fun-CosyVoice3-0.5B zero-shot TTS (24 kHz)")
    )
