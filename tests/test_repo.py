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


def test_ensemble_tensors_must_be_produced_before_use(tmp_path):
    ensemble = """name: "e"
platform: "ensemble"
max_batch_size: 1
input [ { name: "a" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "z" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "m" model_version: -1
  input_map { key: "x" value: "b" } output_map { key: "y" value: "z" } } ] }
"""
    write_template(tmp_path / "t", "e", ensemble)
    with pytest.raises(BuildError, match="reads 'b', which nothing produces"):
        render_repository([TemplateSource(tmp_path / "t", ("e",), {})], tmp_path / "r")


def test_template_models_lists_model_folders(tmp_path):
    write_template(tmp_path, "b", GOOD)
    write_template(tmp_path, "a", GOOD)
    (tmp_path / "not_a_model").mkdir()
    assert template_models(tmp_path) == ("a", "b")
