"""The plugin author's contract as docs/writing-plugins.md states it: the public API is what ``trtdeploy`` exports,
every name of it is listed there, the bundled plugins import nothing else of trtdeploy, and the LLM contract's tables
are the tensors the engines declare."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import trtdeploy
from trtdeploy.engines.contract import INPUTS, OUTPUTS

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "writing-plugins.md"


def _section(title: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table_rows(text: str) -> list[list[str]]:
    """The cells of every table row in ``text`` (header and rule rows left out)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines]
    return [row for row in rows if row[0] and not set(row[0]) <= {"-"} and row[0] not in {"tensor", "name"}]


def test_every_public_name_is_exported_and_documented():
    documented = set()
    for name_cell, _ in _table_rows(_section("8. The public API")):
        documented.update(re.findall(r"`([^`]+)`", name_cell))
    assert documented == set(trtdeploy.__all__)
    for name in trtdeploy.__all__:
        assert getattr(trtdeploy, name) is not None, name


def private_imports(package: Path) -> list[str]:
    """Where the python files under ``package`` import a module of trtdeploy rather than ``trtdeploy`` itself."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            found += [
                f"{path.relative_to(package)}:{node.lineno} {module}"
                for module in modules
                if module.startswith("trtdeploy.")
            ]
    return found


def test_the_bundled_plugins_import_only_the_public_api():
    for package in sorted(ROOT.glob("plugins/*/trtdeploy_*")):
        assert private_imports(package) == [], package.name


def test_the_llm_contract_tables_are_the_tensors_the_engines_declare():
    section = _section("3. The LLM contract")
    inputs_text, outputs_text = section.split("\nOutputs:\n")
    for text, tensors in ((inputs_text, INPUTS), (outputs_text, OUTPUTS)):
        documented = [tuple(cell.strip("`") for cell in row) for row in _table_rows(text)]
        declared = [(t.name, t.data_type, "[" + ", ".join(map(str, t.dims)) + "]") for t in tensors]
        assert documented == declared
