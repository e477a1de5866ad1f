"""trtdeploy plugin for Whisper (openai/whisper-large-v3 and the other Hugging Face Whisper checkpoints): speech
recognition on Triton, with the official ``whisper_bls`` tensors.

The deployment: ``tensorrt_llm`` (the whole ``WhisperForConditionalGeneration``, encoder and decoder, behind the
LLM contract with TensorRT-LLM's encoder-decoder inputs, served by whichever engine the build chose) and the BLS
entry ``whisper_bls``. A streaming deployment adds ``whisper_bls_offline``, the same model answering in one piece;
every deployment serves the offline entry as ``whisper`` too (one instance), the name Triton-ASR-Client asks for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trtdeploy
from trtdeploy import BuildContext, Deployment, Mode, ModelSpec, UsageError

from .audio import FEATURE_DTYPES, SAMPLE_RATE, WINDOW_SAMPLES
from .tokens import TASKS

if TYPE_CHECKING:
    from trtdeploy import ASRWorkload, ModelInfo

__version__ = "0.1.0"

ARCHITECTURE = "WhisperForConditionalGeneration"
#: Files of the Hugging Face layout this plugin reads (besides the weights).
REQUIRED_FILES = ("config.json", "tokenizer.json", "preprocessor_config.json")
#: Whisper's decoder positions (``max_target_positions`` of every released checkpoint).
DEFAULT_TARGET_POSITIONS = 448


@dataclass(frozen=True)
class WhisperOptions:
    """Settings of a whisper deployment (``trtdeploy build whisper -o KEY=VALUE``); requests may lower the token cap."""

    #: Tokens generated per window at most; 0: the build's --max-output-len (224 by default). The official BLS
    #: asks for 50, which cuts the transcript of a 30 s window of fast speech.
    max_new_tokens: int = 0
    #: Longest audio accepted; longer audio gets an error response.
    max_audio_seconds: float = 600.0
    #: Audio longer than this is transcribed in consecutive windows of this length (at most Whisper's 30 s).
    window_seconds: float = 30.0
    #: The decoder prompt of a request with an empty TEXT_PREFIX: <|startoftranscript|><|language|><|task|>...
    language: str = "en"
    task: str = "transcribe"
    #: Instances of each BLS entry (each serves one request, or one dynamic batch, at a time); 0: --max-batch-size.
    bls_instances: int = 0
    #: Streaming: each window's tokens are asked for in segments, the first of this many tokens (a quick first
    #: partial transcript), each next one stream_growth times the one before, up to the window's token cap.
    stream_first_tokens: int = 8
    stream_growth: float = 4.0

    def __post_init__(self) -> None:
        checks = {
            "max_new_tokens": self.max_new_tokens >= 0,
            "max_audio_seconds": self.max_audio_seconds > 0,
            "window_seconds": 0 < self.window_seconds * SAMPLE_RATE <= WINDOW_SAMPLES,
            "task": self.task in TASKS,
            "bls_instances": self.bls_instances >= 0,
            "stream_first_tokens": self.stream_first_tokens >= 1,
            "stream_growth": self.stream_growth >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"-o {bad[0]}={getattr(self, bad[0])} is out of range (see the plugin's README)")


class Whisper(ModelSpec):
    name = "whisper"
    description = "Whisper speech recognition (large-v3, turbo, v2, distil-*), offline and streaming (whisper_bls)"
    default_repo = "openai/whisper-large-v3"
    llm_subfolder = ""
    templates_dir = Path(__file__).parent / "templates"
    #: The decoder prompt (a <|startofprev|> text prompt leaves room for about 200 tokens) and each window's answer:
    #: together Whisper's 448 decoder positions.
    default_max_input_len = 224
    default_max_output_len = 224
    Options = WhisperOptions
    encoder_decoder = True
    #: The streaming BLS asks the LLM for each window's tokens in segments (non-decoupled requests whose decoder
    #: prompt holds the tokens so far) instead of reading a token stream: python-backend BLS models reading a
    #: decoupled model's stream crashed the server under concurrent load on a GPU host (see the README).
    llm_streams = False

    def validate_checkpoint(self, checkpoint_dir: Path) -> None:
        missing = [name for name in REQUIRED_FILES if not (checkpoint_dir / name).is_file()]
        if missing:
            raise UsageError(
                f"{checkpoint_dir} is not a Hugging Face Whisper checkpoint (missing {', '.join(missing)})",
                hint="pass the folder of an openai/whisper-* or distil-whisper/* download (config.json, "
                "model.safetensors, tokenizer.json, preprocessor_config.json)",
            )
        config = _read_json(checkpoint_dir / "config.json")
        architectures = config.get("architectures") or []
        if ARCHITECTURE not in architectures:
            raise UsageError(
                f"{checkpoint_dir} is a {', '.join(architectures) or 'model of unknown architecture'}, "
                f"not a {ARCHITECTURE}",
                hint="pass a Hugging Face Whisper checkpoint (openai's .pt files are not read: use the HF repository)",
            )
        if not any(checkpoint_dir.glob("*.safetensors")):
            raise UsageError(
                f"{checkpoint_dir} holds no *.safetensors weights",
                hint="download the repository's model.safetensors (pytorch_model.bin alone is not read)",
            )
        features = _read_json(checkpoint_dir / "preprocessor_config.json")
        if features.get("feature_extractor_type") != "WhisperFeatureExtractor":
            raise UsageError(f"{checkpoint_dir / 'preprocessor_config.json'} is not a WhisperFeatureExtractor's")
        if features.get("feature_size") != config.get("num_mel_bins"):
            raise UsageError(
                f"{checkpoint_dir}: preprocessor_config.json makes {features.get('feature_size')} mel bins and the "
                f"model takes {config.get('num_mel_bins')} (config.json num_mel_bins): the files are of two models"
            )

    def write_random_checkpoint(self, dest: Path, *, seed: int = 0) -> None:
        from .checkpoint import write_random_checkpoint

        write_random_checkpoint(dest, seed=seed)

    def entry_model(self, mode: Mode) -> str:
        return "whisper_bls"

    def offline_model(self, mode: Mode) -> str | None:
        return "whisper_bls_offline" if mode == "streaming" else None

    def triton_models(self, mode: Mode) -> tuple[str, ...]:
        # "whisper": the offline entry again, under the name Triton-ASR-Client addresses
        return ("whisper_bls", "whisper_bls_offline", "whisper") if mode == "streaming" else ("whisper_bls", "whisper")

    def position_limit(self, ctx: BuildContext) -> tuple[int, str]:
        return _target_positions(ctx.checkpoint_dir), "Whisper's decoder (max_target_positions in config.json)"

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        options = dict(ctx.options)
        point = ctx.point
        if options["max_new_tokens"] > point.max_output_len:
            raise UsageError(
                f"-o max_new_tokens={options['max_new_tokens']} is more than --max-output-len {point.max_output_len}"
            )
        options["max_new_tokens"] = options["max_new_tokens"] or point.max_output_len
        options["bls_instances"] = options["bls_instances"] or point.max_batch_size
        _check_language(ctx.checkpoint_dir, options["language"])
        data_type = ctx.encoder_features_dtype  # the LLM model's encoder_input_features type (the engine's)
        if data_type not in FEATURE_DTYPES:
            raise UsageError(
                f"the engine takes encoder features as {data_type}, which the whisper BLS cannot send",
                hint=f"the BLS sends {' or '.join(FEATURE_DTYPES)}",
            )
        options["encoder_features_dtype"] = data_type
        return options

    def notes(self, ctx: BuildContext) -> list[str]:
        """How this deployment departs from the official TensorRT-LLM whisper_bls + tensorrt_llm recipe."""
        options = self.template_context(ctx)
        lines = [
            f"up to {options['max_new_tokens']} tokens per window, settable per request (MAX_NEW_TOKENS): the "
            "official BLS asks for 50, which cuts the transcript of a 30 s window of fast speech",
            f"audio longer than {options['window_seconds']:g} s is transcribed in consecutive windows, joined with a "
            f"space, up to {options['max_audio_seconds']:g} s (longer audio gets an error): the official BLS "
            "transcribes the first 30 s and silently drops the rest",
            "log-mel features as openai-whisper and transformers compute them (the audio padded to 30 s before the "
            "STFT); the official BLS pads zero frames after the log-mel, values the model never saw in training",
            "WAV_LENS is really optional (missing: the whole row), bad input (empty, NaN, a sample rate other than "
            "16 kHz, an unknown <|language|>, a prefix over --max-input-len) gets an error response naming it",
            "a request may hold several utterances (WAV [N, samples], WAV_LENS [N, 1]) and requests arriving together "
            "are batched; every window goes to the LLM at once: the official BLS takes one utterance per request",
            f"{options['bls_instances']} instances of each BLS entry on the CPU (official: 8 sharing one GPU stub)",
        ]
        if ctx.decoupled:
            lines.append(
                "whisper_bls streams the transcript so far whenever it grows, window after window (the official "
                "format, readable by tools/whisper/client.py --streaming); whisper_bls_offline answers in one piece"
            )
            lines.append(
                f"streaming asks the LLM for each window's tokens in segments of {options['stream_first_tokens']}, "
                f"then {options['stream_growth']:g} times more each (non-decoupled requests whose decoder prompt "
                "holds the tokens so far; greedy decoding gives the same transcript) instead of reading a decoupled "
                "LLM's token stream as the official BLS does: BLS stubs reading decoupled streams crashed "
                "tritonserver 2.51 under concurrent load; each segment runs the encoder again"
            )
        return lines

    def workload(self, deployment: Deployment) -> ASRWorkload:
        from trtdeploy import ASRWorkload

        # the tokenizer lets --ignore-eos hold each request to its reference transcript's token count
        return ASRWorkload(
            model_name=deployment.entry_model, decoupled=deployment.decoupled, tokenizer_dir=deployment.llm_dir
        )

    def recognizes(self, model: ModelInfo) -> bool:
        from trtdeploy import ASRWorkload

        return ASRWorkload.speaks(model)

    def served_workload(self, model: ModelInfo, *, tokenizer_dir: Path | None) -> ASRWorkload:
        from trtdeploy import ASRWorkload

        return ASRWorkload(model_name=model.name, decoupled=model.decoupled, tokenizer_dir=tokenizer_dir)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is unreadable ({exc})") from None


def _target_positions(checkpoint_dir: Path) -> int:
    """The decoder's positions from config.json (Whisper's 448 before it is downloaded)."""
    config = checkpoint_dir / "config.json"
    if not config.is_file():
        return DEFAULT_TARGET_POSITIONS
    return int(_read_json(config).get("max_target_positions", DEFAULT_TARGET_POSITIONS))


def _check_language(checkpoint_dir: Path, language: str) -> None:
    """Refuse a default language the tokenizer has no token for (checked once the tokenizer is downloaded)."""
    tokenizer = checkpoint_dir / "tokenizer.json"
    if not tokenizer.is_file():
        return
    from .tokens import WhisperText

    text = WhisperText(tokenizer)
    if text.languages and language not in text.languages:
        raise UsageError(
            f"-o language={language} is not one of this model's {len(text.languages)} languages",
            hint=f"e.g. {', '.join(text.languages[:8])}",
        )


@trtdeploy.hookimpl
def register_models(register: Any) -> None:
    register(Whisper())
