"""Guards on the plugin base classes (``ModelSpec``, ``Engine``, ``Workload``): a subclass that misspells a member
or overrides a method with an incompatible signature is reported where it is registered, not ignored at run time.
"""

from __future__ import annotations

import difflib
import inspect
import reprlib
from typing import Any

#: How close a subclass's own member name must be to a base member it leaves alone to be taken for a misspelling.
MISSPELLING_CUTOFF = 0.85


def base_members(base: type) -> dict[str, Any]:
    """The public members of ``base`` and its bases: methods, properties, class attributes with a value (the
    member itself) and attributes only declared by an annotation (``inspect.Parameter.empty``)."""
    members: dict[str, Any] = {}
    for klass in reversed(base.__mro__[:-1]):  # without object
        for name in getattr(klass, "__annotations__", {}):
            members.setdefault(name, inspect.Parameter.empty)
        members.update(vars(klass))
    return {name: member for name, member in members.items() if not name.startswith("_")}


def override_problems(cls: type, base: type) -> list[str]:
    """What is wrong with ``cls`` as a subclass of ``base``: each member it seems to misspell, each method it
    replaces by something else, each override that cannot take the arguments the core passes."""
    known = base_members(base)
    own = {
        name: member
        for klass in reversed(cls.__mro__)
        if klass not in base.__mro__
        for name, member in vars(klass).items()
        if not name.startswith("_")
    }
    problems = []
    for name, member in own.items():
        if name in known:
            problems.extend(_signature_problems(name, member, known[name], base))
            continue
        left_alone = [candidate for candidate in known if candidate not in own]
        close = difflib.get_close_matches(name, left_alone, n=1, cutoff=MISSPELLING_CUTOFF)
        if close:
            problems.append(
                f"{name!r} is not a member of {base.__name__}: a misspelling of {close[0]!r}? (a helper of your "
                "own: name it with a leading _)"
            )
    return problems


def _signature_problems(name: str, member: Any, original: Any, base: type) -> list[str]:
    if not inspect.isfunction(original):
        return []
    function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
    if not inspect.isfunction(function):
        return [f"{name!r} is a method of {base.__name__}, but is set to a {type(member).__name__} here"]
    expected = inspect.signature(original)
    actual = inspect.signature(function)
    if isinstance(member, staticmethod):  # called on the instance as the method is: no self to take
        instance = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        actual = actual.replace(parameters=[instance, *actual.parameters.values()])
    problem = _incompatibility(expected, actual)
    if problem is None:
        return []
    return [f"{name}{_plain(actual)} cannot stand for {base.__name__}.{name}{_plain(expected)}: {problem}"]


def _plain(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without its annotations, for messages."""
    params = [param.replace(annotation=param.empty) for param in signature.parameters.values()]
    return signature.replace(parameters=params, return_annotation=signature.empty)


def _incompatibility(expected: inspect.Signature, actual: inspect.Signature) -> str | None:
    """Why a method of signature ``actual`` cannot be called as one of signature ``expected`` is (None: it can)."""
    params = list(actual.parameters.values())
    takes_args = any(p.kind is p.VAR_POSITIONAL for p in params)
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    accepted = set()
    for index, param in enumerate(expected.parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind is param.KEYWORD_ONLY:
            if param.name not in by_name and not takes_kwargs:
                return f"no keyword argument {param.name!r}"
            accepted.add(param.name)
            continue
        if index < len(positional):  # the core passes these by position: their names are the plugin's
            accepted.add(positional[index].name)
        elif not takes_args:
            return f"no argument {param.name!r}"
    extra = [
        p.name
        for p in params
        if p.name not in accepted and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty
    ]
    return f"it needs {', '.join(extra)}, which the core does not pass" if extra else None


def missing_members(obj: object, base: type) -> list[str]:
    """The members ``base`` declares without a value that ``obj`` has none of (an engine without ``name``)."""
    return [
        name
        for name, member in base_members(base).items()
        if member is inspect.Parameter.empty and not hasattr(obj, name)
    ]


def check_instance(obj: Any, kind: str, base: type) -> None:
    """TypeError unless ``obj`` is a ``base`` instance with every member ``base`` declares, none misspelt, and
    methods the core can call as the base's; ``kind`` names it in the message (``model``, ``engine``, ``the
    workload of model 'whisper'``)."""
    if not isinstance(obj, base):
        raise TypeError(f"{kind} {reprlib.repr(obj)} ({type(obj).__name__}) is not a {base.__name__}")
    problems = [f"{name!r} is not set" for name in missing_members(obj, base)]
    # against the nearest class of trtdeploy's it derives from: a TextLLMSpec's own members are guarded too
    nearest = next(klass for klass in type(obj).__mro__ if klass.__module__.split(".")[0] == "trtdeploy")
    problems += override_problems(type(obj), nearest)
    if problems:
        raise TypeError(f"{kind} {type(obj).__name__}: {'; '.join(problems)}")
