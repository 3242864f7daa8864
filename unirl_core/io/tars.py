"""WebDataset tar shards: reproducible, atomic writing and streaming reading, local or on any fsspec store.

Reproducible: members are written in key order and, within a sample, in extension order, with fixed metadata
(mtime 0, uid/gid 0, mode 0644), so the same samples give the same bytes. Atomic: a shard is written to a
temporary file and then renamed (local) or uploaded as one object (S3), so no partial tar ever carries a final
name; a permanent OS error (disk full, read-only) is a StorageError naming that final name, and a failed shard
leaves no temporary behind. Reading streams member by member (`r|`): memory stays flat whatever the shard size.

Member names come from whoever made a shard. `unsafe_member_reason` says why a name must never be used as a file
name (`..` components, absolute paths, NUL, over-long names); the writer refuses such names, and readers of
shards from elsewhere (precache) skip the samples holding them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec

from unirl_core.io import storage

logger = logging.getLogger(__name__)
MEMBER_MODE = 0o644
MAX_NAME_BYTES = 1024  # a whole member name, UTF-8 (Linux allows 4096 for a path; no dataset key needs more)
MAX_COMPONENT_BYTES = 255  # one path component, UTF-8 (NAME_MAX of Linux file systems)


@dataclass(frozen=True)
class ShardInfo:
    name: str  # basename, e.g. 00012.tar
    nsamples: int
    filesize: int
    sha256: str
    md5: str


def sample_key(member_name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the path up to the first dot of the basename; the rest is the extension."""
    folder, _, base = member_name.rpartition("/")
    stem, _, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def unsafe_member_reason(name: str) -> str | None:
    """Why the member `name` must not be used (a file under it could land outside its folder, or cannot be
    created), or None for a safe name."""
    shown = repr(name if len(name) <= 80 else f"{name[:60]}...{name[-12:]}")
    if "\x00" in name:
        return f"NUL byte in member name {shown}"
    if name.startswith("/"):
        return f"absolute member path {shown}"
    components = name.split("/")
    if ".." in components:
        return f"'..' component in member name {shown}"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"member name over {MAX_NAME_BYTES} bytes {shown}"
    if any(len(c.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES for c in components):
        return f"member name component over {MAX_COMPONENT_BYTES} bytes {shown}"
    return None


class TarShardWriter:
    """Write samples to `final_path` (local or URL); `commit()` makes it visible under that name."""

    def __init__(self, final_path: str):
        self.final_path = str(final_path)
        with storage.permanent_errors_name(self.final_path):
            folder = None if storage.is_url(self.final_path) else Path(self.final_path).parent
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
            prefix = f".{storage.basename(self.final_path)}."
            fd, self._tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
        self._file = os.fdopen(fd, "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 (closed by commit/abort)
        self.nsamples = 0
        self._last_key: str | None = None

    def write(self, key: str, members: dict[str, bytes]) -> None:
        """Add one sample: `members` maps extension -> bytes. Keys must be unique, dot-free, ascending, and safe as
        file names. An OS error drops the shard (its temporary is removed); a permanent one is a StorageError."""
        self._check(key, members)
        with self._aborting_on_error():
            for extension in sorted(members):
                data = members[extension]
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size, info.mtime, info.mode = len(data), 0, MEMBER_MODE
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                self._tar.addfile(info, io.BytesIO(data))
        self._last_key = key
        self.nsamples += 1

    def copy_sample(self, block: SampleBlock, source) -> None:
        """Add one sample as the bytes of `block` in `source` (the open file of a shard this writer's settings wrote:
        its members' headers and data go in as they are, the same bytes `write` would produce), with `write`'s
        checks. No member is parsed or re-encoded: a fraction of the cost of `write`."""
        self._check(block.key, block.extensions)
        with self._aborting_on_error():
            source.seek(block.start)
            remaining = block.end - block.start
            while remaining:
                chunk = source.read(min(remaining, 1 << 20))
                if not chunk:
                    raise ValueError(f"{source.name}: ends inside sample {block.key!r} (the shard changed?)")
                self._file.write(chunk)
                remaining -= len(chunk)
            self._tar.offset += block.end - block.start  # the end-of-archive padding counts from here
        self._last_key = block.key
        self.nsamples += 1

    def _check(self, key: str, extensions) -> None:
        if "." in key.rpartition("/")[2]:
            raise ValueError(f"sample key {key!r} contains a dot: WebDataset would split it into key and extension")
        if self._last_key is not None and key <= self._last_key:
            raise ValueError(f"sample key {key!r} is not after {self._last_key!r}: duplicate or out of order")
        for extension in extensions:
            reason = unsafe_member_reason(f"{key}.{extension}")
            if reason:
                raise ValueError(f"{self.final_path}: {reason}: refused, a file under this name could escape")

    def commit(self) -> ShardInfo:
        """Make the shard visible under its final name; on any error the temporary is removed."""
        with self._aborting_on_error((BaseException,)):
            self._tar.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            info = self._describe()
            if storage.is_url(self.final_path):
                fs, path = fsspec.core.url_to_fs(self.final_path)
                fs.put_file(self._tmp, path)
                os.unlink(self._tmp)
            else:
                os.replace(self._tmp, self.final_path)
        return info

    def abort(self) -> None:
        """Drop the shard: remove the temporary. Never raises: it runs while another error propagates, often a full
        disk, where closing the file (which flushes its buffered tail) fails again."""
        with contextlib.suppress(Exception):
            self._file.close()  # a failed flush still closes the descriptor; the tar's end blocks are not wanted
        try:
            Path(self._tmp).unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("could not remove the temporary %s of an aborted shard: %s", self._tmp, exc)

    @contextlib.contextmanager
    def _aborting_on_error(self, errors: tuple[type[BaseException], ...] = (OSError,)):
        """Inside: on `errors` (OSError by default) abort the shard; a permanent OSError becomes a StorageError
        naming the final path."""
        try:
            with storage.permanent_errors_name(self.final_path):
                yield
        except errors:
            self.abort()
            raise

    def _describe(self) -> ShardInfo:
        sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
        with open(self._tmp, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha256.update(block)
                md5.update(block)
        size = os.path.getsize(self._tmp)
        return ShardInfo(storage.basename(self.final_path), self.nsamples, size, sha256.hexdigest(), md5.hexdigest())

    def __enter__(self) -> TarShardWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.abort()


def iter_samples(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Stream (key, {extension: bytes}) from a tar, samples in file order; members of a sample must be adjacent."""
    for key, members, _ in iter_samples_with_spans(path):
        yield key, members


Span = tuple[int, int]  # (offset of a member's data in the tar, its size)


@dataclass(frozen=True)
class SampleBlock:
    """Where one sample lies in a tar: its members' headers, data and padding as the byte range [start, end)."""

    key: str
    extensions: tuple[str, ...]
    start: int
    end: int


def iter_sample_blocks(path: str) -> Iterator[SampleBlock]:
    """The samples of a local tar as byte ranges, in file order, reading only the headers (data is skipped by
    seeking). A sample's members must be adjacent regular files: anything else is a ValueError naming it."""
    with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
        key, extensions, start, end = None, [], 0, 0
        for member in tar:
            if not member.isfile():
                raise ValueError(f"{path}: member {member.name!r} is not a regular file")
            member_key, extension = sample_key(member.name)
            if member_key != key:
                if key is not None:
                    yield SampleBlock(key, tuple(extensions), start, end)
                key, extensions, start = member_key, [], member.offset
            elif member.offset != end:
                raise ValueError(f"{path}: the members of sample {key!r} are not adjacent")
            if extension in extensions:
                raise ValueError(f"{path}: sample {key!r} has two '{extension}' members")
            extensions.append(extension)
            end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        if key is not None:
            yield SampleBlock(key, tuple(extensions), start, end)


def iter_samples_with_spans(path: str) -> Iterator[tuple[str, dict[str, bytes], dict[str, Span]]]:
    """`iter_samples`, plus where each member's bytes lie in the tar: `read_span` reads one again later without
    streaming the shard (random access to a sample, local or by range request)."""
    with fsspec.open(str(path), "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
        key, members, spans = None, {}, {}
        for member in tar:
            if not member.isfile():
                continue
            member_key, extension = sample_key(member.name)
            if member_key != key:
                if key is not None:
                    yield key, members, spans
                key, members, spans = member_key, {}, {}
            if extension in members:
                raise ValueError(f"{path}: sample {key!r} has two '{extension}' members")
            members[extension] = tar.extractfile(member).read()
            spans[extension] = (member.offset_data, member.size)
        if key is not None:
            yield key, members, spans


def read_span(path: str, span: Span) -> bytes:
    """The bytes of one member at `span` (from `iter_samples_with_spans`) in the tar at `path`."""
    offset, size = span
    fs, inner = fsspec.core.url_to_fs(str(path))
    data = fs.cat_file(inner, start=offset, end=offset + size)
    if len(data) != size:
        raise ValueError(f"{path}: {size} bytes expected at offset {offset}, {len(data)} read (the shard changed?)")
    return data
