"""The plugin system: each hook exercised through a plugin registered the way third parties do it."""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer

import trtdeploy
from trtdeploy import hookspecs, plugins
from trtdeploy.engines.base import Engine
from trtdeploy.overrides import base_members, override_problems
from trtdeploy.perf.workload import Workload

from .conftest import run_cli


class EchoSpec(trtdeploy.ModelSpec):
    name = "echo_test_model"
    description = "test model"
    default_repo = "example/echo"
    templates_dir = Path(__file__).parent

    def validate_checkpoint(self, checkpoint_dir: Path) -> None: ...

    def write_random_checkpoint(self, dest: Path, *, seed: int = 0) -> None: ...

    def entry_model(self, mode: trtdeploy.Mode) -> str:
        return "echo"

    def workload(self, deployment: trtdeploy.Deployment) -> Any:
        raise NotImplementedError


class NullEngine(Engine):
    name = "null_test_engine"
    precisions = ("fp32",)
    templates_dir = Path(__file__).parent

    def unavailable_reason(self) -> str | None:
        return None

    def default_precision(self, device: str) -> str:
        return "fp32"

    def template_context(self, ctx: trtdeploy.BuildContext) -> dict[str, Any]:
        return {}


class TestPlugin:
    @trtdeploy.hookimpl
    def register_models(self, register):
        register(EchoSpec())

    @trtdeploy.hookimpl
    def register_engines(self, register):
        register(NullEngine())

    @trtdeploy.hookimpl
    def register_commands(self, app: typer.Typer):
        @app.command(name="hello-test")
        def hello(*, name: str = "world") -> None:
            """Say hello."""
            typer.echo(f"hello {name}")


@pytest.fixture
def test_plugin():
    plugins.load_plugins()
    plugins.pm.register(TestPlugin(), name="test-plugin")
    plugins.forget_registrations()
    try:
        yield
    finally:
        plugins.pm.unregister(name="test-plugin")
        plugins.forget_registrations()


def test_hook_register_models(test_plugin):
    assert isinstance(plugins.get_model("echo_test_model"), EchoSpec)
    info = {p.name: p for p in plugins.list_plugins()}["test-plugin"]
    assert info.models == ["echo_test_model"]
    assert "register_models" in info.hooks


def test_hook_register_engines(test_plugin):
    assert isinstance(plugins.get_engine("null_test_engine"), NullEngine)
    assert "torch" in plugins.get_engines()  # the built-in engine arrives through the same hook


def test_hook_register_commands(test_plugin, capsys):
    from trtdeploy.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["hello-test", "--name", "triton"])
    assert exit_info.value.code == 0
    assert "hello triton" in capsys.readouterr().out


def test_duplicate_model_names_are_an_error(test_plugin):
    class Twin:
        @trtdeploy.hookimpl
        def register_models(self, register):
            register(EchoSpec())

    plugins.pm.register(Twin(), name="twin-plugin")
    plugins.forget_registrations()
    try:
        with pytest.raises(trtdeploy.UsageError, match="registered by both"):
            plugins.get_models()
    finally:
        plugins.pm.unregister(name="twin-plugin")


class MisspeltSpec(EchoSpec):
    name = "misspelt_test_model"

    def template_contxt(self, ctx: trtdeploy.BuildContext) -> dict[str, Any]:
        return {"never": "read"}


class ShortSpec(EchoSpec):
    name = "short_test_model"

    def entry_model(self) -> str:  # type: ignore[override]
        return "echo"


class NamelessEngine(Engine):
    """NullEngine without its ``name``."""

    precisions = NullEngine.precisions
    templates_dir = NullEngine.templates_dir
    unavailable_reason = NullEngine.unavailable_reason
    default_precision = NullEngine.default_precision
    template_context = NullEngine.template_context


#: What a plugin registers (a callable of ``register``) and the warning that skips it.
BAD_REGISTRATIONS = {
    "not a spec": (
        "register_models",
        lambda register: register("qwen"),
        "TypeError: model 'qwen' (str) is not a ModelSpec",
    ),
    "misspelt override": (
        "register_models",
        lambda register: register(MisspeltSpec()),
        "'template_contxt' is not a member of ModelSpec: a misspelling of 'template_context'?",
    ),
    "wrong signature": (
        "register_models",
        lambda register: register(ShortSpec()),
        "model ShortSpec: entry_model(self) cannot stand for ModelSpec.entry_model(self, mode): no argument 'mode'",
    ),
    "one name twice": (
        "register_models",
        lambda register: [register(EchoSpec()), register(EchoSpec())],
        "ValueError: model 'echo_test_model' is registered twice",
    ),
    "no name": (
        "register_engines",
        lambda register: register(NamelessEngine()),
        "engine NamelessEngine: 'name' is not set",
    ),
}


@pytest.mark.parametrize("kind", BAD_REGISTRATIONS)
def test_a_bad_registration_skips_its_plugin_with_the_reason(kind):
    """What a plugin registers is checked as it registers it: the plugin is named and skipped, the others work."""
    hook, body, reason = BAD_REGISTRATIONS[kind]
    plugin = type("BadPlugin", (), {hook: staticmethod(trtdeploy.hookimpl(specname=hook)(body))})
    plugins.load_plugins()
    plugins.pm.register(plugin(), name="bad-plugin")
    plugins.forget_registrations()
    try:
        with pytest.warns(plugins.PluginLoadWarning) as warned:
            registry = plugins.get_models() if hook == "register_models" else plugins.get_engines()
        [message] = [str(warning.message) for warning in warned]
        assert message.startswith("plugin 'bad-plugin' failed to load and is skipped (")
        assert reason in message
        assert "echo_test_model" not in registry and ("qwen_llm" in registry or "torch" in registry)
    finally:
        plugins.pm.unregister(name="bad-plugin")
        plugins.forget_registrations()
        plugins._failed.pop("bad-plugin", None)


@pytest.mark.plugins("qwen_llm")
def test_unknown_model_lists_installed_ones():
    with pytest.raises(trtdeploy.NotFoundError) as info:
        plugins.get_model("no_such_model")
    assert info.value.hint == "installed models: qwen_llm (see `trtdeploy plugins`)"


@pytest.mark.plugins()
def test_a_test_sees_only_the_plugins_it_names():
    assert plugins.get_models() == {} and "torch" in plugins.get_engines()
    assert "qwen_llm" not in run_cli("plugins").stdout


def test_every_hook_is_documented_and_tested():
    """Every hook in hookspecs.py has a docstring with its parameters, and a test_hook_<name> in this module."""
    hooks = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(fn, "trtdeploy_spec")]
    assert hooks, "no hooks found"
    tests = {name for name in globals() if name.startswith("test_hook_")}
    for hook in hooks:
        doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
        assert len(doc) > 40, f"hook {hook} needs a docstring"
        for param in inspect.signature(getattr(hookspecs, hook)).parameters:
            assert f":param {param}:" in doc, f"hook {hook} does not document {param}"
        assert f"test_hook_{hook}" in tests, f"hook {hook} has no test_hook_{hook}"


PLUGIN_BASES = (trtdeploy.ModelSpec, Engine, Workload)


def _is_documented(base: type, name: str) -> bool:
    """Whether member ``name`` of ``base`` has a docstring (a method, a property) or a ``#:`` comment above it, or
    above the attributes it is grouped with (an attribute)."""
    member = inspect.getattr_static(base, name, None)
    if isinstance(member, (classmethod, staticmethod, property)) or inspect.isfunction(member):
        return len(inspect.getdoc(getattr(base, name)) or "") > 10
    owner = next(
        klass for klass in base.__mro__ if name in vars(klass) or name in klass.__dict__.get("__annotations__", {})
    )
    lines = inspect.getsource(owner).splitlines()
    index = next(i for i, line in enumerate(lines) if re.match(rf"    {name}\b\s*[:=]", line))
    while index > 0 and re.match(r"    \w+\s*[:=]", lines[index - 1]):
        index -= 1  # attributes grouped under one comment
    return lines[index - 1].strip().startswith("#:")


@pytest.mark.parametrize("base", PLUGIN_BASES, ids=lambda base: base.__name__)
def test_every_member_of_a_plugin_base_class_is_documented(base):
    """What plugins subclass is documented member by member, as the hooks are."""
    members = base_members(base)
    assert len(members) > 8
    assert [name for name in members if not _is_documented(base, name)] == []


@pytest.mark.plugins("cosyvoice", "llama_llm", "qwen_llm", "spark_tts", "whisper")
def test_the_installed_plugins_subclass_the_base_classes_soundly():
    """Every model, engine and workload class of the installed plugins (and the core's own workloads, which the
    plugins use) passes the checks made as objects register, against the nearest class of trtdeploy it derives
    from; found as classes, so that one whose registration the checks would refuse is seen here too."""
    models, engines = plugins.get_models(), plugins.get_engines()
    assert {"qwen_llm", "llama_llm", "mistral_llm", "spark_tts", "whisper", "cosyvoice2"} <= set(models)
    assert "torch" in engines
    for module in ("llm", "tts", "asr_workload", "openai_api"):
        importlib.import_module(f"trtdeploy.perf.{module}")

    def subclasses(base: type) -> set[type]:
        found, classes = set(), [base]
        while classes:
            found.update(classes := [sub for klass in classes for sub in klass.__subclasses__()])
        return {klass for klass in found if klass.__module__.split(".")[0].startswith("trtdeploy")}  # not tests'

    checked = {base: subclasses(base) for base in (trtdeploy.ModelSpec, Engine, Workload)}
    assert len(checked[trtdeploy.ModelSpec]) >= 6 and len(checked[Engine]) >= 3 and len(checked[Workload]) >= 4
    for classes in checked.values():
        for klass in classes:
            nearest = next(k for k in klass.__mro__[1:] if k.__module__.split(".")[0] == "trtdeploy")
            assert override_problems(klass, nearest) == [], klass


class EchoWorkload(Workload):
    family = "tts"

    def __init__(self) -> None:
        self.model_name, self.decoupled = "echo", False

    def make_request(self, row, options, model): ...

    def parse_chunk(self, outputs, request): ...

    def finish(self, request, chunks): ...


def test_a_workload_is_checked_before_perf_uses_it(monkeypatch):
    """A plugin's workload that misspells a member, lacks one or names an unknown family is refused naming the
    model, where perf gets it (both ``workload`` and ``served_workload``)."""
    from trtdeploy.perf.workload import check_workload

    assert check_workload(EchoWorkload(), "echo")
    misspelt = type("MisspeltWorkload", (EchoWorkload,), {"count_text_token": lambda self, text: 0})
    misspelling = "'count_text_token' is not a member of Workload: a misspelling of 'count_text_tokens'"
    with pytest.raises(trtdeploy.UsageError, match=f"the workload of model 'echo' MisspeltWorkload: {misspelling}"):
        check_workload(misspelt(), "echo")
    unset = EchoWorkload()
    del unset.decoupled
    with pytest.raises(trtdeploy.UsageError, match="EchoWorkload: 'decoupled' is not set"):
        check_workload(unset, "echo")
    monkeypatch.setattr(EchoWorkload, "family", "video")
    with pytest.raises(trtdeploy.UsageError, match="family 'video' is not one of llm, tts, asr"):
        check_workload(EchoWorkload(), "echo")
    with pytest.raises(
        trtdeploy.UsageError, match="the workload of model 'echo' None \\(NoneType\\) is not a Workload"
    ):
        check_workload(None, "echo")


@pytest.mark.plugins("qwen_llm")
def test_plugins_command_lists_versions_models_and_hooks():
    result = run_cli("plugins", "--json")
    assert result.returncode == 0, result.stderr
    import json

    listed = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert set(listed) == {"qwen_llm", *plugins.DEFAULT_PLUGINS}
    assert listed["qwen_llm"]["models"] == ["qwen_llm"]
    assert listed["qwen_llm"]["version"]
    assert "register_models" in listed["qwen_llm"]["hooks"]
    assert listed["trtdeploy.engines.torch"]["engines"] == ["torch"]


BROKEN_PLUGINS = {
    "import": ("raise RuntimeError('boom at import')", "boom at import"),
    "hook typo": ("@trtdeploy.hookimpl\ndef register_modles(register): pass", "register_modles"),
    "argument name": ("@trtdeploy.hookimpl\ndef register_models(reg): pass", "reg"),
    "hook raises": ("@trtdeploy.hookimpl\ndef register_models(register): raise RuntimeError('boom')", "boom"),
    "command hook raises": ("@trtdeploy.hookimpl\ndef register_commands(app): raise RuntimeError('boom')", "boom"),
}


def install_fake_plugin(root: Path, name: str, source: str) -> dict[str, str]:
    """A distribution in ``root`` whose ``trtdeploy`` entry point ``name`` is a module of ``source``; the
    environment that puts it on the path of a ``trtdeploy`` subprocess."""
    import os

    dist = root / f"{name}_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[trtdeploy]\n{name} = {name}_plugin_module\n")
    (root / f"{name}_plugin_module.py").write_text("import trtdeploy\n" + textwrap.dedent(source) + "\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


@pytest.mark.plugins("qwen_llm", "broken")
@pytest.mark.parametrize("kind", BROKEN_PLUGINS)
def test_a_broken_plugin_is_named_and_the_others_still_work(tmp_path, kind):
    """A plugin that fails to import, to register or in its hook gets a one-line warning; the rest keeps working."""
    source, reason = BROKEN_PLUGINS[kind]
    env = install_fake_plugin(tmp_path, "broken", source)
    result = run_cli("plugins", env=env)
    assert result.returncode == 0, result.stderr
    assert "Warning: plugin 'broken' failed to load" in result.stderr and reason in result.stderr
    assert "Traceback" not in result.stderr
    assert "qwen_llm" in result.stdout
    planned = run_cli(
        "build", "qwen_llm", "--engine", "torch", "--gpu", "cpu", "--dry-run", "--json", env=env, cwd=tmp_path
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr


EMPTY_PLUGINS = {
    "no hookimpl": ("def register_models(register):\n    pass", "it implements no hook (mark its register_*"),
    "returns instead of registering": (
        "@trtdeploy.hookimpl\ndef register_models(register):\n    return object()",
        "its register_models registered no model or engine (call register(obj) for each one",
    ),
}


@pytest.mark.plugins("qwen_llm", "empty")
@pytest.mark.parametrize("kind", EMPTY_PLUGINS)
def test_a_plugin_that_registers_nothing_gets_a_warning(tmp_path, kind):
    """A plugin distribution that loads but adds nothing is not listed in silence: a warning, in --json too."""
    source, reason = EMPTY_PLUGINS[kind]
    env = install_fake_plugin(tmp_path, "empty", source)
    listed = run_cli("plugins", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    import json

    plugin = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}["empty"]
    assert plugin["models"] == [] and plugin["version"] == "0.1"
    assert plugin["warning"].startswith(f"plugin 'empty' registers nothing: {reason}")
    assert f"Warning: {plugin['warning']}" in listed.stderr.replace("\n", " ")
    table = run_cli("plugins", env=env)
    assert re.search(r"│ empty +│ 0\.1 +│ registers ", table.stdout), table.stdout
    assert "Warning: plugin 'empty' registers nothing" in table.stderr
    assert {p["name"]: p["warning"] for p in json.loads(listed.stdout)["plugins"]}["qwen_llm"] is None


def test_load_plugins_allow_list(tmp_path):
    result = run_cli("plugins", "--json", env={"TRTDEPLOY_LOAD_PLUGINS": ""})
    assert result.returncode == 0, result.stderr
    import json

    names = [p["name"] for p in json.loads(result.stdout)["plugins"]]
    assert "qwen_llm" not in names
    assert "trtdeploy.engines.torch" in names


@pytest.mark.parametrize(
    ("missing", "picked"),
    [((), "trtllm"), (("trtllm",), "trtllm_pytorch"), (("trtllm", "trtllm_pytorch"), "torch")],
)
def test_auto_engine_is_the_usable_one_of_highest_rank(monkeypatch, missing, picked):
    """Whatever this machine has installed: each engine is made usable here or not, and auto follows the ranks."""
    from trtdeploy.plugins import get_engine, get_engines

    builtin = {name: engine for name, engine in get_engines().items() if name in ("trtllm", "trtllm_pytorch", "torch")}
    assert [name for name, _ in sorted(builtin.items(), key=lambda item: -item[1].rank)] == [
        "trtllm", "trtllm_pytorch", "torch"
    ]  # fmt: skip
    for name, engine in builtin.items():
        reason = f"{name} not installed" if name in missing else None
        monkeypatch.setattr(type(engine), "unavailable_reason", lambda self, reason=reason: reason)
    assert get_engine("auto").name == picked


def test_auto_engine_on_the_cpu_skips_the_engines_that_build_for_a_gpu(monkeypatch, qwen_checkpoint, tmp_path):
    """Inside an image where TensorRT-LLM is installed, --gpu cpu still gets the engine that runs there."""
    from trtdeploy.build import BuildRequest, plan
    from trtdeploy.plugins import get_engine, get_engines

    for engine in get_engines().values():
        monkeypatch.setattr(type(engine), "unavailable_reason", lambda self: None)
    assert get_engine("auto").name == "trtllm"
    assert get_engine("auto", on_cpu=True).name == "torch"
    request = BuildRequest(model="qwen_llm", model_dir=qwen_checkpoint, gpu="cpu", output_root=tmp_path)
    assert plan(request).engine.name == "torch"


def test_auto_engine_for_an_encoder_decoder_model_skips_the_engines_that_serve_none(monkeypatch):
    """With TensorRT-LLM installed but no trtllm-build, a Whisper build gets the torch engine, not trtllm_pytorch."""
    from trtdeploy.plugins import get_engine, get_engines

    for name, engine in get_engines().items():
        reason = "trtllm-build is not on PATH" if name == "trtllm" else None
        monkeypatch.setattr(type(engine), "unavailable_reason", lambda self, reason=reason: reason)
    assert get_engine("auto").name == "trtllm_pytorch"
    assert get_engine("auto", encoder_decoder=True).name == "torch"


def test_auto_engine_says_why_no_engine_is_usable(monkeypatch):
    from trtdeploy.plugins import get_engine, get_engines

    for name, engine in get_engines().items():
        monkeypatch.setattr(type(engine), "unavailable_reason", lambda self, name=name: f"{name} not installed")
    unusable = (
        r"no engine is usable here \(trtllm: trtllm not installed; trtllm_pytorch: trtllm_pytorch not installed; "
        r"torch: torch not installed\)"
    )
    with pytest.raises(trtdeploy.UsageError, match=unusable):
        get_engine("auto")


def test_overrides_are_judged_as_the_core_calls_them():
    """The core passes a spec's arguments by position (their names are the plugin's) and calls methods on the
    instance (a staticmethod does); a text LLM's own members (``end_tokens``) are guarded as ModelSpec's are."""
    from trtdeploy.overrides import check_instance

    class Renamed(trtdeploy.TextLLMSpec):
        name, default_repo, architectures = "renamed_llm", "test/renamed", ("Qwen2ForCausalLM",)

        def validate_checkpoint(self, path):
            return super().validate_checkpoint(path)

        @staticmethod
        def entry_model(mode):
            return "ensemble"

    check_instance(Renamed(), "model", trtdeploy.ModelSpec)

    class Misspelt(Renamed):
        end_tokns = ("<|im_end|>",)

    with pytest.raises(TypeError, match="'end_tokns' is not a member of TextLLMSpec: a misspelling of 'end_tokens'"):
        check_instance(Misspelt(), "model", trtdeploy.ModelSpec)
