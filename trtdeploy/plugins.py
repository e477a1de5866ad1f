"""The plugin manager: built-in plugins, entry points of group ``trtdeploy``, and the registries they fill."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from . import hookspecs
from .errors import NotFoundError, TrtDeployWarning, UsageError
from .overrides import check_instance

if TYPE_CHECKING:
    from .engines.base import Engine
    from .spec import ModelSpec

ENTRY_POINT_GROUP = "trtdeploy"
#: Built-in plugins: loaded like any other plugin, through the same hooks.
DEFAULT_PLUGINS = ("trtdeploy.engines.torch", "trtdeploy.engines.trtllm", "trtdeploy.engines.trtllm_pytorch")
#: ``--engine`` value that picks the best usable engine.
AUTO_ENGINE = "auto"

pm = pluggy.PluginManager("trtdeploy")
pm.add_hookspecs(hookspecs)


class PluginLoadWarning(TrtDeployWarning):
    """A plugin failed to import; the others still load."""


@dataclass
class PluginInfo:
    name: str
    version: str | None
    hooks: list[str]
    models: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    #: Why the plugin looks broken though it loaded (it registers nothing); None: nothing to say.
    warning: str | None = None


_loaded = False
_failed: dict[str, str] = {}


def _allowed() -> set[str] | None:
    raw = os.environ.get("TRTDEPLOY_LOAD_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def load_plugins() -> None:
    """Register the built-in plugins and every installed entry point (once per process)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    allowed = _allowed()
    for module_name in DEFAULT_PLUGINS:
        if not pm.has_plugin(module_name):
            pm.register(importlib.import_module(module_name), name=module_name)
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if allowed is not None and entry_point.name not in allowed:
            continue
        if pm.has_plugin(entry_point.name) or pm.is_blocked(entry_point.name):
            continue
        try:
            pm.register(entry_point.load(), name=entry_point.name)
            pm.check_pending()  # a hook name no spec knows (a typo) is this plugin's error
        except Exception as exc:  # a broken plugin must not take the others down
            if pm.has_plugin(entry_point.name):
                pm.unregister(name=entry_point.name)
            _skip(entry_point.name, exc)
            continue
        _entry_points.add(entry_point.name)
        if entry_point.dist is not None:
            _versions[entry_point.name] = entry_point.dist.version
    if os.environ.get("TRTDEPLOY_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda text: sys.stderr.write(text))
        pm.enable_tracing()


_versions: dict[str, str] = {}
#: The plugins loaded from entry points (the installed distributions), by name.
_entry_points: set[str] = set()


def _skip(name: str, exc: Exception) -> None:
    _failed[name] = f"{type(exc).__name__}: {exc}"
    warnings.warn(f"plugin {name!r} failed to load and is skipped ({_failed[name]})", PluginLoadWarning, stacklevel=3)


def failed_plugins() -> dict[str, str]:
    """Plugins that failed to load or to register, with the error."""
    load_plugins()
    return dict(_failed)


def _each_plugin(hook_name: str) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Each plugin implementing a hook, with a caller of its implementation alone (through pluggy: traced)."""
    load_plugins()
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        others = [plugin for plugin in pm.get_plugins() if plugin is not impl.plugin]
        yield pm.get_name(impl.plugin) or repr(impl.plugin), pm.subset_hook_caller(hook_name, remove_plugins=others)


def call_each(hook_name: str, **kwargs: Any) -> None:
    """Call a hook on every plugin; one whose implementation raises is skipped with a warning."""
    for owner, caller in _each_plugin(hook_name):
        try:
            caller(**kwargs)
        except Exception as exc:
            _skip(owner, exc)


def _collect(hook_name: str, kind: str, base: type) -> dict[str, tuple[Any, str]]:
    """Call a ``register_*`` hook plugin by plugin, noting who registered what.

    A plugin whose hook raises, or registers what is not a sound ``base`` instance
    (:func:`~trtdeploy.overrides.check_instance`) or one name twice, is skipped with a warning; two plugins
    registering one name is an error.
    """
    found: dict[str, tuple[Any, str]] = {}
    for owner, caller in _each_plugin(hook_name):
        registered: dict[str, Any] = {}

        def register(obj: Any, registered: dict[str, Any] = registered) -> None:
            check_instance(obj, kind, base)
            if obj.name in registered:
                raise ValueError(f"{kind} {obj.name!r} is registered twice")
            registered[obj.name] = obj

        try:
            caller(register=register)
        except Exception as exc:
            _skip(owner, exc)
            continue
        for name, obj in registered.items():
            if name in found:
                raise UsageError(f"{kind} {name!r} is registered by both {found[name][1]!r} and {owner!r}")
            found[name] = (obj, owner)
    return found


@cache
def _models() -> dict[str, tuple[ModelSpec, str]]:
    from .spec import ModelSpec

    return _collect("register_models", "model", ModelSpec)


@cache
def _engines() -> dict[str, tuple[Engine, str]]:
    from .engines.base import Engine

    return _collect("register_engines", "engine", Engine)


def get_models() -> dict[str, ModelSpec]:
    return {name: spec for name, (spec, _) in sorted(_models().items())}


def get_engines() -> dict[str, Engine]:
    return {name: engine for name, (engine, _) in sorted(_engines().items())}


def _lookup(registry: dict[str, Any], kind: str, name: str) -> Any:
    if name not in registry:
        known = ", ".join(registry) or "none installed"
        raise NotFoundError(f"unknown {kind} {name!r}", hint=f"installed {kind}s: {known} (see `trtdeploy plugins`)")
    return registry[name]


def get_model(name: str) -> ModelSpec:
    return _lookup(get_models(), "model", name)


def get_engine(name: str, *, on_cpu: bool = False, encoder_decoder: bool = False) -> Engine:
    """The engine called ``name``; ``auto``: the usable one of highest rank (see :attr:`Engine.rank`) that runs on
    the CPU when ``on_cpu`` and serves encoder-decoder models when ``encoder_decoder``."""
    if name == AUTO_ENGINE:
        return best_engine(on_cpu=on_cpu, encoder_decoder=encoder_decoder)
    return _lookup(get_engines(), "engine", name)


def best_engine(*, on_cpu: bool = False, encoder_decoder: bool = False) -> Engine:
    """The usable engine of highest rank (UsageError listing why each is unusable when none is)."""
    engines = sorted(get_engines().values(), key=lambda engine: -engine.rank)
    reasons = []
    for engine in engines:
        if on_cpu and not engine.runs_on_cpu:
            reason = "builds for a GPU only"
        elif encoder_decoder and not engine.serves_encoder_decoder:
            reason = "serves no encoder-decoder model"
        else:
            reason = engine.unavailable_reason()
        if reason is None:
            return engine
        reasons.append(f"{engine.name}: {reason}")
    raise UsageError("no engine is usable here (" + "; ".join(reasons or ["none is installed"]) + ")")


def _version_of(plugin: ModuleType | Any, name: str) -> str | None:
    if name in _versions:
        return _versions[name]
    if name.startswith("trtdeploy."):
        from . import __version__

        return __version__
    return getattr(plugin, "__version__", None)


def list_plugins() -> list[PluginInfo]:
    """Every registered plugin with its version, the hooks it implements and what it registered."""
    load_plugins()
    infos: dict[str, PluginInfo] = {}
    for plugin in pm.get_plugins():
        name = pm.get_name(plugin) or repr(plugin)
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])
        infos[name] = PluginInfo(name=name, version=_version_of(plugin, name), hooks=hooks)
    for model, (_, owner) in _models().items():
        infos[owner].models.append(model)
    for engine, (_, owner) in _engines().items():
        infos[owner].engines.append(engine)
    for info in infos.values():
        reason = _why_nothing_registered(info)
        info.warning = f"plugin {info.name!r} registers nothing: {reason}" if reason else None
    return sorted(infos.values(), key=lambda info: info.name)


def _why_nothing_registered(info: PluginInfo) -> str | None:
    """Why a loaded plugin adds nothing to trtdeploy (None: it registers a model or an engine, or adds commands)."""
    if not info.hooks:
        return "it implements no hook (mark its register_* functions with @trtdeploy.hookimpl)"
    if info.models or info.engines or "register_commands" in info.hooks:
        return None
    return (
        f"its {', '.join(info.hooks)} registered no model or engine "
        "(call register(obj) for each one: what a hook returns is not read)"
    )


def forget_registrations() -> None:
    """Forget the cached model and engine registries: plugins registered or unregistered since are seen next time."""
    _models.cache_clear()
    _engines.cache_clear()


@contextmanager
def only_plugins(names: Collection[str]) -> Iterator[None]:
    """Within the block, the installed plugins (entry points) are those of ``names`` only; the built-in ones and
    those registered in this process stay. Tests use it to see only the plugins they name."""
    load_plugins()
    hidden = {name: pm.unregister(name=name) for name in sorted(_entry_points - set(names)) if pm.has_plugin(name)}
    forget_registrations()
    try:
        yield
    finally:
        for name, plugin in hidden.items():
            pm.register(plugin, name=name)
        forget_registrations()
