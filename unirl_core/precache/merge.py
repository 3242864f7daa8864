"""NeMo's merge_source_tar: copy chosen members of each source sample next to its encodings, after precaching.

Output samples are named `<source tar>/<source key>` and appear in source order (minus skips), so each output
shard is merged in one pass beside its source tars. A merged shard replaces the old one atomically; its manifest
and the task's done record get the new hash, and `merged` lists the extensions (a re-run is a no-op).

Copied from source shards only (unless `precache.trusted: true`), as `members.MERGEABLE_EXTENSIONS`:
  images     jpg, jpeg, png, webp    what ingest stores (`encode_format`), and JPEG's other spelling
  text       txt, json               ingest's caption and per-row metadata
  encodings  safetensors, npy        our safe formats (read without pickle)
Anything else (`pickle`, `pth`, `pyd`, `so`, `bin`, scripts, ...) is an error before a shard is touched. Samples
with unsafe names or pickle-like members were skipped by the precache, so they are never merged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from unirl_core.config.precache import PrecacheConfig
from unirl_core.io import storage
from unirl_core.io.tars import TarShardWriter, iter_samples
from unirl_core.precache.members import MERGEABLE_EXTENSIONS, TRUSTED_HINT, unmergeable
from unirl_core.precache.read import done_records
from unirl_core.precache.run import PrecacheError


def merge_source_tar(config: PrecacheConfig, extensions: list[str]) -> int:
    """Add `extensions` members from the source shards to every output sample; returns samples merged."""
    refused = unmergeable(extensions, config.trusted)
    if refused:
        raise PrecacheError(
            f"merge_source_tar: {refused} are not copied from source shards (allowed: "
            f"{', '.join(sorted(MERGEABLE_EXTENSIONS))}); {TRUSTED_HINT}"
        )
    out, merged = config.output_dir.rstrip("/"), 0
    for done in done_records(out):
        if sorted(done.get("merged", [])) == sorted(extensions):
            continue
        for shard in done["shards"]:
            info = _merge_shard(f"{out}/{shard['name']}", config.input_dir.rstrip("/"), extensions)
            shard.update(filesize=info.filesize, sha256=info.sha256, md5=info.md5)
            manifest = f"{out}/{shard['name'][:-4]}.json"
            record = json.loads(storage.read_text(manifest))
            record["shard"] = shard
            storage.write_bytes_atomic(manifest, json.dumps(record, indent=1, sort_keys=True).encode())
            merged += info.nsamples
        done["merged"] = sorted(extensions)
        path = f"{out}/t{done['task']}_r{done['rank']}.done.json"
        storage.write_bytes_atomic(path, json.dumps(done, indent=1, sort_keys=True).encode())
    return merged


def _merge_shard(path: str, source_dir: str, extensions: list[str]):
    sources = _SourceCursor(source_dir)
    with TarShardWriter(path) as writer:
        for key, members in iter_samples(path):
            extra = sources.members(key)
            writer.write(key, {**members, **{ext: extra[ext] for ext in extensions if ext in extra}})
        return writer.commit()


class _SourceCursor:
    """Walks source tars forward, in step with the output keys `<tar name>/<key>`."""

    def __init__(self, source_dir: str):
        self.source_dir, self.tar, self.samples = source_dir, None, iter(())

    def members(self, output_key: str) -> dict[str, bytes]:
        tar_name, _, key = output_key.partition("/")
        if tar_name != self.tar:
            self.tar, self.samples = tar_name, self._open(tar_name)
        for source_key, members in self.samples:
            if source_key == key:
                return members
        raise PrecacheError(f"merge_source_tar: {output_key} is not in {self.source_dir}/{tar_name} (in order)")

    def _open(self, tar_name: str) -> Iterator:
        return iter_samples(f"{self.source_dir}/{tar_name}")
