"""Dependencies point down: the perf engine knows nothing of trtdeploy's server records, deployments or plugins,
and no module imports another that imports it back (type-checking imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtdeploy"
#: What every layer may use: the error hierarchy, atomic file writes, the helpers of python-backend models, the checks
#: of a plugin's subclasses.
PRIMITIVES = {"trtdeploy.errors", "trtdeploy.fsutil", "trtdeploy.backend_utils", "trtdeploy.overrides"}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (model templates, which Triton loads, are not modules of it)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if any("templates" in part for part in parts):
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its source (inside functions and TYPE_CHECKING too)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                candidates = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(c for c in candidates if c in modules and c != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_perf_imports_nothing_above_it():
    graph = import_graph()
    upward = {
        module: sorted(
            target for target in targets if not target.startswith("trtdeploy.perf") and target not in PRIMITIVES
        )
        for module, targets in graph.items()
        if module.startswith("trtdeploy.perf")
    }
    assert {module: targets for module, targets in upward.items() if targets} == {}


def test_perf_has_no_import_cycles():
    graph = import_graph()
    perf = {module for module in graph if module.startswith("trtdeploy.perf")}
    assert cycles({module: graph[module] & perf for module in perf}) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
