"""Reading encoding shards for training: identity-checked, and without pickle unless the caller trusts the shards.

for sample in read_encodings(config.output_dir, config):   # config: the PrecacheConfig training expects
    sample["key"], sample["encodings"]["autoencoderkl_image"]  # torch tensors

A cache is data from wherever it was copied from: a member whose name could escape a folder (`..`, absolute, NUL,
over-long) is refused always, a pickle-like or executable one (`.pickle`, `.pth`, `.so`, ...) unless trusted
(`trusted=True`, or `precache.trusted: true` in the recipe), with an UnsafeCacheError naming shard and member,
before the sample holding it is yielded.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Iterable, Iterator

import fsspec
import numpy as np
import torch
from safetensors.torch import load as safetensors_load

from unirl_core.config.precache import PrecacheConfig
from unirl_core.io.tars import Span, iter_samples_with_spans, read_span, unsafe_member_reason
from unirl_core.precache.members import unsafe_extension_reason
from unirl_core.precache.run import PrecacheError, cache_identity


class UnsafeCacheError(PrecacheError):
    """A cache shard holds a member readers refuse: a name that could escape a folder, or a pickle-like or
    executable member in a cache not marked trusted. The message names the shard, the member and the fix."""


def check_members(shard: str, key: str, extensions: Iterable[str], trusted: bool) -> None:
    """Raise UnsafeCacheError if a member `<key>.<extension>` of `shard` must not be read."""
    for extension in sorted(extensions):
        member = f"{key}.{extension}"
        reason = unsafe_member_reason(member)
        if reason:
            raise UnsafeCacheError(
                f"{shard}: {reason}: refused, trusted or not (unirl precache never writes such a name); rebuild "
                "the cache with `unirl precache` from source shards you trust"
            )
        reason = None if trusted else unsafe_extension_reason(extension)
        if reason:
            raise UnsafeCacheError(
                f"{shard}: member {member!r} refused: {reason}. If you built this cache (or trust who did), read "
                "it with precache.trusted: true (trusted=True); otherwise rebuild it with `unirl precache`"
            )


def done_records(output_dir: str) -> list[dict]:
    fs, path = fsspec.core.url_to_fs(output_dir)
    records = [json.loads(fs.cat_file(p)) for p in sorted(fs.glob(f"{path}/t*_r*.done.json"))]
    if not records:
        raise PrecacheError(f"{output_dir}: no finished precache task (t*_r*.done.json); run `unirl precache`")
    return records


def check_cache(output_dir: str, wanted: PrecacheConfig) -> list[dict]:
    """The finished tasks' records, after checking they were built with what `wanted` asks for (weights are
    compared by the writer on resume; here the encoders' classes, kwargs, transform, precision and format)."""
    records = done_records(output_dir)
    expected = cache_identity(wanted, None)
    for record in records:
        recorded = json.loads(json.dumps(record["identity"]))
        for entry in recorded["encodings"]:
            entry.pop("weights", None)
        if recorded != expected:
            raise PrecacheError(
                f"{output_dir}: cache built with {json.dumps(recorded, sort_keys=True)}, config wants "
                f"{json.dumps(expected, sort_keys=True)}"
            )
    return records


def decode_members(members: dict[str, bytes], keys: list[str], trusted: bool = False) -> dict[str, torch.Tensor]:
    """{encoding key: tensor} from a sample's members in any of the three formats. Pickle only when trusted."""
    if "safetensors" in members:
        return safetensors_load(members["safetensors"])
    if "pickle" in members or any(ext.endswith(("pickle", "pkl")) for ext in members):
        if not trusted:
            raise PrecacheError("pickled encodings refused: pass trusted=True only for shards you made or trust")
        return {
            k: torch.from_numpy(np.asarray(v)) for k, v in pickle.loads(members["pickle"]).items()
        }  # trusted opt-in
    return {
        key: torch.from_numpy(np.load(io.BytesIO(members[key]), allow_pickle=False)) for key in keys if key in members
    }


def read_encodings(output_dir: str, wanted: PrecacheConfig, trusted: bool = False) -> Iterator[dict]:
    """Every encoded sample of a finished cache, in task then shard order: {"key", "encodings", "originals",
    "shard", "spans"}; `read_sample(shard, spans, ...)` reads the sample's encodings again later, by offset.
    `trusted` (or `wanted.trusted`): pickle-like members are read (nemo_pickle caches)."""
    keys, trusted = [e.key for e in wanted.encodings], trusted or wanted.trusted
    for record in check_cache(output_dir, wanted):
        for shard in record["shards"]:
            path = f"{output_dir.rstrip('/')}/{shard['name']}"
            for key, members, spans in iter_samples_with_spans(path):
                check_members(path, key, members, trusted)
                encodings = decode_members(members, keys, trusted)
                originals = {
                    ext: data
                    for ext, data in members.items()
                    if ext not in keys and ext not in ("safetensors", "pickle")
                }
                yield {"key": key, "encodings": encodings, "originals": originals, "shard": path, "spans": spans}


def encoding_spans(spans: dict[str, Span], keys: list[str]) -> dict[str, Span]:
    """The members a sample's encodings `keys` are decoded from (one safetensors/pickle member, or one per key)."""
    for packed in ("safetensors", "pickle"):
        if packed in spans:
            return {packed: spans[packed]}
    return {key: spans[key] for key in keys if key in spans}


def read_sample(shard: str, spans: dict[str, Span], keys: list[str], trusted: bool = False) -> dict[str, torch.Tensor]:
    """The encodings `keys` of one sample, read by offset from its shard (spans from `read_encodings`)."""
    members = {ext: read_span(shard, span) for ext, span in encoding_spans(spans, keys).items()}
    return decode_members(members, keys, trusted)
