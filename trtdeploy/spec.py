"""What a model plugin registers: a :class:`ModelSpec`, and the typed build context its templates see."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .backend_utils import FALSE_WORDS, TRUE_WORDS
from .errors import UsageError
from .gpus import DEFAULT_MAX_NUM_TOKENS
from .memory import read_config

if TYPE_CHECKING:
    from .deployment import Deployment
    from .gpus import GpuProfile
    from .perf.workload import ModelInfo, Workload

Mode = Literal["offline", "streaming"]
MODES: tuple[Mode, ...] = ("offline", "streaming")
KV_CACHE_DTYPES = ("fp8", "int8")
#: ``rope_scaling`` types that stretch the positions a model was trained on by their factor, on top of
#: ``max_position_embeddings`` (Llama 3's and LongRoPE's ``max_position_embeddings`` counts the stretch already).
STRETCHING_ROPE_TYPES = ("linear", "dynamic", "yarn")


@dataclass(frozen=True)
class BuildPoint:
    """One point of the build matrix: everything that makes one deployment different from another."""

    model: str
    engine: str
    precision: str
    max_batch_size: int
    mode: Mode
    gpu: str  # a GPU profile name, or "cpu"
    max_input_len: int
    max_output_len: int
    tp: int = 1
    pp: int = 1
    options: tuple[tuple[str, Any], ...] = ()
    #: Tokens one engine step may process.
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS
    #: The version of the engine's toolkit the build targets (TensorRT-LLM's for the trtllm engines), if any.
    engine_version: str | None = None
    #: Appended to the folder name where points differ by more than the name says (a matrix over lengths).
    variant: str = ""
    #: Copies of the model behind one endpoint, each on TP x PP GPUs of its own.
    replicas: int = 1
    #: KV-cache element type (one of :data:`KV_CACHE_DTYPES`); None: the engine's default for the precision.
    kv_cache_dtype: str | None = None
    #: Calibration of the quantized precisions: a local dataset folder (absolute) and how many samples; None: the
    #: engine's defaults.
    calib_dataset: str | None = None
    calib_size: int | None = None
    #: The engine's ``-o`` settings given to the build (:attr:`~trtdeploy.engines.base.Engine.Options`), those not
    #: given left out.
    engine_options: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        """The deployment folder's name, e.g. ``torch-bf16-bs8-tp1pp1-streaming``, with a part for each setting
        left off its default: ``-x2`` (replicas), ``-kvint8``, ``-calib256``, ``-calibdata-1a2b3c`` (a short hash of
        the dataset's path), ``-cuda_graphs-false`` per engine setting given, then the variant."""
        parts = [f"{self.engine}-{self.precision}-bs{self.max_batch_size}-tp{self.tp}pp{self.pp}-{self.mode}"]
        if self.replicas > 1:
            parts.append(f"x{self.replicas}")
        if self.kv_cache_dtype:
            parts.append(f"kv{self.kv_cache_dtype}")
        if self.calib_size:
            parts.append(f"calib{self.calib_size}")
        if self.calib_dataset:
            parts.append(f"calibdata-{hashlib.sha256(self.calib_dataset.encode()).hexdigest()[:6]}")
        for key, value in self.engine_options:
            parts.append(f"{key}-{re.sub(r'[^A-Za-z0-9_.]+', '', str(value).lower())}")
        if self.variant:
            parts.append(self.variant)
        return "-".join(parts)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def kv_cache_tokens(self) -> int:
        """KV-cache tokens for every sequence of the batch at full length: what the point can ever use."""
        return self.max_batch_size * self.max_seq_len

    @property
    def gpus_needed(self) -> int:
        return self.world_size * self.replicas

    @property
    def gpu_groups(self) -> list[list[int]]:
        """The GPU ids of each replica: TP x PP consecutive ones."""
        size = self.world_size
        return [list(range(r * size, (r + 1) * size)) for r in range(self.replicas)]

    @property
    def max_seq_len(self) -> int:
        return self.max_input_len + self.max_output_len

    @property
    def device(self) -> str:
        return "cpu" if self.gpu == "cpu" else "cuda"

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["options"] = dict(self.options)
        del data["engine_options"]
        if self.engine_options:  # recorded only when given: the manifests (and hashes) of other builds stay
            data["engine_options"] = dict(self.engine_options)
        return data


@dataclass(frozen=True)
class BuildContext:
    """The typed context every template is rendered from (jinja2 sees these attributes).

    Paths are the final ones inside the deployment folder, even while the build writes into a scratch folder.
    """

    point: BuildPoint
    deployment_dir: Path
    checkpoint_dir: Path  # the model's checkpoint root, as downloaded
    llm_dir: Path  # the Hugging Face causal LM inside it (== checkpoint_dir for a plain LLM)
    engine_dir: Path
    model_repo_dir: Path
    llm_model_name: str = "tensorrt_llm"
    options: dict[str, Any] = field(default_factory=dict)
    #: The model's :attr:`ModelSpec.llm_streams`.
    llm_streams: bool = True
    #: The model's :attr:`ModelSpec.encoder_decoder`.
    encoder_decoder: bool = False
    #: The Triton data type of the LLM's ``encoder_input_features`` (the engine's
    #: :meth:`~trtdeploy.engines.base.Engine.encoder_features_dtype`).
    encoder_features_dtype: str = "TYPE_FP16"
    #: The GPU the build targets (None on the CPU) and how many of them the host has (None: not known).
    gpu_profile: GpuProfile | None = None
    gpu_count: int | None = None
    #: LLM-contract input names the engine spells differently (TRT-LLM 0.20+ reads ``seed`` for ``random_seed``).
    llm_input_names: dict[str, str] = field(default_factory=dict)
    #: The engine's :attr:`~trtdeploy.engines.base.Engine.noise_keyed_by_position`.
    llm_noise_keyed_by_position: bool = False

    def llm_input(self, name: str) -> str:
        """The LLM model's name for the contract input ``name``."""
        return self.llm_input_names.get(name, name)

    @property
    def decoupled(self) -> bool:
        """Whether the deployment streams (its entry model is decoupled)."""
        return self.point.mode == "streaming"

    @property
    def llm_decoupled(self) -> bool:
        """Whether the LLM model streams its tokens (decoupled)."""
        return self.decoupled and self.llm_streams

    @property
    def llm_max_input_len(self) -> int:
        """The longest prompt the LLM model takes: a model that asks for its answer in segments sends the prompt
        plus what was generated so far."""
        return self.point.max_input_len if self.llm_streams else self.point.max_seq_len

    @property
    def max_batch_size(self) -> int:
        return self.point.max_batch_size


class ModelSpec(ABC):
    """A deployable model: the checkpoint it starts from, the Triton models it adds, the perf workload it brings.

    Plugins subclass this and register an instance through the ``register_models`` hook. The core owns everything
    else: download, the engine that serves the LLM contract, rendering, server and perf.
    """

    #: The name users type: ``trtdeploy build <name>``.
    name: ClassVar[str]
    #: One line for ``trtdeploy plugins``.
    description: ClassVar[str] = ""
    #: Hugging Face repo id downloaded when no ``--model-dir`` is given.
    default_repo: ClassVar[str]
    #: Where the Hugging Face causal LM sits inside the checkpoint ("" when the checkpoint is the LLM).
    llm_subfolder: ClassVar[str] = ""
    #: Folder whose subfolders are Triton models: ``<model>/config.pbtxt.j2`` plus ``<model>/1/*`` files.
    templates_dir: ClassVar[Path]
    #: Modes a deployment can be built in.
    modes: ClassVar[tuple[Mode, ...]] = MODES
    #: Limits used when the user gives none.
    default_max_input_len: ClassVar[int] = 2048
    default_max_output_len: ClassVar[int] = 1024
    #: Model-specific settings (``-o key=value`` on ``build``): a dataclass whose fields have defaults.
    Options: ClassVar[type | None] = None
    #: Whether a streaming deployment's models read the LLM's token stream (the LLM is then decoupled). False: they
    #: ask the LLM for their answer in segments, each a non-decoupled request whose prompt holds what was said so
    #: far, so the LLM is never decoupled and takes prompts up to max_seq_len tokens.
    llm_streams: ClassVar[bool] = True
    #: Whether the LLM is an encoder-decoder (Whisper): its engines get an encoder and a cross-attention KV cache.
    encoder_decoder: ClassVar[bool] = False
    #: Version of :meth:`convert_llm`, for a checkpoint that holds no Hugging Face causal LM as it is (None: it
    #: holds one, at :attr:`llm_subfolder`). The core keeps each conversion per checkpoint and version: change the
    #: version whenever the conversion's output changes.
    llm_conversion: ClassVar[str | None] = None

    def parse_options(self, raw: dict[str, str]) -> dict[str, Any]:
        """Turn ``-o key=value`` strings into typed option values, rejecting unknown keys."""
        return parse_options(self.Options, raw, owner=f"model {self.name!r}")

    @abstractmethod
    def validate_checkpoint(self, checkpoint_dir: Path) -> None:
        """Raise :class:`~trtdeploy.errors.UsageError` naming what is missing if the folder is not this model."""

    def convert_llm(self, checkpoint_dir: Path, dest: Path) -> None:
        """Write the checkpoint's LLM into the empty folder ``dest`` as a Hugging Face causal LM (config.json,
        safetensors, tokenizer), for a model with :attr:`llm_conversion`. The core calls it once per checkpoint and
        version, before the engine's steps, and moves ``dest`` into place only once it returns; raise
        :class:`~trtdeploy.errors.UsageError` for a checkpoint it cannot convert."""
        raise NotImplementedError(f"model {self.name!r} sets llm_conversion but has no convert_llm")

    @abstractmethod
    def write_random_checkpoint(self, dest: Path, *, seed: int = 0) -> None:
        """Write a small random-weight checkpoint of the real architecture in the real on-disk layout.

        Used by tests and by the quickstart where the Hub cannot be reached.
        """

    @abstractmethod
    def entry_model(self, mode: Mode) -> str:
        """The Triton model a client calls in this mode."""

    def offline_model(self, mode: Mode) -> str | None:
        """The model of a deployment in ``mode`` that answers in one response what the entry model streams, for
        clients that cannot stream (Triton's HTTP endpoint); None: there is none."""
        return None

    def triton_models(self, mode: Mode) -> tuple[str, ...] | None:
        """The template models a deployment in ``mode`` renders (besides the LLM); None: all of them."""
        return None

    def position_limit(self, ctx: BuildContext) -> tuple[int, str] | None:
        """The most tokens one sequence of the checkpoint's LLM may hold (prompt plus answer), and what that number
        is, for the message (``"the checkpoint (max_position_embeddings in config.json)"``); None: not known (no
        config.json yet). The plan refuses a max_input_len + max_output_len above it. Default: the LLM's config.json
        ``max_position_embeddings``, times its ``rope_scaling`` factor where the scaling stretches the positions."""
        return _config_position_limit(read_config(ctx.llm_dir))

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        """Extra variables for this model's templates (under the name ``model``)."""
        return {}

    def notes(self, ctx: BuildContext) -> list[str]:
        """Lines for the plan: where this deployment departs from the model's official recipe, and why."""
        return []

    @abstractmethod
    def workload(self, deployment: Deployment) -> Workload:
        """The perf workload: how a dataset row becomes a request and a response becomes a result."""

    def recognizes(self, model: ModelInfo) -> bool:
        """Whether ``model``, a Triton model served where no deployment folder of it is at hand (``trtdeploy perf
        --url HOST:PORT --model NAME``), is one this model's deployments serve to clients, told from its
        configuration: its tensor names, and where another model shares that contract, its name or parameters.
        perf asks every model and takes the one that recognizes it (none, or several: ``--workload`` must name one).
        Default: no model is recognized."""
        return False

    def served_workload(self, model: ModelInfo, *, tokenizer_dir: Path | None) -> Workload:
        """The perf workload for ``model`` served without a deployment folder here (one :meth:`recognizes`, or one
        ``--workload`` names this model for): what :meth:`workload` makes of a deployment, made of the served
        configuration (its name, ``decoupled``, its parameters) instead. ``tokenizer_dir``: ``--tokenizer``, a
        local folder, when given. Default: UsageError (this model is benchmarked through its deployment only)."""
        raise UsageError(
            f"model {self.name!r} makes no perf workload without its deployment folder",
            hint="run perf with the deployment folder (its plugin knows no served configuration)",
        )


def option_names(options: type | None) -> list[str]:
    """The keys an ``Options`` dataclass (or None: no options) takes."""
    return [] if options is None else [field.name for field in dataclasses.fields(options)]


def parse_options(options: type | None, raw: dict[str, str], *, owner: str) -> dict[str, Any]:
    """``-o key=value`` strings as the typed values of the dataclass ``options`` (its defaults for the keys not
    given), for ``owner`` (e.g. "model 'qwen_llm'"); UsageError for an unknown key, a value of the wrong type, or
    one the dataclass's own checks refuse."""
    if options is None:
        if raw:
            raise UsageError(f"{owner} takes no -o options (got {', '.join(raw)})")
        return {}
    fields = {f.name: f for f in dataclasses.fields(options)}
    values: dict[str, Any] = {}
    for key, text in raw.items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise UsageError(f"unknown option {key!r} for {owner}", hint=f"known options: {known}")
        values[key] = _coerce(key, text, fields[key].type)
    try:
        return dataclasses.asdict(options(**values))
    except ValueError as exc:  # the Options' own checks (__post_init__)
        raise UsageError(f"{owner}: {exc}") from None


def _coerce(key: str, text: str, annotation: Any) -> Any:
    kind = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    kind = kind.removesuffix(" | None")
    try:
        if kind.startswith("bool"):
            low = text.lower()
            if low not in TRUE_WORDS | FALSE_WORDS:
                raise ValueError(text)
            return low in TRUE_WORDS
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        raise UsageError(f"option {key}={text!r} is not a valid {kind}") from None
    return text


def _config_position_limit(config: dict | None) -> tuple[int, str] | None:
    """The position limit a Hugging Face config.json gives (see :meth:`ModelSpec.position_limit`)."""
    text = (config or {}).get("text_config", config) or {}  # multimodal configs nest the LLM's
    positions = text.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    scaling = text.get("rope_scaling")
    scaling = scaling if isinstance(scaling, dict) else {}
    stretches = scaling.get("rope_type", scaling.get("type")) in STRETCHING_ROPE_TYPES
    factor = scaling.get("factor") if stretches else None
    if isinstance(factor, (int, float)) and factor > 1:
        return (
            int(positions * factor),
            f"the checkpoint (max_position_embeddings {positions} in config.json times its rope_scaling factor "
            f"{factor:g})",
        )
    return positions, "the checkpoint (max_position_embeddings in config.json)"
