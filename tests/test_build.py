"""Building deployment folders: plan, content hash, all-or-nothing writes, dry runs, bad input."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from trtdeploy import build, plugins
from trtdeploy.deployment import Deployment, find_latest
from trtdeploy.engines.base import BuildStep
from trtdeploy.errors import BuildError, NetworkError, NotFoundError, UsageError

from .conftest import run_cli


def request(checkpoint: Path, root: Path, **changes) -> build.BuildRequest:
    base = build.BuildRequest(
        model="qwen_llm", engine="torch", gpu="cpu", model_dir=checkpoint, output_root=root, max_batch_size=4
    )
    return replace(base, **changes)


def test_build_writes_a_complete_validated_deployment(qwen_checkpoint, tmp_path):
    result = build.run(request(qwen_checkpoint, tmp_path))
    deployment = result.deployment
    assert not result.up_to_date
    assert deployment.path == tmp_path.resolve() / "qwen_llm" / "torch-fp32-bs4-tp1pp1-streaming"
    manifest = json.loads((deployment.path / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["point"]["precision"] == "fp32" and manifest["point"]["gpu"] == "cpu"
    assert manifest["versions"]["trtdeploy"] and manifest["versions"]["torch"]
    assert [step["name"] for step in manifest["steps"]] == ["render"]
    assert sorted(deployment.models) == ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm"]
    for model in deployment.models:
        text = (deployment.model_repo / model / "config.pbtxt").read_text()
        assert "${" not in text
        assert (deployment.model_repo / model / "1").is_dir()
    assert "decoupled: true" in (deployment.model_repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert (deployment.path / "checkpoint").resolve() == qwen_checkpoint.resolve()
    assert find_latest(tmp_path).path == deployment.path
    assert deployment.path.stat().st_mode & 0o055  # readable by others (umask permitting), like any folder


def test_an_unchanged_point_is_not_rebuilt_and_force_rebuilds(qwen_checkpoint, tmp_path):
    first = build.run(request(qwen_checkpoint, tmp_path)).deployment
    stamp = (first.path / "manifest.json").stat().st_mtime_ns
    again = build.run(request(qwen_checkpoint, tmp_path))
    assert again.up_to_date and (first.path / "manifest.json").stat().st_mtime_ns == stamp
    forced = build.run(request(qwen_checkpoint, tmp_path), force=True)
    assert not forced.up_to_date
    assert json.loads((forced.deployment.path / "manifest.json").read_text())["hash"] == first.manifest["hash"]
    changed = build.run(request(qwen_checkpoint, tmp_path, max_output_len=64, mode="offline"))
    assert not changed.up_to_date and changed.deployment.path.name.endswith("-offline")


def test_a_deployment_of_another_manifest_schema_is_rebuilt(qwen_checkpoint, tmp_path):
    first = build.run(request(qwen_checkpoint, tmp_path)).deployment
    (first.path / "manifest.json").write_text(json.dumps({**first.manifest, "schema": 0}))
    with pytest.raises(UsageError, match="is of manifest schema 0"):
        Deployment.load(first.path)
    again = build.run(request(qwen_checkpoint, tmp_path))
    assert not again.up_to_date and again.deployment.manifest["schema"] == first.manifest["schema"]


def test_dry_run_plans_everything_and_touches_nothing(qwen_checkpoint, tmp_path):
    result = run_cli(
        "build", "qwen_llm", "--gpu", "cpu", "--model-dir", str(qwen_checkpoint),
        "--output-dir", str(tmp_path / "deployments"), "--dry-run", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["dry_run"] and plan["entry_model"] == "ensemble"
    assert "model_repo/tensorrt_llm/config.pbtxt" in plan["files"]
    assert "model_repo/ensemble/config.pbtxt" in plan["files"]
    assert not (tmp_path / "deployments").exists()


def test_dry_run_without_a_local_checkpoint_plans_the_download(tmp_path):
    result = run_cli("build", "qwen_llm", "--gpu", "H100", "--dry-run", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["checkpoint"] == "hf://Qwen/Qwen2.5-0.5B-Instruct@main"
    assert plan["point"]["precision"] == "bf16"
    assert list(tmp_path.iterdir()) == []


def test_a_failed_step_leaves_nothing_that_looks_complete(qwen_checkpoint, tmp_path, monkeypatch):
    good = build.run(request(qwen_checkpoint, tmp_path)).deployment
    engine = plugins.get_engine("torch")
    failing = BuildStep("convert", "convert the checkpoint", argv=("sh", "-c", "echo converting; echo bad >&2; exit 3"))
    monkeypatch.setattr(type(engine), "steps", lambda self, ctx: [failing])
    with pytest.raises(BuildError, match="'convert' failed \\(exit code 3\\)") as info:
        build.run(request(qwen_checkpoint, tmp_path), force=True)
    assert "bad" in info.value.details
    failed = good.path.with_name(good.path.name + ".failed")
    assert json.loads((failed / "manifest.json").read_text())["status"] == "failed"
    assert "converting" in (failed / "logs" / "convert.log").read_text()
    assert Deployment.load(good.path).manifest["hash"] == good.manifest["hash"]  # the old build is intact
    with pytest.raises(BuildError, match="not a complete build"):
        Deployment.load(failed)
    assert [p.name for p in good.path.parent.iterdir() if p.name.startswith(".")] == []


def test_an_interrupted_build_is_marked_failed(qwen_checkpoint, tmp_path, monkeypatch):
    def interrupt(log: Path) -> None:
        raise KeyboardInterrupt

    engine = plugins.get_engine("torch")
    monkeypatch.setattr(type(engine), "steps", lambda self, ctx: [BuildStep("slow", "slow", run=interrupt)])
    with pytest.raises(KeyboardInterrupt):
        build.run(request(qwen_checkpoint, tmp_path))
    folder = tmp_path / "qwen_llm" / "torch-fp32-bs4-tp1pp1-streaming"
    assert not folder.exists()
    manifest = json.loads(folder.with_name(folder.name + ".failed").joinpath("manifest.json").read_text())
    assert manifest == {**manifest, "status": "failed", "error": "interrupted"}
    with pytest.raises(NotFoundError):
        find_latest(tmp_path)


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"engine": "nope"}, NotFoundError, "unknown engine 'nope'"),
        ({"model": "nope"}, NotFoundError, "unknown model 'nope'"),
        ({"precision": "int3"}, UsageError, "cannot build precision 'int3'"),
        ({"mode": "sideways"}, UsageError, "no 'sideways' mode"),
        ({"max_batch_size": 0}, UsageError, "--max-batch-size must be >= 1"),
        ({"max_num_tokens": 0}, UsageError, "--max-num-tokens must be >= 1, got 0"),
        ({"options": {"colour": "red"}}, UsageError, "unknown option 'colour'"),
        ({"options": {"chat_template": "maybe"}}, UsageError, "not a valid bool"),
        ({"gpu": "V100"}, UsageError, "unknown GPU 'V100'"),
        ({"max_input_len": 0}, UsageError, "must be >= 1"),
        ({"revision": "v2"}, UsageError, "--revision picks what to download"),
        ({"options": {"preprocessing_instances": "0"}}, UsageError, "preprocessing_instances must be >= 1"),
        ({"output_root": Path("/proc/no/such/folder")}, UsageError, "cannot write to /proc/no/such"),
    ],
)
def test_bad_requests_are_rejected_before_anything_runs(qwen_checkpoint, tmp_path, changes, error, message):
    with pytest.raises(error, match=message):
        build.run(request(qwen_checkpoint, tmp_path, **changes))
    assert not (tmp_path / "qwen_llm").exists()


def test_lengths_above_the_checkpoints_positions_are_refused_before_anything_runs(tmp_path):
    """4096 + 1024 tokens on a checkpoint of 2048 positions: both numbers and the fix, exit 2, nothing written."""
    from trtdeploy.checkpoints import write_random_causal_lm

    checkpoint = tmp_path / "short"
    write_random_causal_lm(checkpoint, max_position_embeddings=2048)
    lengths = ("--max-input-len", "4096", "--max-output-len", "1024")
    result = run_cli("build", "qwen_llm", "--gpu", "cpu", "--model-dir", str(checkpoint), *lengths, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert (
        "Error: --max-input-len 4096 + --max-output-len 1024 = 5120 is more than the 2048 positions of the checkpoint "
        "(max_position_embeddings in config.json)\nHint: keep the two at 2048 or less together, e.g. "
        "--max-input-len 1024 --max-output-len 1024\n"
    ) in result.stderr
    assert not (tmp_path / "deployments").exists()
    assert build.plan(request(checkpoint, tmp_path, max_input_len=1024, max_output_len=1024))
    config = json.loads((checkpoint / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    (checkpoint / "config.json").write_text(json.dumps(config))  # YaRN stretches the 2048 positions to 8192
    assert build.plan(request(checkpoint, tmp_path, max_input_len=4096, max_output_len=1024))
    with pytest.raises(UsageError, match=r"= 8193 is more than the 8192 positions .* times its rope_scaling factor 4"):
        build.plan(request(checkpoint, tmp_path, max_input_len=7169, max_output_len=1024))


def test_a_folder_that_is_not_the_model_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="missing config.json, tokenizer_config.json"):
        build.plan(request(tmp_path / "empty", tmp_path))
    with pytest.raises(NotFoundError, match="is not a folder"):
        build.plan(request(tmp_path / "absent", tmp_path))


def test_hub_unreachable_points_to_model_dir(tmp_path):
    with pytest.raises(NetworkError) as info:
        build.run(request(None, tmp_path, model_dir=None))
    assert "--model-dir" in info.value.hint
    result = run_cli("build", "qwen_llm", "--gpu", "cpu", cwd=tmp_path)
    assert result.returncode == 7
    assert result.stderr.count("\n") <= 3 and "Error: cannot download Qwen/Qwen2.5-0.5B-Instruct" in result.stderr


def test_a_damaged_manifest_is_refused(qwen_checkpoint, tmp_path):
    deployment = build.run(request(qwen_checkpoint, tmp_path)).deployment
    manifest = dict(deployment.manifest)
    del manifest["triton_models"]
    (deployment.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="is damaged \\(KeyError"):
        Deployment.load(deployment.path)


def test_engines_are_reused_when_only_the_rest_of_the_deployment_changes(qwen_checkpoint, tmp_path, monkeypatch):
    def steps(self, ctx):
        engine = f"echo {ctx.point.max_output_len} >> engines/rank0.engine; echo built"
        return [BuildStep("build", "build the engine", argv=("sh", "-c", engine))]

    monkeypatch.setattr(type(plugins.get_engine("torch")), "steps", steps)
    first = build.run(request(qwen_checkpoint, tmp_path)).deployment
    engine = first.path / "engines" / "rank0.engine"
    assert engine.read_text() == "1024\n"
    again = build.run(request(qwen_checkpoint, tmp_path, options={"preprocessing_instances": "2"})).deployment
    manifest = again.manifest
    assert manifest["steps"][0] == {"name": "build", "reused": True, "returncode": 0}
    assert engine.read_text() == "1024\n" and manifest["engine_key"] == first.manifest["engine_key"]
    assert manifest["hash"] != first.manifest["hash"]  # the deployment itself was rebuilt (new templates values)
    changed = build.run(request(qwen_checkpoint, tmp_path, max_output_len=512)).deployment
    assert engine.read_text() == "512\n" and "reused" not in changed.manifest["steps"][0]


def test_a_step_whose_script_is_missing_names_it(qwen_checkpoint, tmp_path, monkeypatch):
    script = tmp_path / "examples" / "qwen" / "convert_checkpoint.py"
    step = BuildStep("convert", "convert", argv=("python3", str(script)), requires=(str(script),))
    monkeypatch.setattr(type(plugins.get_engine("torch")), "steps", lambda self, ctx: [step])
    with pytest.raises(BuildError, match=f"'convert' needs {script}, which does not exist") as info:
        build.run(request(qwen_checkpoint, tmp_path / "out"))
    assert "TRTDEPLOY_TRTLLM_EXAMPLES" in info.value.hint


def test_a_step_whose_program_is_missing_fails_it_with_exit_4(qwen_checkpoint, tmp_path, monkeypatch, capsys):
    """A program that is not installed fails its step in one line (exit 4), not with a traceback."""
    from trtdeploy.cli.main import main

    step = BuildStep("build", "build the engine", argv=("trtllm-build-not-installed", "--checkpoint_dir", "x"))
    monkeypatch.setattr(type(plugins.get_engine("torch")), "steps", lambda self, ctx: [step])
    argv = ["build", "qwen_llm", "--gpu", "cpu", "--model-dir", str(qwen_checkpoint), "--output-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 4
    error = capsys.readouterr().err
    assert "Error: build step 'build' runs 'trtllm-build-not-installed', which cannot be run: not installed" in error
    assert "Traceback" not in error
    failed = tmp_path / "qwen_llm" / "torch-fp32-bs8-tp1pp1-streaming.failed"
    [record] = json.loads((failed / "manifest.json").read_text())["steps"]
    assert record["returncode"] == 127 and record["missing_program"] == "trtllm-build-not-installed"
    not_executable = tmp_path / "convert.sh"
    not_executable.write_text("#!/bin/sh\n")  # there, but not executable: said so, not called missing
    step = BuildStep("build", "build the engine", argv=(str(not_executable),))
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--force"])
    assert exit_info.value.code == 4
    assert f"runs '{not_executable}', which cannot be run: Permission denied" in capsys.readouterr().err


@pytest.mark.parametrize(("given", "word"), [({}, "neither"), ({"argv": ("true",), "run": print}, "both")])
def test_a_build_step_takes_exactly_one_of_argv_and_run(given, word):
    with pytest.raises(TypeError, match=f"build step 'convert' needs exactly one of argv or run, got {word}"):
        BuildStep("convert", "convert", **given)


def test_an_interrupted_step_leaves_no_step_after_it_marked_done(qwen_checkpoint, tmp_path, monkeypatch):
    def interrupt(log: Path) -> None:
        raise KeyboardInterrupt

    steps = [
        BuildStep("convert", "convert", argv=("sh", "-c", "echo converted")),
        BuildStep("build", "build", run=interrupt),
        BuildStep("cleanup", "cleanup", argv=("sh", "-c", "echo cleaned")),
    ]
    monkeypatch.setattr(type(plugins.get_engine("torch")), "steps", lambda self, ctx: steps)
    with pytest.raises(KeyboardInterrupt):
        build.run(request(qwen_checkpoint, tmp_path))
    failed = tmp_path / "qwen_llm" / "torch-fp32-bs4-tp1pp1-streaming.failed"
    manifest = json.loads((failed / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["engine_key"]
    assert [(step["name"], step["returncode"]) for step in manifest["steps"]] == [("convert", 0)]
    assert (failed / "logs" / "convert.log").read_text() == "converted\n"
    # the next build does not take the failed folder's engines for done ones
    monkeypatch.setattr(type(plugins.get_engine("torch")), "steps", lambda self, ctx: steps[:1])
    rebuilt = build.run(request(qwen_checkpoint, tmp_path)).deployment
    assert "reused" not in rebuilt.manifest["steps"][0]


@pytest.fixture
def converting(qwen_checkpoint, tmp_path, monkeypatch):
    """qwen_llm made a model whose LLM is converted (here: copied) from its checkpoint; returns the calls made."""
    spec = type(plugins.get_model("qwen_llm"))
    calls = []

    def convert_llm(self, checkpoint_dir: Path, dest: Path) -> None:
        calls.append((checkpoint_dir, dest))
        shutil.copytree(checkpoint_dir, dest, dirs_exist_ok=True)

    monkeypatch.setenv("TRTDEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(spec, "llm_conversion", "1")
    monkeypatch.setattr(spec, "convert_llm", convert_llm)
    return calls


def test_a_converted_llm_is_made_once_per_checkpoint_and_conversion_version(converting, qwen_checkpoint, tmp_path):
    deployment = build.run(request(qwen_checkpoint, tmp_path / "out")).deployment
    converted = tmp_path / "cache" / "llm" / "qwen_llm"
    [first] = list(converted.iterdir())
    assert converting == [(qwen_checkpoint.resolve(), converting[0][1])]
    assert deployment.llm_dir == first and (first / "config.json").is_file()
    assert str(first) in (deployment.model_repo / "tensorrt_llm" / "config.pbtxt").read_text()
    again = build.run(request(qwen_checkpoint, tmp_path / "out"), force=True)
    assert len(converting) == 1 and again.deployment.llm_dir == first
    type(plugins.get_model("qwen_llm")).llm_conversion = "2"  # a new conversion: a folder of its own, rebuilt
    changed = build.run(request(qwen_checkpoint, tmp_path / "out"))
    assert len(converting) == 2 and not changed.up_to_date and changed.deployment.llm_dir != first
    assert sorted(converted.iterdir()) == sorted([first, changed.deployment.llm_dir])  # no scratch folder left


def test_a_failed_conversion_leaves_no_folder_and_names_the_error(converting, qwen_checkpoint, tmp_path, monkeypatch):
    def broken(self, checkpoint_dir: Path, dest: Path) -> None:
        (dest / "config.json").write_text("{}")
        raise ValueError("tensor 'speech_embedding.weight' is truncated")

    monkeypatch.setattr(type(plugins.get_model("qwen_llm")), "convert_llm", broken)
    with pytest.raises(BuildError, match="converting the LLM of .* failed: ValueError: tensor 'speech_embedding"):
        build.run(request(qwen_checkpoint, tmp_path / "out"))
    assert list((tmp_path / "cache" / "llm" / "qwen_llm").iterdir()) == []
    assert not (tmp_path / "out").exists()

    def refused(self, checkpoint_dir: Path, dest: Path) -> None:
        raise UsageError("llm.pt is not a cosyvoice2 LLM")

    monkeypatch.setattr(type(plugins.get_model("qwen_llm")), "convert_llm", refused)
    with pytest.raises(UsageError, match="^llm.pt is not a cosyvoice2 LLM$"):
        build.run(request(qwen_checkpoint, tmp_path / "out"))


#: Wiring mistakes in qwen_llm's templates, each a (template, text, replacement) and what the build says of it (a
#: streaming deployment's postprocessing calls the LLM: it is the first step to read the prompt's length).
MISWIRED = {
    "input_map typo": (
        "ensemble",
        'input_map { key: "input_lengths" value: "_input_lengths" }',
        'input_map { key: "input_length" value: "_input_lengths" }',
        "ensemble 'ensemble', step 'postprocessing': input_map key 'input_length' is not an input of 'postprocessing'",
    ),
    "INT64 into INT32": (
        "preprocessing",
        '{ name: "REQUEST_INPUT_LEN" data_type: TYPE_INT32',
        '{ name: "REQUEST_INPUT_LEN" data_type: TYPE_INT64',
        "ensemble 'ensemble', step 'postprocessing': input 'input_lengths' is TYPE_INT32 and reads '_input_lengths', "
        "TYPE_INT64 (output 'REQUEST_INPUT_LEN' of step 'preprocessing')",
    ),
}


@pytest.mark.parametrize("mistake", MISWIRED)
def test_a_miswired_ensemble_fails_the_build_with_the_names(qwen_checkpoint, tmp_path, monkeypatch, capsys, mistake):
    """A wrong tensor name or data type in a plugin's ensemble fails `trtdeploy build` (exit 4), not the server."""
    from trtdeploy.cli.main import main

    model, text, replacement, message = MISWIRED[mistake]
    spec = type(plugins.get_model("qwen_llm"))
    templates = shutil.copytree(spec.templates_dir, tmp_path / "templates")
    config = templates / model / "config.pbtxt.j2"
    assert text in config.read_text()
    config.write_text(config.read_text().replace(text, replacement))
    monkeypatch.setattr(spec, "templates_dir", templates)
    argv = ["build", "qwen_llm", "--gpu", "cpu", "--model-dir", str(qwen_checkpoint), "--output-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 4
    error = capsys.readouterr().err
    assert f"Error: {message}" in error.replace("\n", " ")
    assert f"Hint: fix {templates / 'ensemble' / 'config.pbtxt.j2'}" in error.replace("\n", "")
    assert not (tmp_path / "qwen_llm" / "torch-fp32-bs8-tp1pp1-streaming").exists()


def test_a_build_runs_no_more_gpu_workers_than_the_machine_has(monkeypatch):
    """Engines for two nodes (``--gpu H100:16``) built on one of 8 GPUs: 8 workers, not 16 on devices it lacks."""
    from trtdeploy import gpus

    h100 = gpus.resolve("H100")
    monkeypatch.setattr(gpus, "detect", lambda: replace(h100, count=8))
    assert build._build_gpus(gpus.resolve("H100:16"), dry_run=False) == 8
    assert build._build_gpus(gpus.resolve("H100:4"), dry_run=False) == 4
    assert build._build_gpus(gpus.resolve("H100:16"), dry_run=True) == 16  # a plan for any machine
    monkeypatch.setattr(gpus, "detect", lambda: replace(gpus.resolve("L4"), count=8))
    assert build._build_gpus(gpus.resolve("H100:16"), dry_run=False) == 16  # other GPUs here: as named


def test_engine_settings_are_taken_by_o_beside_the_models(qwen_checkpoint, tmp_path):
    """``-o`` keys the model does not know go to the engine; they reach the Triton model's parameters and the
    manifest, which records only those given."""
    plain = build.run(request(qwen_checkpoint, tmp_path)).deployment
    assert "engine_options" not in plain.manifest["point"]
    options = {"cuda_graphs": "false", "preprocessing_instances": "2"}
    gpu = request(qwen_checkpoint, tmp_path, gpu="H100", options=options)
    planned = build.plan(gpu, dry_run=True)
    assert planned.context.point.engine_options == (("cuda_graphs", False),)
    assert planned.context.point.name == "torch-bf16-bs4-tp1pp1-streaming-cuda_graphs-false"  # beside the default
    assert dict(planned.context.point.options)["preprocessing_instances"] == 2
    parameters = plugins.get_engine("torch").template_context(planned.context)["parameters"]
    assert parameters["cuda_graphs"] == "false" and "overlap_admission" not in parameters
    overlap = build.plan(replace(gpu, options={"overlap_admission": "true"}), dry_run=True)
    parameters = plugins.get_engine("torch").template_context(overlap.context)["parameters"]
    assert parameters["cuda_graphs"] == "true" and parameters["overlap_admission"] == "true"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"colour": "red"}, r"unknown option 'colour' for model 'qwen_llm' or engine 'torch'"),
        ({"cuda_graphs": "sometimes"}, r"option cuda_graphs='sometimes' is not a valid bool$"),
        ({"cuda_graphs": "true"}, "work on a GPU only, and this build is for the CPU"),
    ],
)
def test_bad_engine_settings_are_one_line_naming_them(qwen_checkpoint, tmp_path, options, message):
    with pytest.raises(UsageError, match=message) as raised:
        build.run(request(qwen_checkpoint, tmp_path, options=options))
    if "colour" in options:
        assert raised.value.hint == (
            "known options: model qwen_llm: add_special_tokens, chat_template, postprocessing_instances, "
            "preprocessing_instances, skip_special_tokens; engine torch: cuda_graphs, overlap_admission"
        )


def test_overlap_without_graphs_and_engine_settings_of_another_engine_are_refused(qwen_checkpoint, tmp_path):
    both = {"overlap_admission": "true", "cuda_graphs": "false"}
    with pytest.raises(UsageError, match="overlap_admission=true needs CUDA graphs"):
        build.plan(request(qwen_checkpoint, tmp_path, gpu="H100", options=both), dry_run=True)
    with pytest.raises(UsageError, match="unknown option 'cuda_graphs' for model 'qwen_llm' or engine 'trtllm'"):
        build.plan(
            request(qwen_checkpoint, tmp_path, gpu="H100", engine="trtllm", options={"cuda_graphs": "false"}),
            dry_run=True,
        )
