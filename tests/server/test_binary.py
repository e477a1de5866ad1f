"""Finding tritonserver and preparing the bundled one's backend folder and serving Python."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

from trtdeploy.errors import ExitCode, ServerError
from trtdeploy.server import check_numpy, find_tritonserver, resolve_tritonserver
from trtdeploy.server._binary import (
    _bundled_distribution,
    bundled_tritonserver,
    prepare_backends,
    serving_libpython_dir,
    serving_python_bin,
)


def test_explicit_path_that_does_not_exist_is_a_clear_error() -> None:
    with pytest.raises(ServerError) as caught:
        find_tritonserver(Path("/nonexistent"))
    assert caught.value.message == "tritonserver not found at /nonexistent"
    assert "--tritonserver" in caught.value.hint and "nvidia-pytriton" in caught.value.hint
    assert caught.value.exit_code == ExitCode.SERVER


def test_explicit_path_wins(tmp_path: Path) -> None:
    binary = tmp_path / "tritonserver"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert find_tritonserver(binary) == binary
    assert find_tritonserver(tmp_path) == binary  # a folder holding it


def test_nothing_found_names_the_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("trtdeploy.server._binary.NGC_TRITONSERVER", Path("/nonexistent/tritonserver"))
    monkeypatch.setattr("trtdeploy.server._binary.bundled_tritonserver", lambda: None)
    with pytest.raises(ServerError, match="tritonserver not found") as caught:
        find_tritonserver()
    assert "pip install nvidia-pytriton" in caught.value.hint


def test_bundled_binary_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("trtdeploy.server._binary.NGC_TRITONSERVER", Path("/nonexistent/tritonserver"))
    bundled = bundled_tritonserver()
    assert bundled is not None and bundled.is_file()
    assert find_tritonserver() == bundled


@pytest.mark.parametrize("version", ["2.0.0", "2.5.1", "10.0"])
def test_numpy_2_is_refused(version: str) -> None:
    with pytest.raises(ServerError, match="output tensor shape does not match size of output") as caught:
        check_numpy(version)
    assert version in caught.value.message
    assert caught.value.hint == "pip install 'numpy<2'"


@pytest.mark.parametrize("version", ["1.26.4", "1.24.0"])
def test_numpy_1_is_accepted(version: str) -> None:
    check_numpy(version)


def test_resolve_bundled_sets_library_path_backends_and_python() -> None:
    binary = resolve_tritonserver(bundled_tritonserver())
    assert binary.bundled
    assert binary.env["LD_LIBRARY_PATH"].split(os.pathsep)[0].endswith("nvidia_pytriton.libs")
    libpython_dir = serving_libpython_dir()  # None for a system Python, whose folder the loader searches anyway
    if libpython_dir is not None:
        assert str(libpython_dir) in binary.env["LD_LIBRARY_PATH"].split(os.pathsep)
    first_python = Path(binary.env["PATH"].split(os.pathsep)[0]) / "python3"
    assert os.path.samefile(first_python, sys.executable)
    backend_dir = Path(next(a for a in binary.args if a.startswith("--backend-directory=")).split("=", 1)[1])
    names = sorted(p.name for p in (backend_dir / "python").iterdir())
    assert names == ["libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert os.access(backend_dir / "python" / "triton_python_backend_stub", os.X_OK)


def test_libpython_goes_on_the_library_path_only_from_outside_the_loaders_default_folders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A system folder on LD_LIBRARY_PATH would put all its libraries (a system cuDNN) ahead of torch's own."""
    (tmp_path / "libpython3.99.so.1.0").write_bytes(b"")
    config = {"LIBDIR": str(tmp_path), "INSTSONAME": "libpython3.99.so.1.0", "MULTIARCH": "x86_64-linux-gnu"}
    monkeypatch.setattr(sysconfig, "get_config_var", config.get)
    assert serving_libpython_dir() == tmp_path
    for system in ("/usr/lib", "/usr/lib/x86_64-linux-gnu", "/lib64"):
        config["LIBDIR"] = system
        assert serving_libpython_dir() is None


def test_backend_folder_is_prepared_once_under_concurrent_starts(tmp_path: Path) -> None:
    dist = _bundled_distribution()
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(prepare_backends(dist, cache=tmp_path))) for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results) == 6
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert results[0].name == f"pytriton-{dist.version}-py{version}"
    assert sorted(p.name for p in (tmp_path / "backends").iterdir()) == [results[0].name]  # no temp folder left


def test_missing_stub_for_this_python_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("trtdeploy.server._binary.python_version_tag", lambda: "3.99")
    with pytest.raises(ServerError, match=r"no python backend stub for Python 3\.99 \(it has .*3\.11"):
        prepare_backends(_bundled_distribution(), cache=tmp_path)


def test_interpreter_folder_is_used_when_its_python3_is_this_interpreter() -> None:
    assert serving_python_bin() == Path(sys.executable).parent


def test_shim_gives_the_stub_the_venv_when_the_folder_has_no_python3(tmp_path: Path) -> None:
    """A venv run as ``python3.X`` whose folder has no ``python3``: the shim's python3 still sees its packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    exe = venv / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "bin" / "python3").unlink()
    shim = serving_python_bin(executable=str(exe), prefix=str(venv), cache=tmp_path / "cache")
    assert shim != exe.parent and (shim / "python3").exists()
    probe = "import site, sys; print(sys.prefix != sys.base_prefix); print(site.getsitepackages()[0])"
    lines = subprocess.run([shim / "python3", "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert lines[0] == "True"
    venv_site = next((venv / "lib").glob("python3*/site-packages"))
    assert os.path.samefile(lines[1], venv_site)
    assert serving_python_bin(executable=str(exe), prefix=str(venv), cache=tmp_path / "cache") == shim


def test_unwritable_cache_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ServerError, match=f"cannot write to {blocker}") as caught:
        prepare_backends(_bundled_distribution(), cache=blocker / "cache")
    assert "TRTDEPLOY_CACHE_DIR" in caught.value.hint
