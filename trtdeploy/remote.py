"""The workload of a Triton model served where no deployment folder of it is at hand: ``trtdeploy perf --url
HOST:PORT --model NAME`` of a server that trtdeploy did not start here (a cloud or serverless host, a cluster).

The served model's configuration decides: every model plugin is asked whether it recognizes the model
(:meth:`~trtdeploy.spec.ModelSpec.recognizes`), and the core recognizes the LLM contract itself (the token-level
``tensorrt_llm`` model that the engines serve); ``--workload`` names one instead. A deployment folder that merely
happens to be here is never used: its build says nothing about the remote server's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .errors import UsageError

if TYPE_CHECKING:
    from .perf.runner import Endpoint
    from .perf.workload import ModelInfo, Workload

#: ``--workload`` of the LLM contract itself: token ids in and out (no plugin's; every engine serves it).
LLM_CONTRACT = "tensorrt_llm"


@dataclass(frozen=True)
class RemoteTarget:
    """The workload of a served model, and how it was chosen (``summary.json`` records it under ``remote``)."""

    workload: Workload
    #: What made the workload: an installed model (its ``trtdeploy build`` name), or LLM_CONTRACT.
    name: str
    chosen_by: Literal["config", "--workload"]
    #: The model that answers in one response beside a decoupled one, in a deployment of that model (refusals name
    #: it); None: there is none.
    offline_model: str | None = None
    #: ``--tokenizer`` as given.
    tokenizer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.name, "chosen_by": self.chosen_by, "tokenizer": self.tokenizer}


def workload_names() -> list[str]:
    """Every ``--workload`` value: the installed models and the LLM contract."""
    from .plugins import get_models

    return sorted({*get_models(), LLM_CONTRACT})


def recognized_by(model: ModelInfo, warn: Callable[[str], None]) -> list[str]:
    """The workloads whose models recognize ``model``; a model plugin that fails to tell is skipped (``warn``)."""
    from .perf.llm import TokenLLMWorkload
    from .plugins import get_models

    found = []
    for name, spec in get_models().items():
        try:
            if spec.recognizes(model):
                found.append(name)
        except Exception as exc:  # a broken plugin must not take the others down
            warn(f"model {name!r} failed to tell whether it serves {model.name!r} ({type(exc).__name__}: {exc})")
    return [*found, LLM_CONTRACT] if TokenLLMWorkload.speaks(model) else found


def choose_workload(model: ModelInfo, url: str, forced: str | None, warn: Callable[[str], None]) -> str:
    """The workload of ``model``: ``forced`` (``--workload``) if given, else the only one that recognizes it, or the
    first of several that would load it alike."""
    names = workload_names()
    if forced is not None:
        if forced not in names:
            hint = f"choose one of {', '.join(names)}"
            raise UsageError(f"--workload {forced!r} is not an installed model", hint=hint)
        return forced
    found = recognized_by(model, warn)
    if not found:
        tensors = f"inputs {', '.join(model.inputs) or 'none'}; outputs {', '.join(model.outputs) or 'none'}"
        raise UsageError(
            f"no installed workload recognizes model {model.name!r} at {url} ({tensors})",
            hint=f"is --model the model clients call? Else name its workload with --workload ({', '.join(names)})",
        )
    if len(found) > 1 and not _load_alike(model, found):
        raise UsageError(
            f"model {model.name!r} at {url} is recognized by several workloads: {', '.join(found)}",
            hint=f"choose one with --workload {found[0]}",
        )
    return found[0]


def _load_alike(model: ModelInfo, names: list[str]) -> bool:
    """Whether the models ``names`` would load ``model`` alike: the same workload with the same settings (the text
    LLMs, for TensorRT-LLM's own text ensemble, which names no model), so that taking the first changes nothing."""
    from .plugins import get_models

    if LLM_CONTRACT in names:
        return False
    specs = get_models()
    loads = set()
    for name in names:
        try:
            workload = specs[name].served_workload(model, tokenizer_dir=None)
        except Exception:  # noqa: BLE001 - a model that cannot load it alone is no tie to break
            return False
        loads.add((type(workload), repr(sorted(vars(workload).items()))))
    return len(loads) == 1


def _tokenizer_use(workload: Workload, model: ModelInfo, inputs_use: str | None) -> str | None:
    """What the run needs the tokenizer of an LLM for (None: nothing), ``inputs_use`` what its inputs need it for."""
    from .perf.llm import TextLLMWorkload, TokenLLMWorkload

    if isinstance(workload, TokenLLMWorkload):
        return "the token ids it takes and returns"
    if isinstance(workload, TextLLMWorkload):
        if inputs_use is not None:
            return inputs_use
        if "output_ids" not in model.outputs:
            return "counting its output tokens (it returns text without output_ids)"
    return None


async def served_model(endpoint: Endpoint, name: str | None) -> ModelInfo:
    """The configuration of model ``name`` at ``endpoint`` (ServerError if the server does not answer); without a
    name, UsageError listing its ready models when the server lists them."""
    from .perf.control import ControlClient

    control = ControlClient(endpoint.protocol, endpoint.url, headers=endpoint.headers)
    try:
        await control.check_live()
        if name is None:
            states = await control.model_states()
            ready = sorted(model for model, entry in (states or {}).items() if entry.get("state") == "READY")
            raise UsageError(
                f"the server at {endpoint.url} is not one that `trtdeploy serve` started here: name the model to "
                "load with --model",
                hint=f"its ready models: {', '.join(ready)}" if ready else "e.g. --model ensemble",
            )
        return await control.model_info(name)
    finally:
        await control.close()


def resolve_remote(
    endpoint: Endpoint,
    model_name: str | None,
    *,
    forced: str | None,
    tokenizer: str | None,
    inputs_use: str | None,
    warn: Callable[[str], None],
) -> RemoteTarget:
    """The workload of model ``model_name`` at ``endpoint`` (see the module docstring), with the tokenizer
    ``--tokenizer`` names; refused, naming what is missing, when the run needs a tokenizer and has none (its inputs
    need one for ``inputs_use``: :attr:`~trtdeploy.perf.runner.InputSpec.tokenizer_use`)."""
    from .download import tokenizer_folder
    from .perf.llm import TokenLLMWorkload, load_tokenizer
    from .perf.workload import check_workload
    from .plugins import get_model

    model = asyncio.run(served_model(endpoint, model_name))
    name = choose_workload(model, endpoint.url, forced, warn)
    spec = None if name == LLM_CONTRACT else get_model(name)

    def make(tokenizer_dir: Path | None) -> Workload:
        if spec is None:
            return TokenLLMWorkload(model.name, tokenizer_dir, decoupled=model.decoupled)
        return check_workload(spec.served_workload(model, tokenizer_dir=tokenizer_dir), spec.name)

    workload = make(None)
    if tokenizer is not None:
        if workload.family == "tts":
            raise UsageError(f"--tokenizer is the tokenizer of an LLM or Whisper; {model.name!r} is a TTS model")
        folder = tokenizer_folder(tokenizer)
        load_tokenizer(folder)  # a folder without a usable tokenizer is named before the load
        workload = make(folder)
    else:
        use = _tokenizer_use(workload, model, inputs_use)
        if use is not None:
            raise UsageError(
                f"model {model.name!r} at {endpoint.url} is an LLM served without a deployment folder here: {use} "
                "need its tokenizer",
                hint="pass --tokenizer with the served model's Hugging Face tokenizer: a folder, or a Hub name",
            )
    chosen_by: Literal["config", "--workload"] = "config" if forced is None else "--workload"
    # the model beside a decoupled entry model of a streaming deployment of ``spec`` that answers in one response
    entry = spec is not None and model.decoupled and model.name == spec.entry_model("streaming")
    offline = spec.offline_model("streaming") if spec is not None and entry else None
    return RemoteTarget(workload, name, chosen_by, offline_model=offline, tokenizer=tokenizer)
