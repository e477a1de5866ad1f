"""Finding tritonserver and preparing what the binary bundled in the ``nvidia-pytriton`` wheel needs to run."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ServerError
from ..fsutil import atomic_dir, cache_dir

#: Where NGC Triton images install the server.
NGC_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
PYTRITON_DIST = "nvidia-pytriton"
_INSTALL_HINT = "install the embedded server with `pip install nvidia-pytriton`, or pass `--tritonserver PATH`"


@dataclass(frozen=True)
class TritonBinary:
    """A tritonserver executable and what it needs around it to serve python-backend models."""

    path: Path
    #: Taken from the nvidia-pytriton wheel (needs the prepared backend folder and library path below).
    bundled: bool = False
    #: Environment variables to set for the server (added to the current environment).
    env: dict[str, str] = field(default_factory=dict)
    #: Arguments the server needs in this setup (``--backend-directory`` and the like).
    args: tuple[str, ...] = ()


def _bundled_distribution() -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(PYTRITON_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def _bundled_root(dist: importlib.metadata.Distribution) -> Path:
    """The ``pytriton/tritonserver`` folder of the installed wheel."""
    return Path(str(dist.locate_file("pytriton/tritonserver")))


def bundled_tritonserver() -> Path | None:
    """The tritonserver shipped in the nvidia-pytriton wheel, if that wheel is installed."""
    dist = _bundled_distribution()
    if dist is None:
        return None
    binary = _bundled_root(dist) / "bin" / "tritonserver"
    return binary if binary.is_file() else None


def find_tritonserver(explicit: Path | None = None) -> Path:
    """Locate tritonserver: ``explicit``, then ``PATH``, then the NGC location, then the nvidia-pytriton wheel."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            path = path / "tritonserver"
        if not path.is_file():
            raise ServerError(f"tritonserver not found at {explicit}", hint=_INSTALL_HINT)
        if not os.access(path, os.X_OK):
            raise ServerError(f"{path} is not executable", hint="pass the tritonserver binary to `--tritonserver`")
        return path.absolute()
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path).absolute()
    if NGC_TRITONSERVER.is_file():
        return NGC_TRITONSERVER
    bundled = bundled_tritonserver()
    if bundled is not None:
        return bundled
    raise ServerError(
        "tritonserver not found (not on PATH, not in /opt/tritonserver, no nvidia-pytriton)", hint=_INSTALL_HINT
    )


def check_numpy(version: str | None = None) -> None:
    """Refuse numpy >= 2 in the serving Python (``version`` defaults to the installed one).

    The python backend bundled with nvidia-pytriton (Triton 2.51) breaks on numpy 2: every output fails with
    "output tensor shape does not match size of output".
    """
    if version is None:
        try:
            version = importlib.metadata.version("numpy")
        except importlib.metadata.PackageNotFoundError:
            raise ServerError(
                f"numpy is not installed in the serving Python ({sys.executable}); the python backend needs it",
                hint="pip install 'numpy<2'",
            ) from None
    major = version.split(".", 1)[0]
    if major.isdigit() and int(major) >= 2:
        raise ServerError(
            f"numpy {version} in the serving Python ({sys.executable}) breaks the bundled python backend "
            '(every output fails with "output tensor shape does not match size of output")',
            hint="pip install 'numpy<2'",
        )


def _atomic_dir(final: Path, populate: Callable[[Path], None]) -> Path:
    return atomic_dir(final, populate, error=ServerError, hint="point TRTDEPLOY_CACHE_DIR at a writable folder")


def python_version_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def prepare_backends(dist: importlib.metadata.Distribution, *, cache: Path | None = None) -> Path:
    """A backend folder whose ``python/`` holds the wheel's python backend and the stub for the running Python.

    Kept in the cache, keyed by the nvidia-pytriton and Python versions.
    """
    root = _bundled_root(dist)
    pyver = python_version_tag()
    stub = root / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    if not stub.is_file():
        available = sorted(p.name for p in (root / "python_backend_stubs").iterdir() if p.is_dir())
        raise ServerError(
            f"nvidia-pytriton {dist.version} has no python backend stub for Python {pyver} "
            f"(it has {', '.join(available) or 'none'})",
            hint="serve from a Python version the wheel supports",
        )
    backend = root / "backends" / "python"
    sources = [backend / "libtriton_python.so", backend / "triton_python_backend_utils.py", stub]

    def populate(scratch: Path) -> None:
        (scratch / "python").mkdir()
        for source in sources:
            shutil.copy2(source, scratch / "python" / source.name)

    final = (cache or cache_dir()) / "backends" / f"pytriton-{dist.version}-py{pyver}"
    return _atomic_dir(final, populate)


def serving_python_bin(*, executable: str | None = None, prefix: str | None = None, cache: Path | None = None) -> Path:
    """A folder to put first on the server's ``PATH`` so that its ``python3`` is the running interpreter.

    The python backend stub takes its ``sys.path`` from the ``python3`` first on ``PATH``. Usually that is the
    interpreter's own folder; where that folder has no ``python3`` or another one (run as ``python3.11``, say), a
    shim folder in the cache holds a ``python3`` link, and, for a virtual environment, links to its ``pyvenv.cfg``
    and ``lib`` so the stub still sees the environment's site-packages.
    """
    executable = executable or sys.executable
    prefix = prefix or sys.prefix
    exe = Path(executable)
    candidate = exe.parent / "python3"
    if candidate.exists() and os.path.samefile(candidate, exe):
        return exe.parent
    venv_cfg = Path(prefix) / "pyvenv.cfg"
    key = hashlib.sha256(f"{executable}\0{prefix}".encode()).hexdigest()[:16]

    def populate(scratch: Path) -> None:
        (scratch / "bin").mkdir()
        (scratch / "bin" / "python3").symlink_to(exe.absolute())
        if venv_cfg.is_file():
            (scratch / "pyvenv.cfg").symlink_to(venv_cfg)
            (scratch / "lib").symlink_to(Path(prefix) / "lib")

    return _atomic_dir((cache or cache_dir()) / "python-shims" / key, populate) / "bin"


def serving_libpython_dir() -> Path | None:
    """The folder holding the running interpreter's own ``libpython3.X.so``, when it has one outside the dynamic
    loader's default folders.

    The stub links ``libpython3.X.so.1.0`` dynamically; without this it may load the system's copy of the same
    minor version (say 3.11.2) while importing the running interpreter's extension modules (built for 3.11.7),
    which fails on symbols the older library lacks (seen: ``_ssl``: undefined symbol ``_PyModule_Add``). A default
    folder (a system Python's ``/usr/lib/x86_64-linux-gnu``) is searched anyway, and on ``LD_LIBRARY_PATH`` it
    would put every library there ahead of the ones extensions bundle: seen on an H200 host, torch in the stub
    loaded the system's cuDNN 9.14 instead of its own 9.19, lost cuDNN attention, and Whisper's decode step ran on
    a kernel twice as slow.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    library = sysconfig.get_config_var("INSTSONAME")
    if not libdir or Path(libdir).resolve() in _loader_default_dirs():
        return None
    if library and (Path(libdir) / library).is_file():
        return Path(libdir)
    return None


def _loader_default_dirs() -> set[Path]:
    """The folders the dynamic loader searches without being told: the standard ones and their multiarch ones."""
    standard = [Path(folder) for folder in ("/lib", "/usr/lib", "/lib64", "/usr/lib64")]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        standard += [folder / multiarch for folder in standard[:2]]
    return {folder.resolve() for folder in standard}


def resolve_tritonserver(explicit: Path | None = None) -> TritonBinary:
    """Find tritonserver and, for the wheel's binary, prepare its backend folder, library path and checks."""
    path = find_tritonserver(explicit)
    env = {"PATH": os.pathsep.join([str(serving_python_bin()), os.environ.get("PATH", os.defpath)])}
    dist = _bundled_distribution()
    bundled = bundled_tritonserver()
    if dist is None or bundled is None or not os.path.samefile(path, bundled):
        return TritonBinary(path=path, env=env)
    check_numpy()
    libs = Path(str(dist.locate_file("nvidia_pytriton.libs")))
    ld_path = os.environ.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(p) for p in (libs, serving_libpython_dir()) if p is not None] + ([ld_path] if ld_path else [])
    )
    args: list[str] = [f"--backend-directory={prepare_backends(dist)}"]
    caches = _bundled_root(dist) / "caches"
    if caches.is_dir():
        args.append(f"--cache-directory={caches}")
    return TritonBinary(path=path, bundled=True, env=env, args=tuple(args))
