"""``trtdeploy new-plugin``: what it refuses, and plugins that install and pass their own tests as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtdeploy import ExitCode, UsageError, scaffold
from trtdeploy.scaffold import KINDS, write_plugin

from .conftest import run_cli
from .test_public_api import private_imports


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("My-llm", "is not a lower-case Python identifier"),
        ("1st", "is not a lower-case Python identifier"),
        ("my llm", "is not a lower-case Python identifier"),
        ("class", "is not a lower-case Python identifier"),
        ("tensorrt_llm", "is a Triton model of every deployment"),
        ("none", "makes the class name None, which the plugin.s code cannot use"),
        ("model_spec", "makes the class name ModelSpec"),
        ("qwen_llm", "a model named 'qwen_llm' is already installed"),
    ],
)
def test_names_that_cannot_be_a_new_plugin_are_refused(tmp_path, name, message):
    with pytest.raises(UsageError, match=message) as refused:
        write_plugin(name, kind="text-llm", output_dir=tmp_path)
    assert refused.value.hint
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_says_what_is_wrong_in_one_line_and_exits_2(tmp_path):
    result = run_cli("new-plugin", "My-llm", "--output-dir", str(tmp_path))
    assert result.returncode == ExitCode.USAGE
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "Error: plugin name 'My-llm' is not a lower-case Python identifier"
    assert lines[1].startswith("Hint: use lower-case letters") and len(lines) == 2


def test_a_folder_that_holds_anything_is_never_overwritten(tmp_path):
    (tmp_path / "my_llm").mkdir()
    (tmp_path / "my_llm" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists and is not an empty folder"):
        write_plugin("my_llm", kind="text-llm", output_dir=tmp_path)
    assert [p.name for p in (tmp_path / "my_llm").iterdir()] == ["notes.txt"]
    (tmp_path / "my_tts").write_text("a file")
    with pytest.raises(UsageError, match="already exists"):
        write_plugin("my_tts", kind="tts", output_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    written = write_plugin("empty", kind="text-llm", output_dir=tmp_path)
    assert (written.path / "pyproject.toml").is_file()


def test_a_failure_while_writing_leaves_nothing_behind(tmp_path, monkeypatch):
    def render_then_fail(*args, **kwargs):
        render(*args, **kwargs)
        raise OSError(28, "No space left on device")

    render = scaffold.render
    monkeypatch.setattr(scaffold, "render", render_then_fail)
    with pytest.raises(UsageError, match="No space left on device"):
        write_plugin("my_llm", kind="text-llm", output_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_renders_lint_clean_python(tmp_path, kind):
    result = run_cli("new-plugin", "my_model", "--kind", kind, "--output-dir", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout)
    plugin = tmp_path / "my_model"
    assert written["path"] == str(plugin) and written["kind"] == kind
    assert {"pyproject.toml", "README.md", "trtdeploy_my_model/__init__.py", "tests/test_my_model.py"} <= set(
        written["files"]
    )
    assert 'my_model = "trtdeploy_my_model"' in (plugin / "pyproject.toml").read_text()
    assert private_imports(plugin / "trtdeploy_my_model") == []  # the public API only
    for command in (["check"], ["format", "--check"]):  # under the plugin's own ruff settings
        done = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=plugin, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.server
@pytest.mark.parametrize("kind", KINDS)
def test_a_new_plugin_installs_and_passes_its_own_tests(tmp_path, kind):
    name = f"new_{kind.replace('-', '_')}_{os.getpid()}"  # tests running side by side share the environment
    result = run_cli("new-plugin", name, "--kind", kind, "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    plugin = tmp_path / name
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "-e", str(plugin)], check=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(plugin)],
            cwd=plugin,
            # as the plugin's author runs them: every installed plugin loads (this suite narrows its own tests')
            env={key: value for key, value in os.environ.items() if key != "TRTDEPLOY_LOAD_PLUGINS"},
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        subprocess.run([*pip, "uninstall", "-y", f"trtdeploy-{name.replace('_', '-')}"], check=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and " passed" in summary and "skipped" not in summary, (
        done.stdout[-6000:] + done.stderr[-2000:]
    )


def test_the_templates_ship_with_the_package():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"*" = ["*.j2", "**/*.j2"' in pyproject
    assert all(path.suffix == ".j2" for path in scaffold.TEMPLATES.rglob("*") if path.is_file())
