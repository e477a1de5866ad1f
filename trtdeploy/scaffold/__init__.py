"""``trtdeploy new-plugin``: a model-plugin distribution that installs, builds, serves and passes its own tests as
written, for the author to change part by part.

The files are jinja2 templates (``StrictUndefined``, as model repositories are rendered) under ``templates/``: one
folder of layers per kind, a later layer's file replacing an earlier one's. A file's path may hold ``{module}`` and
``{name}``; ``.j2`` is dropped from its name. The plugin is written into a scratch folder beside its place and renamed
into it once complete: a failure leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import keyword
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import __version__
from ..errors import UsageError
from ..fsutil import scratch_beside
from ..repo import template_environment

Kind = Literal["text-llm", "tts", "asr"]
KINDS: tuple[Kind, ...] = ("text-llm", "tts", "asr")
TEMPLATES = Path(__file__).parent / "templates"
#: The template folders each kind is rendered from, in order.
LAYERS: dict[Kind, tuple[str, ...]] = {
    "text-llm": ("common", "text_llm"),
    "tts": ("common", "speech", "tts"),
    "asr": ("common", "speech", "asr"),
}
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*\Z")
#: Triton model names of the deployments the kinds render: a plugin's entry model may not take one.
RESERVED_NAMES = frozenset({"tensorrt_llm", "ensemble", "preprocessing", "postprocessing"})
#: Names the generated code imports, which a spec class named after the plugin would shadow (``none`` makes ``None``).
TEMPLATE_IMPORTS = frozenset(
    {"ASRWorkload", "Deployment", "Mode", "ModelSpec", "TTSWorkload", "TextLLMSpec", "UsageError", "Path", "Any"}
)


@dataclass(frozen=True)
class PluginNames:
    """The names one plugin goes by (its templates see these as ``plugin.*``)."""

    #: The model name users type (``trtdeploy build NAME``), also the entry model of a speech plugin.
    name: str
    kind: Kind
    #: The distribution (``trtdeploy-my-llm``) and its module (``trtdeploy_my_llm``).
    distribution: str
    module: str
    #: The spec's class name (``MyLlm``).
    class_name: str
    #: The trtdeploy release the plugin is written for (its dependency's floor).
    trtdeploy_version: str


@dataclass(frozen=True)
class WrittenPlugin:
    path: Path
    names: PluginNames
    #: The files written, relative to ``path``.
    files: tuple[str, ...]


def plugin_names(name: str, kind: Kind) -> PluginNames:
    """The names of plugin ``name``; UsageError when ``name`` cannot be a model, module and distribution name."""
    if not NAME_PATTERN.match(name) or keyword.iskeyword(name):
        raise UsageError(
            f"plugin name {name!r} is not a lower-case Python identifier",
            hint="use lower-case letters, digits and underscores, starting with a letter, e.g. my_llm",
        )
    if name in RESERVED_NAMES:
        raise UsageError(
            f"plugin name {name!r} is a Triton model of every deployment", hint=f"choose another name, e.g. my_{name}"
        )
    class_name = "".join(part.capitalize() for part in name.split("_"))
    if keyword.iskeyword(class_name) or class_name in TEMPLATE_IMPORTS:
        raise UsageError(
            f"plugin name {name!r} makes the class name {class_name}, which the plugin's code cannot use",
            hint=f"choose another name, e.g. my_{name}",
        )
    return PluginNames(
        name=name,
        kind=kind,
        distribution="trtdeploy-" + name.replace("_", "-"),
        module=f"trtdeploy_{name}",
        class_name=class_name,
        trtdeploy_version=__version__,
    )


def _refuse_installed(names: PluginNames) -> None:
    from ..plugins import get_models

    if names.name in get_models():
        raise UsageError(
            f"a model named {names.name!r} is already installed",
            hint="choose another name (`trtdeploy plugins` lists the installed models)",
        )
    if importlib.util.find_spec(names.module) is not None:
        raise UsageError(
            f"a module named {names.module!r} is already installed",
            hint=f"choose another name, or `pip uninstall {names.distribution}` first",
        )


def _refuse_occupied(target: Path) -> None:
    if target.is_dir() and not any(target.iterdir()):
        return
    if target.exists() or target.is_symlink():
        raise UsageError(
            f"{target} already exists and is not an empty folder",
            hint="choose another --output-dir or name; new-plugin never overwrites",
        )


def _sources(kind: Kind, names: PluginNames) -> dict[str, str]:
    """Each file to write (its path in the plugin) and its template (its path under :data:`TEMPLATES`); a later
    layer's template replaces an earlier one's."""
    sources: dict[str, str] = {}
    for layer in LAYERS[kind]:
        root = TEMPLATES / layer
        for path in sorted(root.rglob("*.j2")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).as_posix().removesuffix(".j2")
            sources[rel.format(module=names.module, name=names.name)] = f"{layer}/{path.relative_to(root).as_posix()}"
    return sources


def render(kind: Kind, names: PluginNames, dest: Path) -> tuple[str, ...]:
    """Render the plugin's files into the folder ``dest``; returns their paths, relative to it."""
    env = template_environment(TEMPLATES)
    sources = _sources(kind, names)
    for rel, template in sources.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(env.get_template(template).render(plugin=names), encoding="utf-8")
    return tuple(sorted(sources))


def write_plugin(name: str, *, kind: Kind, output_dir: Path) -> WrittenPlugin:
    """Write plugin ``name`` of ``kind`` into ``output_dir/name`` (a new or empty folder), all at once."""
    names = plugin_names(name, kind)
    _refuse_installed(names)
    target = output_dir / name
    _refuse_occupied(target)
    scratch = scratch_beside(target, prefix=f".{name}-", error=UsageError, hint="choose a folder you can write to")
    try:
        files = render(kind, names, scratch)
        os.rename(scratch, target)  # onto a missing or empty folder only: a folder filled meanwhile is kept
    except OSError as exc:
        raise UsageError(
            f"cannot write {target} ({exc.strerror or exc})", hint="choose an empty or new folder you can write to"
        ) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return WrittenPlugin(path=target, names=names, files=files)
