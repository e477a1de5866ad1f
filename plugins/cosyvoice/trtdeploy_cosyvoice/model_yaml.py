"""Reading the checkpoint's ``cosyvoice2.yaml`` / ``cosyvoice3.yaml`` without running it.

The official file is a HyperPyYAML document: ``!new:module.Class`` builds an object from the mapping under it,
``!name:module.function`` binds arguments, ``!apply:`` calls at load time (seeding RNGs) and ``!ref <key>`` refers
to another top-level value, possibly in arithmetic (``!ref <chunk_size> * <token_mel_ratio>``). Here nothing is
imported or called: a tagged mapping becomes a plain dict with its tag's target under ``"_target"``, references are
resolved, and the sizes the plugin's modules need are read from the result.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from typing import Any

from trtdeploy import UsageError

TARGET = "_target"
_REFERENCE = re.compile(r"<([\w.]+)>")
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class _Reference(str):
    """A ``!ref`` expression, resolved once the whole document is read."""


def _loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            return {TARGET: suffix, **loader.construct_mapping(node, deep=True)}
        if isinstance(node, yaml.SequenceNode):
            return {TARGET: suffix, "args": loader.construct_sequence(node, deep=True)}
        return {TARGET: suffix}

    for prefix in ("!new:", "!name:", "!apply:"):
        Loader.add_multi_constructor(prefix, tagged)
    Loader.add_constructor("!ref", lambda loader, node: _Reference(loader.construct_scalar(node)))
    return Loader


def _evaluate(expression: str) -> Any:
    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(expression)

    return walk(ast.parse(expression, mode="eval").body)


def _resolve(value: Any, document: dict[str, Any], path: Path) -> Any:
    if isinstance(value, dict):
        return {key: _resolve(item, document, path) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, document, path) for item in value]
    if not isinstance(value, _Reference):
        return value
    names = _REFERENCE.findall(value)
    missing = [name for name in names if name not in document]
    if missing:
        raise UsageError(f"{path}: !ref {value} names {missing[0]}, which the file does not define")
    if _REFERENCE.fullmatch(value.strip()):
        return _resolve(document[names[0]], document, path)
    text = _REFERENCE.sub(lambda match: repr(_resolve(document[match.group(1)], document, path)), value)
    try:
        return _evaluate(text)
    except (SyntaxError, ValueError, TypeError):
        raise UsageError(f"{path}: cannot evaluate !ref {value}") from None


def read_model_yaml(path: Path) -> dict[str, Any]:
    """The document with its tags as ``_target`` keys and its references resolved."""
    import yaml

    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_loader())  # noqa: S506 (a SafeLoader)
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict):
        raise UsageError(f"{path} is not a CosyVoice model yaml (no top-level mapping)")
    return _resolve(document, document, path)
