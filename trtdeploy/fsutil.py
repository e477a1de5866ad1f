"""Files and folders written all at once (filled under a temporary name next to their place, then renamed into it),
and the folders that reports are written to."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import TrtDeployError, UsageError


def cache_dir() -> Path:
    """``$TRTDEPLOY_CACHE_DIR``, default ``~/.cache/trtdeploy``."""
    return Path(os.environ.get("TRTDEPLOY_CACHE_DIR") or Path.home() / ".cache" / "trtdeploy").expanduser()


def scratch_beside(final: Path, *, prefix: str, error: type[TrtDeployError], hint: str) -> Path:
    """A new empty folder next to ``final`` (same file system, so a rename moves it into place).

    Its mode follows the umask like any new folder (``mkdtemp`` alone makes it private to its owner, which a
    server running as another user could not read). Failing to create it raises ``error`` with ``hint``.
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    except OSError as exc:
        raise error(f"cannot write to {final.parent} ({exc.strerror or exc})", hint=hint) from None
    scratch.chmod(0o777 & ~_umask())
    return scratch


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_dir(final: Path, populate: Callable[[Path], None], *, error: type[TrtDeployError], hint: str) -> Path:
    """Create ``final`` by ``populate``-ing a scratch sibling and renaming it; an existing ``final`` is kept.

    Concurrent writers never see half a folder: the first rename wins and the others' copies are dropped.
    """
    if final.is_dir():
        return final
    scratch = scratch_beside(final, prefix=f".{final.name}-", error=error, hint=hint)
    try:
        populate(scratch)
        os.rename(scratch, final)
    except OSError as exc:
        if not final.is_dir():  # not a lost race: a real failure
            raise error(f"cannot write {final} ({exc.strerror or exc})", hint=hint) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def swap_into_place(scratch: Path, final: Path) -> None:
    """Replace the folder ``final`` (if any) by ``scratch``; the old one is removed only after the rename."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
    scratch.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling: a reader (or a crash) never sees half a file. Its
    mode follows the umask, as a file ``open`` creates (``mkstemp`` alone makes it private to its owner)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        Path(tmp).chmod(0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_output_dir(path: Path) -> list[Path]:
    """Create the reports folder ``path`` and check that files can be written there, or raise UsageError.

    Returns the folders created (the deepest first), to remove again if the run fails before writing anything.
    """
    created = []
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        created.append(folder)
    hint = "pass --output-dir DIR, a folder you can write to"
    if path.exists() and not path.is_dir():
        raise UsageError(f"cannot write reports to {path}: it is a file, not a folder", hint=hint)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        remove_empty(created)
        raise UsageError(f"cannot write reports to {path}: {exc.strerror or exc}", hint=hint) from None
    return created


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (in order) that is empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
