"""The manifest format, owned by trtdeploy.manifest: atomic write, typed read, schema and completeness checks, and
the search for the latest deployment from each folder of a project."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from trtdeploy.deployment import Deployment, find_latest
from trtdeploy.errors import BuildError, NotFoundError, UsageError
from trtdeploy.manifest import MANIFEST, SCHEMA, read_manifest, reusable_manifest, write_manifest

from .conftest import run_cli
from .manifests import write_manifest as write_test_manifest


def deployment(folder: Path, **changes: object) -> Path:
    """A complete deployment folder whose manifest has ``changes`` applied."""
    write_test_manifest(folder, models=["echo"], entry_model="echo")
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, **changes}))
    return folder


def test_a_written_manifest_reads_back_and_leaves_no_temporary_file(tmp_path):
    manifest = {"schema": SCHEMA, "status": "building", "steps": [{"name": "convert", "returncode": 0}]}
    write_manifest(tmp_path, manifest)
    write_manifest(tmp_path, {**manifest, "status": "complete"})
    assert read_manifest(tmp_path / MANIFEST) == {**manifest, "status": "complete"}
    assert [path.name for path in tmp_path.iterdir()] == [MANIFEST]


@pytest.mark.parametrize(
    ("schema", "hint"), [(SCHEMA - 1, "--force`$"), (SCHEMA + 1, "--force`, or upgrade trtdeploy$")]
)
def test_a_manifest_of_another_schema_names_both_versions_and_the_fix(tmp_path, schema, hint):
    folder = deployment(tmp_path / "dep", schema=schema)
    with pytest.raises(UsageError, match=f"is of manifest schema {schema}, and this trtdeploy reads schema {SCHEMA}$"):
        Deployment.load(folder)
    with pytest.raises(UsageError) as info:
        find_latest(tmp_path)  # found (it is the latest), then refused: not passed over for an older one
    assert info.value.hint.startswith("rebuild with `trtdeploy build ... --force`")
    assert re.search(hint, info.value.hint)
    assert reusable_manifest(folder) is None  # the next build redoes it


@pytest.mark.parametrize("text", ["[]", '"complete"', "null", "3"])
def test_a_manifest_that_is_not_an_object_is_a_usage_error(tmp_path, text):
    (tmp_path / MANIFEST).write_text(text)
    with pytest.raises(UsageError, match=f"{MANIFEST} is not a deployment manifest \\(a JSON \\w+, not an object\\)"):
        Deployment.load(tmp_path)
    with pytest.raises(NotFoundError, match="no complete deployment found"):
        find_latest(tmp_path)


def test_an_unreadable_or_damaged_manifest_is_a_build_error(tmp_path):
    (tmp_path / MANIFEST).write_text('{"schema": 1, "status": ')
    with pytest.raises(BuildError, match="is unreadable"):
        Deployment.load(tmp_path)
    folder = deployment(tmp_path / "dep", point=["not", "an", "object"])
    with pytest.raises(BuildError, match="is damaged"):
        Deployment.load(folder)
    point = read_manifest(deployment(tmp_path / "options") / MANIFEST)["point"]
    folder = deployment(tmp_path / "options", point={**point, "options": []})
    with pytest.raises(BuildError, match="is damaged \\(AttributeError"):
        Deployment.load(folder)


def test_an_unfinished_build_is_refused_with_its_logs(tmp_path):
    folder = deployment(tmp_path / "dep", status="failed", error="trtllm-build exited with status 1")
    with pytest.raises(BuildError, match="not a complete build \\(status 'failed': trtllm-build exited") as info:
        Deployment.load(folder)
    assert str(folder / "logs") in info.value.hint
    assert reusable_manifest(folder) is None


@pytest.mark.parametrize("start", [".", "deployments", "deployments/echo", "deployments/echo/torch-fp32"])
def test_the_latest_deployment_is_found_from_each_folder_of_a_project(tmp_path, start):
    """From the project, deployments/, deployments/<model>/ (depth 1) and the deployment folder itself."""
    older = deployment(tmp_path / "deployments" / "echo" / "torch-fp16")
    newer = deployment(tmp_path / "deployments" / "echo" / "torch-fp32")
    os.utime(older / MANIFEST, (1, 1))
    assert find_latest(tmp_path / start).path == newer.resolve()


def test_serve_from_a_models_folder_serves_its_deployment(tmp_path):
    """`trtdeploy serve` in deployments/<model>/ takes the deployment below it (here refused for its schema: found)."""
    deployment(tmp_path / "deployments" / "echo" / "torch-fp32", schema=SCHEMA + 1)
    result = run_cli("serve", cwd=tmp_path / "deployments" / "echo")
    assert result.returncode == 2, result.stderr
    assert f"is of manifest schema {SCHEMA + 1}" in result.stderr and "Traceback" not in result.stderr
