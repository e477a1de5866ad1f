"""The engine interface: what turns a checkpoint into the ``tensorrt_llm`` Triton model of a deployment."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import UsageError
from ..spec import BuildContext

#: The ``tensorrt_llm`` python-model template of the engines that serve the contract with a generator of ours
#: (torch, trtllm_pytorch): each names its generator factory and settings in ``engine.parameters``.
PYTHON_TEMPLATES = Path(__file__).parent / "python_templates"


def sliding_window(config: dict[str, Any]) -> int | None:
    """The attention window of a checkpoint whose layers attend only to their last tokens, from its config.json
    (None: full attention). Mistral's ``sliding_window`` applies whenever it is set (v0.1: 4096, v0.3: null), Qwen2's
    only with ``use_sliding_window``; per-layer ``layer_types`` say which layers it applies to."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or config.get("use_sliding_window") is False:
        return None
    layers = config.get("layer_types")
    return window if not layers or "sliding_attention" in layers else None


def sliding_window_problem(config: dict[str, Any], max_seq_len: int, engine: str) -> str | None:
    """Why ``engine``, whose attention spans the whole sequence, would serve this checkpoint wrong at ``max_seq_len``
    (its sliding window is shorter), or None. Within the window both attentions are the same."""
    window = sliding_window(config)
    if window is None or max_seq_len <= window:
        return None
    return (
        f"the checkpoint's layers attend to their last {window} tokens only (sliding_window in config.json), which "
        f"the {engine} engine does not implement: max_seq_len {max_seq_len} would be answered wrong past token "
        f"{window}; lower --max-input-len/--max-output-len to sum to at most {window}"
    )


@dataclass(frozen=True)
class BuildStep:
    """One step of a build plan: an external command (``argv``) or an in-process function (``run``).

    The core runs the steps in order, logs each to ``logs/<name>.log`` and records it in the manifest. Steps run
    with the folder being built as their working directory (it is renamed into place only when every step has
    succeeded), so they name its files by relative paths: ``checkpoint/``, ``engines/``.
    """

    name: str
    description: str
    argv: tuple[str, ...] = ()
    run: Callable[[Path], None] | None = None  # called with the log file path
    env: dict[str, str] = field(default_factory=dict)
    #: Files the step reads that do not come from an earlier step (a script of the toolkit's source tree): a
    #: missing one fails the step with a message naming it, instead of a traceback in its log.
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if bool(self.argv) == (self.run is not None):
            given = "both" if self.argv else "neither"
            raise TypeError(f"build step {self.name!r} needs exactly one of argv or run, got {given}")


class Engine(ABC):
    """Serves the LLM contract (``input_ids`` … in, ``output_ids``/``sequence_length`` out) as a Triton model."""

    #: ``--engine`` value.
    name: ClassVar[str]
    description: ClassVar[str] = ""
    #: Precisions this engine can build.
    precisions: ClassVar[tuple[str, ...]]
    #: Folder holding the LLM model template: ``tensorrt_llm/config.pbtxt.j2`` and ``tensorrt_llm/1/*``.
    templates_dir: ClassVar[Path]
    #: Rank for ``--engine auto``: the usable engine with the highest rank serves the build.
    rank: ClassVar[int] = 0
    #: Whether a TP x PP deployment runs as one tritonserver per GPU under mpirun (TRT-LLM's C++ backend) rather
    #: than one tritonserver whose model starts its own workers.
    launches_ranks: ClassVar[bool] = False
    #: Whether a seeded request's sampling noise depends only on (seed, position), so that asking for an answer in
    #: segments (the prompt plus what was said) with one seed draws the tokens one call would. Otherwise each
    #: request restarts its seed's noise sequence, and a model asking in segments must vary the seed per segment.
    noise_keyed_by_position: ClassVar[bool] = False
    #: Whether the engine builds and serves on the CPU (``--gpu cpu``); ``--engine auto`` skips the others there.
    runs_on_cpu: ClassVar[bool] = False
    #: Whether the engine serves encoder-decoder models (Whisper); ``--engine auto`` skips the others for them.
    serves_encoder_decoder: ClassVar[bool] = True
    #: The optional build settings this engine honours (names of :data:`trtdeploy.build.ENGINE_OPTION_FLAGS`).
    build_options: ClassVar[frozenset[str]] = frozenset()
    #: Engine-specific settings (``-o key=value`` on ``build``, beside the model's): a dataclass whose fields have
    #: defaults; the point records those given (:attr:`~trtdeploy.spec.BuildPoint.engine_options`).
    Options: ClassVar[type | None] = None

    @abstractmethod
    def unavailable_reason(self) -> str | None:
        """None when this engine can build and serve on this machine, else a one-line reason."""

    @abstractmethod
    def default_precision(self, device: str) -> str:
        """The precision used when ``--precision`` is not given, for ``cpu`` or ``cuda``."""

    def default_encoder_decoder_precision(self, device: str) -> str:
        """:meth:`default_precision` for an encoder-decoder model (Whisper), where an engine supports fewer."""
        return self.default_precision(device)

    def validate(self, ctx: BuildContext) -> None:  # noqa: B027 (optional hook: most engines accept every point)
        """Reject a point this engine cannot build, before anything runs (raise UsageError)."""

    def steps(self, ctx: BuildContext) -> list[BuildStep]:
        """Convert/quantize/build steps; an engine that serves the checkpoint as it is returns none."""
        return []

    def resolve_version(self, requested: str | None, *, dry_run: bool) -> str | None:
        """The toolkit version the plan targets: ``requested`` (``--trtllm-version``) or the installed one.

        A dry run may plan for a version that is not installed; engines without versions return None.
        """
        if requested is not None:
            raise UsageError(f"engine {self.name!r} has no toolkit version to choose", hint="drop --trtllm-version")
        return None

    def llm_templates(self, ctx: BuildContext) -> Path:
        """The folder whose ``tensorrt_llm/`` model template this build renders (one per toolkit version)."""
        return self.templates_dir

    def server_env(self, ctx: BuildContext) -> dict[str, str]:
        """Environment variables tritonserver needs for this deployment (recorded in the manifest)."""
        return {}

    def input_names(self, ctx: BuildContext) -> dict[str, str]:
        """LLM-contract inputs this engine's model names differently (contract name -> its name)."""
        return {}

    def encoder_features_dtype(self, ctx: BuildContext) -> str:
        """The Triton data type of an encoder-decoder model's ``encoder_input_features`` (Whisper's log-mel
        features), which the models in front of it send (TensorRT-LLM's engines take fp16)."""
        return "TYPE_FP16"

    def notes(self, ctx: BuildContext) -> list[str]:
        """Lines for the plan: each choice that departs from the toolkit's defaults and why, and what is uncertain."""
        return []

    @abstractmethod
    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        """Variables for the LLM model template (under the name ``engine``)."""

    def versions(self) -> dict[str, str]:
        """Versions of the tools this engine depends on, recorded in the manifest (a change forces a rebuild)."""
        return {}
