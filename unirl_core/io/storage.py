"""Storage through fsspec: local paths and URLs (s3:// through s3fs) read and written the same way.

Credentials and endpoints come from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...) or IAM roles,
never from recipes. Writes are atomic: locally a temporary name in the same folder, fsync, rename; on object
stores a single PUT (an object is never partly visible).
"""

from __future__ import annotations

import errno
import os
import posixpath
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fsspec

from unirl_core.errors import UserError

# OS errors a retry cannot fix: the same write fails the same way until a person acts. Each with what to do.
PERMANENT_ERRNOS = {
    errno.ENOSPC: "no space left on the device: free space there or point the output at a larger disk",
    errno.EDQUOT: "disk quota exceeded: free space there or point the output at a larger disk",
    errno.EROFS: "read-only file system: point the output at a writable folder",
    errno.EACCES: "permission denied: make it writable for this user or point the output elsewhere",
    errno.EPERM: "operation not permitted: make it writable for this user or point the output elsewhere",
}


class StorageError(UserError, OSError):
    """A permanent OS error (disk full, read-only, no permission) naming the path and the fix: never retried,
    printed as one line by the `unirl` command (exit 2). Still an OSError with the original errno."""

    def __init__(self, code: int, path: str, what: str):
        super().__init__(code, PERMANENT_ERRNOS[code], str(path))
        self.what = what

    def __str__(self) -> str:
        return f"{self.filename}: {self.what}: {self.strerror}"

    def __reduce__(self):  # OSError's would call __init__ with (errno, strerror, filename): from a worker process
        return type(self), (self.errno, self.filename, self.what)


def is_permanent(exc: BaseException) -> bool:
    """An OSError a retry cannot fix (PERMANENT_ERRNOS)."""
    return isinstance(exc, OSError) and exc.errno in PERMANENT_ERRNOS


@contextmanager
def permanent_errors_name(path: str, what: str = "cannot write") -> Iterator[None]:
    """Inside the block, a permanent OSError becomes a StorageError naming `path` (the error's own file name
    when it has one); other errors pass unchanged (transient ones stay retryable)."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        if not is_permanent(exc):
            raise
        raise StorageError(exc.errno, exc.filename or path, what) from None


def is_url(path: str) -> bool:
    """True for fsspec URLs with a scheme (`s3://...`); False for local paths."""
    return "://" in str(path)


def parent(path: str) -> str:
    """The folder holding `path`: absolute for local paths, `scheme://bucket/dir` for URLs."""
    if is_url(path):
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{posixpath.dirname(rest)}"
    return str(Path(path).expanduser().resolve().parent)


def join(folder: str, relative: str) -> str:
    """`relative` resolved against `folder` (local or URL), with `..` segments normalized."""
    if is_url(folder):
        scheme, rest = folder.split("://", 1)
        return f"{scheme}://{posixpath.normpath(posixpath.join(rest, relative))}"
    return os.path.normpath(os.path.join(folder, relative))


def basename(path: str) -> str:
    return posixpath.basename(str(path).rstrip("/")) if is_url(path) else Path(path).name


def read_text(path: str, encoding: str = "utf-8") -> str:
    with fsspec.open(str(path), "rt", encoding=encoding) as f:
        return f.read()


def read_bytes(path: str) -> bytes:
    with fsspec.open(str(path), "rb") as f:
        return f.read()


def exists(path: str) -> bool:
    fs, fs_path = fsspec.core.url_to_fs(str(path))
    return fs.exists(fs_path)


def size(path: str) -> int:
    fs, fs_path = fsspec.core.url_to_fs(str(path))
    return fs.size(fs_path)


def version(path: str) -> str:
    """What changes when the file at `path` changes: its size with its modification time (local) or ETag/version
    (object stores), as far as the filesystem reports them."""
    fs, fs_path = fsspec.core.url_to_fs(str(path))
    info = fs.info(fs_path)
    stamp = [info.get(k) for k in ("size", "mtime", "ETag", "etag", "VersionId", "LastModified", "last_modified")]
    return repr(stamp)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write `data` so that `path` holds either nothing (or its old content) or all of `data`."""
    if is_url(path):
        fs, fs_path = fsspec.core.url_to_fs(path)
        fs.pipe_file(fs_path, data)
        return
    target = Path(path)
    with permanent_errors_name(path):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@contextmanager
def atomic_local_file(final: str) -> Iterator[str]:
    """A local temporary path to write (`.<name>.<random>.tmp` next to `final` when local); when the block succeeds
    it is fsynced and becomes `final` (a rename, or one upload to an object store); otherwise it is removed."""
    with permanent_errors_name(final):
        fd, tmp = tempfile.mkstemp(
            prefix=f".{basename(final)}.", suffix=".tmp", dir=None if is_url(final) else _ensure_parent(final)
        )
        os.close(fd)
        try:
            yield tmp
            with open(tmp, "rb+") as written:
                os.fsync(written.fileno())
            if is_url(final):
                fs, path = fsspec.core.url_to_fs(final)
                fs.put_file(tmp, path)
            else:
                os.replace(tmp, final)
        finally:
            Path(tmp).unlink(missing_ok=True)


def copy_atomic(source: str, target: str, chunk: int = 8 << 20) -> None:
    """Stream `source` to `target` (any fsspec URLs) through a local temporary file: memory stays flat, and
    `target` appears only complete."""
    with atomic_local_file(target) as tmp, fsspec.open(str(source), "rb") as src, open(tmp, "wb") as dst:
        for block in iter(lambda: src.read(chunk), b""):
            dst.write(block)


def _ensure_parent(path: str) -> Path:
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def remove_temporaries(folder: str, pattern: str) -> None:
    """Delete `folder/.{pattern}*.tmp` files left by a killed writer (local folders only: object stores never
    hold temporaries, uploads are single objects)."""
    if is_url(folder):
        return
    for leftover in Path(folder).glob(f".{pattern}*.tmp"):
        leftover.unlink(missing_ok=True)
