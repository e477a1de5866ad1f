"""The text-LLM pipeline: a Hugging Face causal LM served text in, text out, through the tensors of TensorRT-LLM's
``inflight_batcher_llm`` ensemble, so that its clients work unchanged.

The deployment is ``preprocessing`` (tokenizer) → ``tensorrt_llm`` (the engine) → ``postprocessing`` (detokenizer),
joined as ``ensemble`` (its tensors: :mod:`.ensemble`); an input the engine cannot honour is refused by name, never
ignored. A plugin subclasses :class:`TextLLMSpec` and says what is particular to its model family::

    class QwenLLM(TextLLMSpec):
        name = "qwen_llm"
        default_repo = "Qwen/Qwen2.5-0.5B-Instruct"
        architectures = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import UsageError
from ..spec import BuildContext, Mode, ModelSpec

if TYPE_CHECKING:
    from ..checkpoints import TokenizerKind
    from ..deployment import Deployment
    from ..perf.llm import TextLLMWorkload
    from ..perf.workload import ModelInfo

#: What every checkpoint of a text LLM holds besides its ``*.safetensors``.
REQUIRED_FILES = ("config.json", "tokenizer_config.json")
#: The ensemble's parameter naming the model it serves (how ``perf --url`` tells one text LLM's from another's).
TEXT_LLM_PARAMETER = "text_llm"


@dataclass(frozen=True)
class TextLLMOptions:
    """Settings of a text-LLM deployment (``trtdeploy build MODEL -o KEY=VALUE``). A plugin whose models want other
    defaults subclasses this (a frozen dataclass) with the fields it changes, e.g. ``chat_template: bool = True``."""

    #: Wrap ``text_input`` as one user turn of the tokenizer's chat template (instruct models).
    chat_template: bool = False
    #: Let the tokenizer add its special tokens (e.g. BOS) to the prompt.
    add_special_tokens: bool = True
    #: Drop special tokens from ``text_output``.
    skip_special_tokens: bool = True
    preprocessing_instances: int = 1
    postprocessing_instances: int = 1

    def __post_init__(self) -> None:
        for name in ("preprocessing_instances", "postprocessing_instances"):
            if getattr(self, name) < 1:
                raise ValueError(f"-o {name} must be >= 1, got {getattr(self, name)}")


class TextLLMSpec(ModelSpec):
    """A causal LM served as text in, text out. Subclasses set ``name``, ``default_repo`` and
    :attr:`architectures`, and where their family differs, :attr:`tokenizer_kind` and ``Options``."""

    #: The config.json ``architectures`` this model deploys (the engine decides what it can serve); random
    #: checkpoints have the first.
    architectures: ClassVar[tuple[str, ...]]
    #: The tokenizer of random checkpoints (:data:`trtdeploy.checkpoints.TokenizerKind`): the family's real kind.
    tokenizer_kind: ClassVar[TokenizerKind] = "qwen2"
    #: Tokens that end an answer besides the tokenizer's EOS and generation_config.json's ``eos_token_id``, for
    #: checkpoints that do not list them all (a fine-tune whose generation_config.json misses the end-of-turn token
    #: of its chat template). A request that names no ``end_id`` ends at any of them. Those a checkpoint's tokenizer
    #: lacks are left out of its deployments (one family's versions differ: Llama 3.1's ``<|eom_id|>`` is a
    #: reserved token in Llama 3, and Llama 2 has none of Llama 3's).
    end_tokens: ClassVar[tuple[str, ...]] = ()
    #: config.json values of random checkpoints beyond what their tokenizer kind's family gives (a version's rope
    #: scaling, sliding window or tied embeddings).
    random_config: ClassVar[dict[str, Any]] = {}
    templates_dir = Path(__file__).parent / "templates"
    Options: ClassVar[type] = TextLLMOptions

    def validate_checkpoint(self, checkpoint_dir: Path) -> None:
        missing = [name for name in REQUIRED_FILES if not (checkpoint_dir / name).is_file()]
        if missing:
            raise UsageError(
                f"{checkpoint_dir} is not a Hugging Face LLM checkpoint (missing {', '.join(missing)})",
                hint="pass the folder that holds config.json, the tokenizer and *.safetensors",
            )
        if not any(checkpoint_dir.glob("*.safetensors")):
            raise UsageError(f"{checkpoint_dir} holds no *.safetensors weights")
        architectures = json.loads((checkpoint_dir / "config.json").read_text()).get("architectures") or []
        if not set(architectures) & set(self.architectures):
            raise UsageError(
                f"{checkpoint_dir} is a {', '.join(architectures) or 'model of unknown architecture'}, "
                f"not one of {', '.join(self.architectures)}"
            )

    def write_random_checkpoint(self, dest: Path, *, seed: int = 0) -> None:
        from ..checkpoints import write_random_causal_lm

        write_random_causal_lm(
            dest,
            architecture=self.architectures[0],
            tokenizer=self.tokenizer_kind,
            seed=seed,
            config=self.random_config,
        )

    def entry_model(self, mode: Mode) -> str:
        return "ensemble"

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        from . import ensemble

        release = ensemble.release(ctx)
        tensors = {
            "release": release.label,
            "inputs": ensemble.inputs(release),
            "outputs": ensemble.outputs(release),
        }
        return {
            "name": self.name,
            "tokenizer_dir": str(ctx.llm_dir),
            **self._options(ctx.options),
            "ensemble": tensors,
            "end_tokens": _pbtxt_string(json.dumps(self.checkpoint_end_tokens(ctx.llm_dir))),
        }

    def checkpoint_end_tokens(self, llm_dir: Path) -> list[str]:
        """The :attr:`end_tokens` that the tokenizer in ``llm_dir`` has (all of them before it is downloaded)."""
        if not self.end_tokens or not (llm_dir / "tokenizer_config.json").is_file():
            return list(self.end_tokens)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(llm_dir), local_files_only=True)
        ids = tokenizer.convert_tokens_to_ids(list(self.end_tokens))
        absent = (None, tokenizer.unk_token_id)
        return [token for token, token_id in zip(self.end_tokens, ids, strict=True) if token_id not in absent]

    def _options(self, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` over this model's option defaults."""
        return {**dataclasses.asdict(self.Options()), **given}

    def workload(self, deployment: Deployment) -> TextLLMWorkload:
        options = dict(deployment.point.options)
        return self._workload(deployment.entry_model, deployment.llm_dir, deployment.decoupled, options)

    def recognizes(self, model: ModelInfo) -> bool:
        """A served text ensemble: this model's (trtdeploy names the model in the ensemble's ``text_llm``
        parameter), or one that names none (TensorRT-LLM's own), which every text LLM recognizes."""
        from ..perf.llm import TextLLMWorkload

        return TextLLMWorkload.speaks(model) and model.parameters.get(TEXT_LLM_PARAMETER, self.name) == self.name

    def served_workload(self, model: ModelInfo, *, tokenizer_dir: Path | None) -> TextLLMWorkload:
        # how the served preprocessing encodes prompts is not in the ensemble's configuration: this model's defaults
        # of -o chat_template and -o add_special_tokens
        return self._workload(model.name, tokenizer_dir, model.decoupled, {})

    def _workload(
        self, model_name: str, tokenizer_dir: Path | None, decoupled: bool, options: dict[str, Any]
    ) -> TextLLMWorkload:
        """The text contract's workload, counting prompt tokens as a deployment with ``options`` encodes them."""
        from ..perf.llm import TextLLMWorkload

        options = self._options(options)
        return TextLLMWorkload(
            model_name=model_name,
            tokenizer_dir=tokenizer_dir,
            decoupled=decoupled,
            chat_template=bool(options["chat_template"]),
            add_special_tokens=bool(options["add_special_tokens"]),
        )


def _pbtxt_string(text: str) -> str:
    """``text`` escaped for a double-quoted string of a config.pbtxt."""
    return text.replace("\\", "\\\\").replace('"', '\\"')
