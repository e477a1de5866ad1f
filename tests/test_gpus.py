from __future__ import annotations

import pytest

from trtdeploy import gpus
from trtdeploy.errors import UsageError


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
