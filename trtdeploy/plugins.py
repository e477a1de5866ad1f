"""The plugin manager: built-in plugins, entry points of group ``trtdeploy``, and the registries they fill."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import warnings
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from . import hookspecs
from .errors import NotFoundError, UsageError

if TYPE_CHECKING:
    from .engines.base import Engine
    from .spec import ModelSpec

ENTRY_POINT_GROUP = "trtdeploy"
#: Built-in plugins: loaded like any other plugin, through the same hooks.
DEFAULT_PLUGINS = ("trtdeploy.engines.torch",)

pm = pluggy.PluginManager("trtdeploy")
pm.add_hookspecs(hookspecs)


class PluginLoadWarning(UserWarning):
    """A plugin failed to import; the others still load."""


@dataclass
class PluginInfo:
    name: str
    version: str | None
    hooks: list[str]
    models: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)


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
            plugin = entry_point.load()
        except Exception as exc:  # a broken plugin must not take the others down
            _failed[entry_point.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"plugin {entry_point.name!r} failed to load and is skipped ({type(exc).__name__}: {exc})",
                PluginLoadWarning,
                stacklevel=2,
            )
            continue
        pm.register(plugin, name=entry_point.name)
        if entry_point.dist is not None:
            _versions[entry_point.name] = entry_point.dist.version
    pm.check_pending()
    if os.environ.get("TRTDEPLOY_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda text: sys.stderr.write(text))
        pm.enable_tracing()


_versions: dict[str, str] = {}


def failed_plugins() -> dict[str, str]:
    """Plugins whose import failed, with the error."""
    load_plugins()
    return dict(_failed)


def _collect(hook_name: str, kind: str) -> dict[str, tuple[Any, str]]:
    load_plugins()
    found: dict[str, tuple[Any, str]] = {}
    hook = getattr(pm.hook, hook_name)
    for impl in hook.get_hookimpls():
        owner = pm.get_name(impl.plugin) or repr(impl.plugin)

        def register(obj: Any, owner: str = owner) -> None:
            name = obj.name
            if name in found and found[name][1] != owner:
                raise UsageError(f"{kind} {name!r} is registered by both {found[name][1]!r} and {owner!r}")
            found[name] = (obj, owner)

        impl.function(register=register)
    return found


@cache
def _models() -> dict[str, tuple[ModelSpec, str]]:
    return _collect("register_models", "model")


@cache
def _engines() -> dict[str, tuple[Engine, str]]:
    return _collect("register_engines", "engine")


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


def get_engine(name: str) -> Engine:
    return _lookup(get_engines(), "engine", name)


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
    return sorted(infos.values(), key=lambda info: info.name)


def reset_for_tests() -> None:
    """Forget cached registries (tests register and unregister plugins)."""
    _models.cache_clear()
    _engines.cache_clear()
