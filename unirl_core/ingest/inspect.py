"""Read back an ingested dataset or a precache output: the index, the incomplete tail shards it leaves out, the skip
accounting, and a few sample records (`unirl shards inspect`)."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from collections.abc import Iterator

import fsspec
import numpy as np
from PIL import Image

from unirl_core.errors import UserError
from unirl_core.ingest.reorganize import INCOMPLETE
from unirl_core.io import storage
from unirl_core.io.shard_index import INDEX, read_index
from unirl_core.io.tars import iter_samples, sample_key

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")


class DatasetNotFound(UserError, ValueError):
    pass


def _locate(path: str) -> tuple[str, str]:
    """(dataset root, shards folder) for a root, a shards folder or an index.json path."""
    path = path.rstrip("/")
    if path.endswith(INDEX):
        path = path.rsplit("/", 1)[0]
    if storage.exists(f"{path}/shards/{INDEX}"):
        return path, f"{path}/shards"
    if storage.exists(f"{path}/{INDEX}"):
        return path.rsplit("/", 1)[0], path
    raise DatasetNotFound(f"{path}: no index.json here or in {path}/shards; run `unirl ingest` (generate_wdinfo)")


def describe(path: str) -> dict:
    """The summary line of `unirl shards inspect`: the index's complete shards and samples (what wdinfo.pkl and
    NeMo's loader count) and the incomplete tail shards beside them, counted by reading them."""
    root, folder = _locate(path)
    index = read_index(folder)
    rows, reasons = _rows_and_skips(root, folder, index)
    complete = [s["url"] for s in index["shardlist"]]
    tail = _incomplete_shards(folder, index)
    tail_samples = sum(tail.values())
    fs, shards_path = fsspec.core.url_to_fs(folder)
    summary = {
        "dataset": root,
        "shards_folder": folder,
        "shards": len(complete),
        "samples": index["total_key_count"],
        "bytes": sum(s["filesize"] for s in index["shardlist"]),
        "chunk_size": index["chunk_size"],
        "incomplete": list(tail),
        "incomplete_shards": len(tail),
        "incomplete_samples": tail_samples,
        "incomplete_bytes": sum(fs.size(f"{shards_path}/{name}") for name in tail),
        "total_samples": index["total_key_count"] + tail_samples,
        "rows": rows,
        "skip_reasons": dict(sorted(reasons.items())),
        "shard_names": complete + list(tail),
    }
    if tail_samples:
        summary["note"] = (
            f"{tail_samples} sample(s) in {len(tail)} incomplete shard(s), short of chunk_size "
            f"{index['chunk_size']}: the index (wdinfo.pkl, index.json) lists complete shards only, so NeMo's loader "
            "skips them; unirl reads every shard"
        )
    return summary


def _rows_and_skips(root: str, folder: str, index: dict) -> tuple[int, Counter]:
    """Source rows and skip reasons: a precache output's task records, else an ingest output's raw shard stats."""
    reasons: Counter = Counter()
    rows = 0
    fs, shards_path = fsspec.core.url_to_fs(folder)
    precache_tasks = sorted(fs.glob(f"{shards_path}/t*_r*.done.json"))
    if precache_tasks:
        for done_path in precache_tasks:
            done = json.loads(fs.cat_file(done_path))
            rows += done["source_samples"]
            reasons.update(s["reason"].split(":")[0] for s in done["skipped"])
        return rows, reasons
    fs, raw = fsspec.core.url_to_fs(f"{root}/raw")
    for stats_path in sorted(fs.glob(f"{raw}/*_stats.json")):
        stats = json.loads(fs.cat_file(stats_path))
        rows += stats["count"]
        reasons.update(stats["skip_reasons"])
    reasons.update(index.get("skipped_in_reorganize", {}))
    return rows, reasons


def _incomplete_shards(folder: str, index: dict) -> dict[str, int]:
    """{name: samples} of the tail shards present in `folder`: those the index lists as incomplete and those with
    a `<name>.INCOMPLETE` marker (ingest and precache both write one), samples counted from the tar headers."""
    fs, shards_path = fsspec.core.url_to_fs(folder)
    present = {p.rsplit("/", 1)[-1] for p in fs.glob(f"{shards_path}/*.tar")}
    markers = fs.glob(f"{shards_path}/*.tar{INCOMPLETE}")
    marked = sorted(p.rsplit("/", 1)[-1].removesuffix(INCOMPLETE) for p in markers)
    complete = {s["url"] for s in index["shardlist"]}
    names = dict.fromkeys(n for n in [*index["incomplete"], *marked] if n in present and n not in complete)
    return {name: _count_samples(f"{folder}/{name}") for name in names}


def _count_samples(path: str) -> int:
    """Samples in a tar, from its member names only (members of a sample are adjacent; no data is decoded)."""
    count, last = 0, None
    with fsspec.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
        for member in tar:
            key = sample_key(member.name)[0] if member.isfile() else last
            if key != last:
                count, last = count + 1, key
    return count


KNOWN_EXTENSIONS = {*IMAGE_EXTENSIONS, "txt", "json"}


def _encodings(members: dict[str, bytes]) -> dict:
    """Shape and dtype of each stored encoding (precache outputs); pickles are named, never loaded."""
    if "safetensors" in members:
        from safetensors.torch import load

        return {
            k: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for k, t in load(members["safetensors"]).items()
        }
    if "pickle" in members:
        return {"pickle": "not loaded: pickled member (read it with trusted=True only if you trust the shards)"}
    found = {}
    for ext, data in members.items():
        if ext in KNOWN_EXTENSIONS:
            continue
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError:
            continue
        found[ext] = {"shape": list(array.shape), "dtype": str(array.dtype)}
    return found


def sample_records(folder: str, shard_names: list[str], limit: int) -> Iterator[dict]:
    """The first `limit` samples: key, caption, image size (from the header only) and metadata (and a video's size,
    frames, rate and duration)."""
    if limit <= 0:
        return
    shown = 0
    for name in shard_names:
        for key, members in iter_samples(f"{folder}/{name}"):
            image_ext = next((e for e in IMAGE_EXTENSIONS if e in members), None)
            size = Image.open(io.BytesIO(members[image_ext])).size if image_ext else None
            record = {
                "key": key,
                "shard": name,
                "caption": members.get("txt", b"").decode("utf-8"),
                "image": {"format": image_ext, "width": size[0], "height": size[1]} if size else None,
                "metadata": json.loads(members["json"]) if "json" in members else None,
            }
            if "mp4" in members and record["metadata"]:  # a video sample (ingest.video): what ingest measured
                record["video"] = {k: record["metadata"].get(k) for k in ("width", "height", "num_frames", "fps", "duration")}  # fmt: skip
            encodings = _encodings(members)
            if encodings:
                record["encodings"] = encodings
            yield record
            shown += 1
            if shown == limit:
                return
