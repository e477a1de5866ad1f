"""Getting a checkpoint: from the Hugging Face Hub (with a progress bar) or from a local folder."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import NetworkError, NotFoundError, UsageError
from .fsutil import atomic_dir

if TYPE_CHECKING:
    from .spec import ModelSpec

#: Files that never matter for serving and only cost download time.
IGNORE_PATTERNS = ("*.pth", "*.pt", "*.onnx", "*.msgpack", "*.h5", "original/*", ".gitattributes")
#: The files of a Hugging Face tokenizer (and the model config some tokenizers read): all ``--tokenizer HUB_NAME``
#: downloads.
TOKENIZER_PATTERNS = (
    *("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.tiktoken"),
    *("chat_template*", "config.json"),
)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on local disk and where it came from."""

    path: Path
    repo_id: str | None = None
    revision: str | None = None

    def identity(self) -> dict[str, Any]:
        """What makes this checkpoint this one, for the build's content hash."""
        if self.repo_id is not None:
            return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.path.name}
        return {"path": str(self.path), "fingerprint": fingerprint(self.path)}


def fingerprint(folder: Path) -> str:
    """Hash of every file's relative path, size and modification time (cheap; no file contents read)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


@contextmanager
def _hub_errors(
    repo_id: str,
    revision: str | None,
    offline_hint: str = "download it where the Hub is reachable, copy the folder here, and build with --model-dir PATH",
) -> Iterator[None]:
    """Turn the Hub client's failures into one-line errors naming the repository and the way out (``offline_hint``
    when the Hub cannot be reached)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except GatedRepoError:
        raise UsageError(
            f"{repo_id} is gated on the Hugging Face Hub", hint="accept its licence and log in with `hf auth login`"
        ) from None
    except RepositoryNotFoundError:
        raise NotFoundError(f"no repository {repo_id!r} on the Hugging Face Hub") from None
    except RevisionNotFoundError:
        raise NotFoundError(f"{repo_id} has no revision {revision!r}") from None
    except (LocalEntryNotFoundError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        message = f"cannot download {repo_id} from the Hugging Face Hub ({reason})"
        raise NetworkError(message, hint=offline_hint) from None


def download(repo_id: str, *, revision: str | None = None, local_dir: Path | None = None) -> Checkpoint:
    """Download a Hub repository (or reuse the cached copy) and return it as a local checkpoint."""
    from huggingface_hub import snapshot_download

    with _hub_errors(repo_id, revision):
        path = snapshot_download(
            repo_id,
            revision=revision,
            local_dir=str(local_dir) if local_dir else None,
            ignore_patterns=list(IGNORE_PATTERNS),
        )
    return Checkpoint(Path(path).resolve(), repo_id=repo_id, revision=revision)


def fetch_config(repo_id: str, *, revision: str | None = None, subfolder: str = "") -> Path | None:
    """Fetch only ``<subfolder>/config.json`` of a Hub repository (or find it cached), so that a build checks the
    model's shape before it downloads the weights; the snapshot folder it lands in (where :func:`download` puts the
    rest), or None when the repository has no such file."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    with _hub_errors(repo_id, revision):
        try:
            path = hf_hub_download(repo_id, "config.json", subfolder=subfolder or None, revision=revision)
        except EntryNotFoundError as exc:
            if isinstance(exc, LocalEntryNotFoundError):  # not cached and the Hub not reached
                raise
            return None
    # the file is a link into the cache's blobs: its snapshot folder is found from the link, not its target
    return Path(path).parents[len(Path(subfolder).parts)].resolve()


def tokenizer_folder(source: str) -> Path:
    """The folder of ``--tokenizer SOURCE``: a local folder as it is, else a Hub repository id whose tokenizer files
    alone are downloaded (or found cached)."""
    from huggingface_hub import snapshot_download

    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise NotFoundError(
            f"--tokenizer {source}: no such folder",
            hint="pass the folder of a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json), or a Hub name",
        )
    offline_hint = "download it where the Hub is reachable, copy the folder here, and pass --tokenizer FOLDER"
    with _hub_errors(source, None, offline_hint):
        return Path(snapshot_download(source, allow_patterns=list(TOKENIZER_PATTERNS))).resolve()


def local_checkpoint(path: Path) -> Checkpoint:
    """A checkpoint folder given with ``--model-dir``."""
    path = path.expanduser()
    if not path.is_dir():
        raise NotFoundError(f"--model-dir {path} is not a folder")
    return Checkpoint(path.resolve())


def write_random(spec: ModelSpec, dest: Path) -> Checkpoint:
    """Write ``spec``'s random-weight checkpoint into ``dest`` (new or empty), all at once or not at all."""
    dest = dest.expanduser()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} is not an empty folder", hint="pass a new or empty folder")
    if dest.exists():
        dest.rmdir()
    atomic_dir(dest, spec.write_random_checkpoint, error=UsageError, hint="pass a writable folder")
    return Checkpoint(dest.resolve())
