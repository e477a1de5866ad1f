"""trtdeploy plugin for Qwen2, Qwen2.5 and Qwen3 LLMs: text in, text out, through a TRT-LLM-style ensemble.

The deployment is ``preprocessing`` (tokenizer) → ``tensorrt_llm`` (the engine, provided by the core) →
``postprocessing`` (detokenizer), joined as ``ensemble``: the tensors of tensorrtllm_backend's
``inflight_batcher_llm`` ensemble of the release the deployment targets (:mod:`.ensemble`), so its clients work
unchanged; an input the engine cannot honour is refused by name, never ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trtdeploy
from trtdeploy import BuildContext, Deployment, Mode, ModelSpec, UsageError

from . import ensemble

if TYPE_CHECKING:
    from trtdeploy.perf.llm import TextLLMWorkload
    from trtdeploy.perf.workload import ModelInfo

__version__ = "0.1.0"

#: Architectures this plugin deploys (the engine decides what it can serve).
ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
REQUIRED_FILES = ("config.json", "tokenizer_config.json")


@dataclass(frozen=True)
class QwenOptions:
    """Settings of a qwen_llm deployment (``trtdeploy build qwen_llm -o KEY=VALUE``)."""

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


class QwenLLM(ModelSpec):
    name = "qwen_llm"
    description = "Qwen2, Qwen2.5 and Qwen3 causal LMs: text in, text out (TRT-LLM ensemble tensors)"
    default_repo = "Qwen/Qwen2.5-0.5B-Instruct"
    templates_dir = Path(__file__).parent / "templates"
    default_max_input_len = 2048
    default_max_output_len = 1024
    Options = QwenOptions

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
        if not set(architectures) & set(ARCHITECTURES):
            raise UsageError(
                f"{checkpoint_dir} is a {', '.join(architectures) or 'model of unknown architecture'}, "
                f"not one of {', '.join(ARCHITECTURES)}"
            )

    def write_random_checkpoint(self, dest: Path, *, seed: int = 0) -> None:
        from trtdeploy.checkpoints import write_random_causal_lm

        write_random_causal_lm(dest, architecture="Qwen2ForCausalLM", seed=seed)

    def entry_model(self, mode: Mode) -> str:
        return "ensemble"

    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        release = ensemble.release(ctx)
        tensors = {
            "release": release.label,
            "inputs": ensemble.inputs(release),
            "outputs": ensemble.outputs(release),
        }
        return {"tokenizer_dir": str(ctx.llm_dir), **ctx.options, "ensemble": tensors}

    def workload(self, deployment: Deployment) -> TextLLMWorkload:
        from trtdeploy.perf.llm import TextLLMWorkload

        options = dict(deployment.point.options)
        return TextLLMWorkload(
            model_name=deployment.entry_model,
            tokenizer_dir=deployment.llm_dir,
            decoupled=deployment.decoupled,
            chat_template=bool(options.get("chat_template", False)),
            add_special_tokens=bool(options.get("add_special_tokens", True)),
        )

    def recognizes(self, model: ModelInfo) -> bool:
        from trtdeploy.perf.llm import TextLLMWorkload

        return TextLLMWorkload.speaks(model)

    def served_workload(self, model: ModelInfo, *, tokenizer_dir: Path | None) -> TextLLMWorkload:
        from trtdeploy.perf.llm import TextLLMWorkload

        # how the served preprocessing encodes prompts is not in the ensemble's configuration: the defaults of
        # -o chat_template and -o add_special_tokens (plain encoding with the tokenizer's special tokens)
        return TextLLMWorkload(model_name=model.name, tokenizer_dir=tokenizer_dir, decoupled=model.decoupled)


@trtdeploy.hookimpl
def register_models(register: Any) -> None:
    register(QwenLLM())
