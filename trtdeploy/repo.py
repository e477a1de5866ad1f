"""Rendering a Triton model repository from jinja2 templates, and validating what was rendered.

A template folder holds one subfolder per Triton model: ``<model>/config.pbtxt.j2`` is rendered, every other file
(``<model>/1/model.py`` …) is copied as it is. Rendering always goes into a fresh folder; templates stay untouched.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from .errors import BuildError

TEMPLATE_SUFFIX = ".j2"
CONFIG = "config.pbtxt"


@dataclass(frozen=True)
class TemplateSource:
    """Where the templates of some Triton models come from, and the variables they are rendered with."""

    root: Path
    models: tuple[str, ...]
    variables: Mapping[str, Any]


def template_models(root: Path) -> tuple[str, ...]:
    """The Triton models a template folder defines (subfolders holding a ``config.pbtxt.j2``)."""
    return tuple(sorted(p.parent.name for p in root.glob(f"*/{CONFIG}{TEMPLATE_SUFFIX}")))


def template_environment(root: Path) -> jinja2.Environment:
    """How trtdeploy renders its jinja2 templates: undefined variables fail, blocks leave no blank lines."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_model(source: TemplateSource, model: str, dest_root: Path) -> Path:
    """Render one Triton model into ``dest_root/<model>``; returns the rendered config.pbtxt."""
    src = source.root / model
    dest = dest_root / model
    if dest.exists():
        raise BuildError(f"two templates define the Triton model {model!r}")
    env = template_environment(source.root)
    for path in sorted(src.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(src)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.name.endswith(TEMPLATE_SUFFIX):
            template = env.get_template(f"{model}/{rel.as_posix()}")
            try:
                text = template.render(**source.variables)
            except jinja2.TemplateError as exc:
                raise BuildError(f"template {path} failed to render: {exc}") from exc
            target.with_name(target.name[: -len(TEMPLATE_SUFFIX)]).write_text(text)
        else:
            shutil.copy2(path, target)
    (dest / "1").mkdir(exist_ok=True)  # Triton needs a version folder, even an ensemble's empty one
    return dest / CONFIG


def render_repository(sources: Iterable[TemplateSource], dest_root: Path) -> dict[str, Path]:
    """Render every model of every source into ``dest_root`` (which must not exist yet) and validate each config,
    and each ensemble's wiring against the configs of its step models."""
    dest_root.mkdir(parents=True)
    configs: dict[str, Path] = {}
    templates: dict[str, Path] = {}
    for source in sources:
        for model in source.models:
            configs[model] = render_model(source, model, dest_root)
            templates[model] = source.root / model / f"{CONFIG}{TEMPLATE_SUFFIX}"
    parsed = {model: validate_config(config, expected_name=model) for model, config in configs.items()}
    for model, config in parsed.items():
        if config.platform == "ensemble":
            try:
                check_ensemble(model, config, parsed)
            except BuildError as exc:
                exc.hint = f"fix {templates[model]}: {WIRING_HINT}"
                raise
    return configs


def validate_config(path: Path, *, expected_name: str | None = None) -> Any:
    """Parse a config.pbtxt with Triton's own ``ModelConfig`` protobuf; raise BuildError on any problem.

    Also refuses leftover ``${…}`` placeholders (the failure mode of fill_template.py) and a ``name`` that does not
    match the model folder.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    text = path.read_text()
    if "${" in text:
        line = next(i for i, row in enumerate(text.splitlines(), 1) if "${" in row)
        raise BuildError(f"{path}:{line}: unfilled placeholder left in the rendered config")
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise BuildError(f"{path}: not a valid Triton model config: {exc}") from None
    if expected_name is not None and config.name and config.name != expected_name:
        raise BuildError(f"{path}: name {config.name!r} does not match its folder {expected_name!r}")
    if not config.backend and not config.platform:
        raise BuildError(f"{path}: neither backend nor platform is set")
    return config


#: What an ensemble's maps mean, for the hint of every wiring error.
WIRING_HINT = (
    "in each step, input_map and output_map map the step model's tensor (key) to the ensemble's (value), "
    "of one data type"
)


def check_ensemble(name: str, config: Any, models: Mapping[str, Any]) -> None:
    """Check an ensemble's wiring against the parsed configs of the repository's ``models``: BuildError naming the
    ensemble, the step model and the tensor at the first problem.

    Each step's model is in the repository; its ``input_map`` keys are inputs of that model and its ``output_map``
    keys outputs of it; each tensor it reads is an ensemble input or an earlier step's output, of the data type the
    model takes; no tensor is produced twice; every ensemble output is produced, of its declared data type.
    """
    from tritonclient.grpc import model_config_pb2

    def dtype(value: int) -> str:
        return model_config_pb2.DataType.Name(value)

    #: ensemble tensor -> (its data type, where it comes from)
    available = {tensor.name: (tensor.data_type, "the ensemble input") for tensor in config.input}
    for step in config.ensemble_scheduling.step:
        where = f"ensemble {name!r}, step {step.model_name!r}"
        model = models.get(step.model_name)
        if model is None:
            raise BuildError(f"{where}: the model repository has no model {step.model_name!r}")
        inputs = {tensor.name: tensor.data_type for tensor in model.input}
        for key, value in sorted(step.input_map.items()):
            if key not in inputs:
                raise BuildError(
                    f"{where}: input_map key {key!r} is not an input of {step.model_name!r} "
                    f"(its inputs: {', '.join(inputs) or 'none'})"
                )
            if value not in available:
                raise BuildError(
                    f"{where}: input {key!r} reads {value!r}, which no ensemble input or earlier step produces"
                )
            produced, origin = available[value]
            if produced != inputs[key]:
                raise BuildError(
                    f"{where}: input {key!r} is {dtype(inputs[key])} and reads {value!r}, {dtype(produced)} ({origin})"
                )
        outputs = {tensor.name: tensor.data_type for tensor in model.output}
        for key, value in sorted(step.output_map.items()):
            if key not in outputs:
                raise BuildError(
                    f"{where}: output_map key {key!r} is not an output of {step.model_name!r} "
                    f"(its outputs: {', '.join(outputs) or 'none'})"
                )
            if value in available:
                raise BuildError(f"{where}: output {key!r} writes {value!r}, which is {available[value][1]} already")
            available[value] = (outputs[key], f"output {key!r} of step {step.model_name!r}")
    for tensor in config.output:
        if tensor.name not in available:
            raise BuildError(f"ensemble {name!r}: output {tensor.name!r} is produced by no step")
        produced, origin = available[tensor.name]
        if produced != tensor.data_type:
            raise BuildError(
                f"ensemble {name!r}: output {tensor.name!r} is {dtype(tensor.data_type)} and {origin} is "
                f"{dtype(produced)}"
            )
