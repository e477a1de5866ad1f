from __future__ import annotations

import json

import pytest

from trtdeploy import gpus
from trtdeploy.errors import UsageError

from .conftest import run_cli


def test_profiles_and_counts():
    selection = gpus.resolve("H100:8")
    assert selection.profile is gpus.PROFILES["H100"] and selection.count == 8
    assert gpus.resolve("l4").profile.supports_fp8
    assert not gpus.resolve("A100").profile.supports_fp8
    assert gpus.resolve("cpu").profile is None


@pytest.mark.parametrize("value", ["V100", "H100:0", "H100:x"])
def test_bad_gpu_values(value):
    with pytest.raises(UsageError):
        gpus.resolve(value)


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ],
)
def test_nvidia_smi_names_map_to_profiles(product, expected):
    assert gpus.profile_for(product, 24000, (8, 9)).name == expected


def test_a_gpu_without_a_profile_gets_its_own_measurements():
    profile = gpus.profile_for("Tesla T4", 15360, (7, 5))
    assert (profile.name, profile.memory_gib, profile.compute_capability) == ("Tesla-T4", 15, (7, 5))
    assert not profile.supports_bf16


def test_auto_detection_reads_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA L40, 46068, 8.9'\necho 'NVIDIA L40, 46068, 8.9'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    selection = gpus.resolve("auto")
    assert (selection.label, selection.count, selection.profile.memory_gib) == ("L40", 2, 45)


def test_precisions_follow_compute_capability():
    assert gpus.PROFILES["A100-80GB"].unsupported_reason("fp8") == (
        "fp8 needs compute capability 8.9+ and the A100-80GB is SM80"
    )
    assert gpus.PROFILES["L4"].unsupported_reason("fp8") is None
    assert "int4_awq" in gpus.PROFILES["A10"].precisions and "fp8" not in gpus.PROFILES["A10"].precisions


def test_defaults_grow_with_memory():
    small, large = gpus.PROFILES["L4"].defaults, gpus.PROFILES["H200"].defaults
    assert small.max_batch_size < large.max_batch_size
    assert small.kv_cache_free_gpu_mem_fraction <= large.kv_cache_free_gpu_mem_fraction <= 0.9


def test_gpus_command_lists_every_profile():
    result = run_cli("gpus", "--json")
    assert result.returncode == 0, result.stderr
    names = [p["name"] for p in json.loads(result.stdout)["profiles"]]
    assert {"L4", "L20", "A10", "A10G", "A100-40GB", "A100-80GB", "H100", "H200", "RTX4090", "RTX5090", "B200"} <= set(
        names
    )
