"""The command line as a whole: every command's --help, and the one place errors become messages and exit codes."""

from __future__ import annotations

import pytest
import typer

import trtdeploy
from trtdeploy import errors, plugins
from trtdeploy.cli.main import COMMANDS, create_app, main

from .conftest import run_cli


def test_every_command_has_help():
    names = [name for _, name in COMMANDS]
    assert {"plugins", "download", "build", "serve", "stop", "perf", "report", "sweep", "quickstart"} <= set(names)
    for name in names:
        result = run_cli(name, "--help")
        assert result.returncode == 0, (name, result.stderr)
        assert f"Usage: trtdeploy {name}" in result.stdout
    top = run_cli("--help")
    assert top.returncode == 0 and all(name in top.stdout for name in names)
    sub = run_cli("export", "k8s", "--help")  # a command group's commands
    assert sub.returncode == 0 and "Usage: trtdeploy export k8s" in sub.stdout, sub.stderr


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"trtdeploy {trtdeploy.__version__}"


ERRORS = [
    (errors.UsageError, errors.ExitCode.USAGE),
    (errors.NotFoundError, errors.ExitCode.NOT_FOUND),
    (errors.BuildError, errors.ExitCode.BUILD_FAILED),
    (errors.ServerError, errors.ExitCode.SERVER),
    (errors.PerfError, errors.ExitCode.PERF_ERRORS),
    (errors.NetworkError, errors.ExitCode.NETWORK),
]


class Failing:
    """A plugin command that raises the error named on its command line."""

    @trtdeploy.hookimpl
    def register_commands(self, app: typer.Typer):
        @app.command(name="fail-test")
        def fail(kind: str) -> None:
            error = {cls.__name__: cls for cls, _ in ERRORS}[kind]
            raise error("something is wrong", hint="do the right thing", details="line 1\nline 2")


@pytest.fixture
def failing_command():
    plugins.load_plugins()
    plugins.pm.register(Failing(), name="failing-test-plugin")
    try:
        yield
    finally:
        plugins.pm.unregister(name="failing-test-plugin")


@pytest.mark.parametrize(("error", "code"), ERRORS)
def test_errors_map_to_one_message_and_an_exit_code(failing_command, capsys, monkeypatch, error, code):
    monkeypatch.delenv("TRTDEPLOY_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["fail-test", error.__name__])
    assert exit_info.value.code == int(code)
    captured = capsys.readouterr()
    assert captured.out == ""  # errors never go to stdout (it carries --json output)
    assert "Error: something is wrong" in captured.err
    assert "line 1\nline 2" in captured.err and "Hint: do the right thing" in captured.err
    assert "Traceback" not in captured.err


def test_debug_shows_the_traceback(failing_command, monkeypatch):
    monkeypatch.setenv("TRTDEPLOY_DEBUG", "1")
    with pytest.raises(errors.UsageError):
        main(["fail-test", "UsageError"])


def test_bad_options_are_usage_errors():
    result = run_cli("build", "qwen_llm", "--max-batch-size", "many")
    assert result.returncode == 2 and "many" in result.stderr
    result = run_cli("no-such-command")
    assert result.returncode == 2


def test_exit_codes_are_distinct():
    codes = [int(code) for code in errors.ExitCode]
    assert len(codes) == len(set(codes))
    assert create_app().registered_commands  # the app assembles without error


def test_sweep_takes_builds_and_perfs_options_under_their_names():
    """Every option of `build` and `perf` is one of `sweep`'s (with the same flags and help), but those the sweep
    decides itself; build's --output-dir is --deployments-dir there."""
    from trtdeploy.cli import sweep as sweep_module

    group = typer.main.get_command(create_app())
    commands = ("build", "perf", "sweep")
    options = {name: {param.name: param for param in group.commands[name].params} for name in commands}
    left_out = {
        "build": set(sweep_module.BUILD_OPTIONS_LEFT_OUT),
        "perf": set(sweep_module.PERF_OPTIONS_LEFT_OUT),
    }
    for source in ("build", "perf"):
        for name, param in options[source].items():
            if name in left_out[source]:
                continue
            name = "deployments_dir" if (source, name) == ("build", "output_dir") else name
            taken = options["sweep"][name]
            assert taken.help == param.help, name
            if name != "deployments_dir":
                assert taken.opts == param.opts, name
    assert options["sweep"]["deployments_dir"].opts == ["--deployments-dir"]
    assert options["sweep"]["output_dir"].help.startswith("The sweep's folder")
