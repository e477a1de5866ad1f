"""Rendering model repositories from jinja2 templates, and validating every config.pbtxt."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtdeploy.errors import BuildError
from trtdeploy.repo import TemplateSource, render_repository, template_models, validate_config

GOOD = """name: "{{ name }}"
backend: "python"
max_batch_size: {{ batch }}
input [ { name: "x" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


def write_template(root: Path, model: str, text: str, extra: dict[str, str] | None = None) -> None:
    (root / model / "1").mkdir(parents=True)
    (root / model / "config.pbtxt.j2").write_text(text)
    for name, content in (extra or {}).items():
        (root / model / name).write_text(content)


def test_renders_into_a_fresh_folder_and_copies_files(tmp_path):
    write_template(tmp_path / "t", "m", GOOD, {"1/model.py": "print('hi')\n"})
    configs = render_repository([TemplateSource(tmp_path / "t", ("m",), {"name": "m", "batch": 4})], tmp_path / "r")
    assert (tmp_path / "r" / "m" / "config.pbtxt").read_text().startswith('name: "m"')
    assert (tmp_path / "r" / "m" / "1" / "model.py").read_text() == "print('hi')\n"
    assert (tmp_path / "t" / "m" / "config.pbtxt.j2").exists()  # templates untouched
    assert validate_config(configs["m"]).max_batch_size == 4
    with pytest.raises(FileExistsError):  # never renders over an existing folder
        render_repository([TemplateSource(tmp_path / "t", ("m",), {"name": "m", "batch": 4})], tmp_path / "r")


def test_a_missing_variable_is_an_error_not_a_silent_leftover(tmp_path):
    write_template(tmp_path / "t", "m", GOOD)
    with pytest.raises(BuildError, match="'batch' is undefined"):
        render_repository([TemplateSource(tmp_path / "t", ("m",), {"name": "m"})], tmp_path / "r")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("{{ batch }}", "${triton_max_batch_size}"), "unfilled placeholder"),
        (GOOD.replace("{{ batch }}", "many"), "not a valid Triton model config"),
        (GOOD.replace('backend: "python"\n', ""), "neither backend nor platform"),
        (GOOD.replace('"{{ name }}"', '"other"'), "does not match its folder"),
    ],
)
def test_invalid_configs_are_refused(tmp_path, text, message):
    write_template(tmp_path / "t", "m", text)
    with pytest.raises(BuildError, match=message):
        render_repository([TemplateSource(tmp_path / "t", ("m",), {"name": "m", "batch": 1})], tmp_path / "r")


#: A test-only ensemble, text -> pre -> llm: each wiring fact is a variable, so that a test breaks one of them.
STEP = """name: "{{ name }}"
backend: "python"
max_batch_size: 1
input [ { name: "{{ input }}" data_type: {{ input_type }} dims: [ -1 ] } ]
output [ { name: "{{ output }}" data_type: {{ output_type }} dims: [ -1 ] } ]
"""
ENSEMBLE = """name: "e"
platform: "ensemble"
max_batch_size: 1
input [ { name: "text" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "{{ ensemble_output }}" data_type: {{ ensemble_output_type }} dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1
    input_map { key: "TEXT" value: "text" } output_map { key: "IDS" value: "{{ pre_writes }}" } },
  { model_name: "{{ llm_model }}" model_version: -1
    input_map { key: "{{ llm_key }}" value: "{{ llm_reads }}" } output_map { key: "{{ llm_out_key }}" value: "ids" } }
] }
"""
WIRING = {
    "ensemble_output": "ids",
    "ensemble_output_type": "TYPE_INT32",
    "pre_writes": "_ids",
    "pre_output_type": "TYPE_INT32",
    "llm_model": "llm",
    "llm_key": "input_ids",
    "llm_reads": "_ids",
    "llm_out_key": "output_ids",
}


def render_ensemble(root: Path, **changes: str) -> dict[str, Path]:
    variables = {**WIRING, **changes}
    write_template(root / "t", "e", ENSEMBLE)
    write_template(root / "t", "pre", STEP)
    write_template(root / "t", "llm", STEP)
    pre = {"input": "TEXT", "input_type": "TYPE_STRING", "output": "IDS", "output_type": variables["pre_output_type"]}
    llm = {"input": "input_ids", "input_type": "TYPE_INT32", "output": "output_ids", "output_type": "TYPE_INT32"}
    steps = {"pre": {"name": "pre", **pre}, "llm": {"name": "llm", **llm}}
    sources = [
        TemplateSource(root / "t", (name,), {**variables, **steps.get(name, {})}) for name in ("e", "pre", "llm")
    ]
    return render_repository(sources, root / "r")


def test_a_well_wired_ensemble_passes(tmp_path):
    assert sorted(render_ensemble(tmp_path)) == ["e", "llm", "pre"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"llm_key": "input_idz"},
            "step 'llm': input_map key 'input_idz' is not an input of 'llm' (its inputs: input_ids)",
        ),
        (
            {"pre_output_type": "TYPE_INT64"},
            "step 'llm': input 'input_ids' is TYPE_INT32 and reads '_ids', TYPE_INT64 (output 'IDS' of step 'pre')",
        ),
        (
            {"llm_out_key": "OUTPUT"},
            "step 'llm': output_map key 'OUTPUT' is not an output of 'llm' (its outputs: output_ids)",
        ),
        ({"llm_reads": "_idz"}, "step 'llm': input 'input_ids' reads '_idz', which no ensemble input or earlier step"),
        ({"llm_model": "lm"}, "step 'lm': the model repository has no model 'lm'"),
        ({"pre_writes": "text"}, "step 'pre': output 'IDS' writes 'text', which is the ensemble input already"),
        ({"ensemble_output": "tokens"}, "output 'tokens' is produced by no step"),
        (
            {"ensemble_output_type": "TYPE_INT64"},
            "output 'ids' is TYPE_INT64 and output 'output_ids' of step 'llm' is TYPE_INT32",
        ),
    ],
)
def test_ensemble_wiring_is_checked_against_the_step_models(tmp_path, changes, message):
    """A misnamed tensor or a data type that does not match is refused with the ensemble, step, tensor and template."""
    with pytest.raises(BuildError) as caught:
        render_ensemble(tmp_path, **changes)
    assert caught.value.message.startswith("ensemble 'e'")
    assert message in caught.value.message
    assert caught.value.hint.startswith(f"fix {tmp_path / 't' / 'e' / 'config.pbtxt.j2'}: in each step, input_map")


def test_template_models_lists_model_folders(tmp_path):
    write_template(tmp_path, "b", GOOD)
    write_template(tmp_path, "a", GOOD)
    (tmp_path / "not_a_model").mkdir()
    assert template_models(tmp_path) == ("a", "b")
