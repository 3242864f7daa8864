"""Which shard members precache reads, copies and serves: source shards and caches are data from elsewhere.

Two rules, one per risk:
  names       a member named with a `..` component, an absolute path, a NUL byte or an over-long name
              (`unirl_core.io.tars.unsafe_member_reason`) is never used, trusted or not: no writer of ours makes one.
  contents    a member whose extension (any dot-separated part of it) is pickle-like or executable is refused
              unless the recipe sets `precache.trusted: true` (PICKLE_EXTENSIONS, EXECUTABLE_EXTENSIONS below).
              Our own formats are safe: `safetensors`, and `np.save` members read with `allow_pickle=False`;
              `nemo_pickle` caches hold `pickle` members, so reading them needs trusted.

In a source shard an unsafe member skips its sample (counted, key and reason listed); in a cache it is an error
(UnsafeCacheError). merge_source_tar copies only MERGEABLE_EXTENSIONS unless trusted.
"""

from __future__ import annotations

from collections.abc import Iterable

from unirl_core.io.tars import unsafe_member_reason

# Unpickled when loaded: by WebDataset's default decoders (`pickle`, `pyd`, `pth`) or by the tools that write them
# (torch.load for `pt`/`pth`/`ckpt`, pickle/joblib/dill). `bin` is not here: it is a generic extension for raw bytes
# (we never load it, and merge_source_tar does not copy it unless trusted).
PICKLE_EXTENSIONS = frozenset({"pickle", "pkl", "pyd", "pth", "pt", "ckpt", "joblib", "dill"})
# Compiled code a loader runs. Scripts (`py`, `sh`) are text: not refused, but not copied unless trusted either;
# nor `class` (WebDataset's integer label) or `com` (a word in dotted names).
EXECUTABLE_EXTENSIONS = frozenset({"pyc", "pyo", "so", "dll", "dylib", "exe", "msi", "jar", "wasm"})

MERGEABLE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "mp4", "txt", "json", "safetensors", "npy"})
"""What merge_source_tar copies unless trusted: what ingest writes (its image formats, `mp4` videos, the caption
`txt`, the row's `json`), JPEG's other spelling, and the safe encoding formats."""

TRUSTED_HINT = "set precache.trusted: true only if you made these shards (or trust who did)"


def unsafe_extension_reason(extension: str) -> str | None:
    """Why a member with this extension must not be read or copied from untrusted shards, or None."""
    for part in extension.lower().split("."):
        if part in PICKLE_EXTENSIONS:
            return f".{extension} is pickle-like (loading it can run code)"
        if part in EXECUTABLE_EXTENSIONS:
            return f".{extension} is an executable or code format"
    return None


def unsafe_sample_reason(key: str, extensions: Iterable[str], trusted: bool) -> str | None:
    """The skip reason for the source sample `<tar name>/<source key>` with members `extensions`, or None.

    `unsafe_name: ...` for a name that could escape a folder (checked as the source has it and as precache would
    write it), `unsafe_member: ...` for a pickle-like or executable member unless `trusted`."""
    source_key = key.partition("/")[2]
    for extension in sorted(extensions):
        reason = unsafe_member_reason(f"{source_key}.{extension}") or unsafe_member_reason(f"{key}.{extension}")
        if reason:
            return f"unsafe_name: {reason}"
    if not trusted:
        for extension in sorted(extensions):
            reason = unsafe_extension_reason(extension)
            if reason:
                return f"unsafe_member: {reason}; {TRUSTED_HINT}"
    return None


def unmergeable(extensions: Iterable[str], trusted: bool) -> list[str]:
    """The extensions of `extensions` merge_source_tar must not copy (none when trusted)."""
    return [] if trusted else sorted(e for e in extensions if e.lower() not in MERGEABLE_EXTENSIONS)
