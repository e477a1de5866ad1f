"""The container files: their TensorRT-LLM release and image tag agree with the planner, and every command they
run is one the CLI accepts. (Docker itself is not available where the tests run.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from trtdeploy.engines.trtllm.versions import TRITON_IMAGES

from .conftest import run_cli

DOCKER = Path(__file__).parent.parent / "docker"


def _defaults(text: str) -> dict[str, str]:
    return dict(re.findall(r"ARG (\w+)=(\S+)", text))


def test_the_dockerfile_pairs_each_release_with_the_image_that_ships_it():
    text = (DOCKER / "Dockerfile").read_text()
    defaults = _defaults(text)
    assert TRITON_IMAGES[defaults["TRTLLM_VERSION"]] == defaults["TRITON_TAG"]
    documented = dict(re.findall(r"(\d+\.\d+\.\d+(?:\.post\d+)?): (\d\d\.\d\d)", text))
    assert documented and all(TRITON_IMAGES[version] == tag for version, tag in documented.items())
    assert "-trtllm-python-py3" in text and "TRTDEPLOY_TRTLLM_EXAMPLES=/app/tensorrt_llm/examples" in text


def test_compose_builds_that_image_and_runs_commands_the_cli_accepts():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    dockerfile = _defaults((DOCKER / "Dockerfile").read_text())
    args = compose["x-trtdeploy"]["build"]["args"]
    assert args == {key: f"${{{key}:-{dockerfile[key]}}}" for key in ("TRITON_TAG", "TRTLLM_VERSION")}
    assert set(compose["services"]) == {"build", "serve", "perf"}
    for name, service in compose["services"].items():
        command = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", part) for part in service["command"]]
        result = run_cli(*command, "--help")  # option names are checked before --help answers
        assert result.returncode == 0, f"{name}: {result.stderr}"
