"""The README's two commands are the ones that are kept working: .ci/run runs the test command verbatim."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python3 -m venv")]


def test_ci_runs_the_readme_test_command():
    commands = readme_commands()
    assert len(commands) == 2, commands
    quickstart, tests = commands
    assert quickstart.endswith("trtdeploy quickstart")
    assert tests.endswith("python -m pytest")
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
