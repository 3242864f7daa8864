"""Shard indexes: NeMo's `wdinfo.pkl` and its JSON twin `index.json`, written for ingest and precache outputs alike.

`generate_wdinfo` writes `wdinfo.pkl` exactly as NeMo does (a pickled dict of `tar_files`, `chunk_size`,
`total_key_count`, complete shards only) and `index.json`, the same without pickle (wids layout, plus sha256).
`read_index` reads `index.json` back; nothing here ever unpickles.
"""

from __future__ import annotations

import json
import pickle

from unirl_core.io import storage

WDINFO = "wdinfo.pkl"
INDEX = "index.json"
WDINFO_PICKLE_PROTOCOL = 4  # what NeMo's Python (3.8-3.13) writes by default


def generate_wdinfo(folder: str, record: dict) -> dict:
    """Write `<folder>/wdinfo.pkl` (NeMo) and `<folder>/index.json` (no pickle) for the complete shards of
    `record` ({"chunk_size", "shards": [{name, nsamples, filesize, sha256, md5, complete}], "skipped"})."""
    complete = [s for s in record["shards"] if s["complete"]]
    wdinfo = {
        "tar_files": sorted(s["name"] for s in complete),
        "chunk_size": record["chunk_size"],
        "total_key_count": len(complete) * record["chunk_size"],
    }
    index = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "chunk_size": record["chunk_size"],
        "total_key_count": wdinfo["total_key_count"],
        "shardlist": [
            {
                "url": s["name"],
                "nsamples": s["nsamples"],
                "filesize": s["filesize"],
                "md5sum": s["md5"],
                "sha256": s["sha256"],
            }
            for s in complete
        ],
        "incomplete": [s["name"] for s in record["shards"] if not s["complete"]],
        "skipped_in_reorganize": record.get("skipped", {}),
    }
    # The one pickle we write: NeMo's loader reads nothing else. Plain dict of str/int, protocol pinned.
    storage.write_bytes_atomic(f"{folder}/{WDINFO}", pickle.dumps(wdinfo, protocol=WDINFO_PICKLE_PROTOCOL))
    storage.write_bytes_atomic(f"{folder}/{INDEX}", json.dumps(index, indent=1, sort_keys=True).encode())
    return index


def read_index(folder: str) -> dict:
    """The `index.json` of a shards folder (local or URL), as `generate_wdinfo` returned it."""
    return json.loads(storage.read_text(f"{folder}/{INDEX}"))
