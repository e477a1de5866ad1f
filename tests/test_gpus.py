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
