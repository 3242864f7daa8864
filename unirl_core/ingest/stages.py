"""The ingest stages as plain functions (the Prefect flow wires them; a notebook can call them directly).

units  = stage_download_parquet(config)                  # units.json
stats  = [download_unit(root, u, config) for u in units]  # raw/NNNNN.{tar,parquet,_stats.json}
record = stage_reorganize_tar(config, units)              # the dataset's error budget, then shards/NNNNN.tar, ...
index  = stage_generate_wdinfo(config, record)            # shards/wdinfo.pkl, shards/index.json
"""

from __future__ import annotations

import json
from collections import Counter

from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest.budget import judge_dataset
from unirl_core.ingest.download import committed_stats, download_unit, raw_paths
from unirl_core.ingest.plan import IngestInputError, WorkUnit, plan_units, read_plan, write_plan
from unirl_core.ingest.reorganize import REORGANIZE_RECORD, reorganize, shards_folder
from unirl_core.io import storage
from unirl_core.io.shard_index import INDEX, generate_wdinfo
from unirl_core.summaries import IngestSummary

__all__ = [
    "download_unit",
    "stage_download_parquet",
    "stage_generate_wdinfo",
    "stage_reorganize_tar",
    "summarize",
]


def stage_download_parquet(config: IngestConfig) -> list[WorkUnit]:
    root = config.dataset_output_root
    previous = read_plan(root)
    if not config.download_parquet.enable:
        if not previous.units:
            raise IngestInputError(f"download_parquet is disabled but {root}/units.json does not exist yet")
        return previous.units
    plan = plan_units(config, previous)
    if plan != previous:
        write_plan(root, plan)
    return plan.units


def committed_units(config: IngestConfig, units: list[WorkUnit]) -> list[dict]:
    """Every unit's committed stats, in unit order; an error naming the units that are not committed."""
    stats = [committed_stats(config.dataset_output_root, unit, config) for unit in units]
    missing = [unit.name for unit, s in zip(units, stats, strict=True) if s is None]
    if missing:
        raise IngestInputError(
            f"units {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} have no committed raw shard; "
            "run download_images first"
        )
    return stats


def stage_reorganize_tar(config: IngestConfig, units: list[WorkUnit]) -> dict:
    """Equal-size shards from the committed units, once all of them together are within the error budget
    (ErrorBudgetExceeded otherwise, before any shard is written)."""
    root = config.dataset_output_root
    stats = committed_units(config, units)
    judge_dataset(root, stats, config.download_images)
    written = {config.media_extension, "txt", "json"}  # every sample's members (download.py)
    raw_tars = [
        {"path": raw_paths(root, unit)["tar"], "sha256": s["tar"]["sha256"], "md5": s["tar"].get("md5"),
         "nsamples": s["tar"]["nsamples"],
         "has_extensions": set(config.file_ext_in_tar) <= written}
        for unit, s in zip(units, stats, strict=True)
    ]  # fmt: skip
    return reorganize(root, raw_tars, config.reorganize_tar.tar_chunk_size, config.file_ext_in_tar)


def stage_generate_wdinfo(config: IngestConfig, record: dict | None = None) -> dict:
    if record is None:
        path = f"{shards_folder(config.dataset_output_root)}/{REORGANIZE_RECORD}"
        if not storage.exists(path):
            raise IngestInputError(f"generate_wdinfo needs {path}: run reorganize_tar first")
        record = json.loads(storage.read_text(path))
    return generate_wdinfo(shards_folder(config.dataset_output_root), record)


def published_index(root: str) -> str | None:
    """The dataset's index.json as text (None before the first generate_wdinfo), to tell whether a run changed it."""
    path = f"{shards_folder(root)}/{INDEX}"
    return storage.read_text(path) if storage.exists(path) else None


def summarize(
    root: str, units: list[WorkUnit], stats: list[dict], index: dict | None, seconds: float, new_units: int = 0
) -> IngestSummary:
    """What a user wants at the end: rows in, samples out, skips by reason, throughput (`new_units`: units this
    run committed)."""
    reasons: Counter = Counter()
    for s in stats:
        reasons.update(s["skip_reasons"])
    rows = sum(s["count"] for s in stats)
    ok = sum(s["successes"] for s in stats)
    shards = {}
    if index is not None:
        shards = {
            "shards": len(index["shardlist"]),
            "samples_in_shards": index["total_key_count"],
            "incomplete_shards": index["incomplete"],
            "bytes": sum(s["filesize"] for s in index["shardlist"]),
        }
    return IngestSummary(
        dataset=root,
        units=len(units),
        rows=rows,
        ok=ok,
        skipped=sum(reasons.values()),
        skip_reasons=dict(sorted(reasons.items())),
        seconds=round(seconds, 2),
        images_per_s=round(ok / seconds, 1) if seconds > 0 else None,
        **shards,
        new_units=new_units,
    )
