"""The precache stages as plain functions (the Prefect flow wires them).

ids, count = plan_tasks(config)                    # NeMo's node_array_size / override_task_*
done = [run_task(config, t, count) for t in ids]   # t{t}_r0_{n}.tar + manifests, resumable per shard
index = write_index(config)                        # wdinfo.pkl + index.json over every finished task
"""

from __future__ import annotations

from collections import Counter

from unirl_core.config.precache import PrecacheConfig
from unirl_core.io.shard_index import generate_wdinfo
from unirl_core.precache.read import done_records
from unirl_core.precache.run import PrecacheError, run_task
from unirl_core.precache.source import source_shards, task_plan
from unirl_core.summaries import PrecacheSummary

__all__ = ["plan_tasks", "run_task", "summarize", "write_index"]


def plan_tasks(config: PrecacheConfig) -> tuple[list[int], int]:
    if not config.input_dir or not config.output_dir:
        raise PrecacheError("precache needs input_dir (or an ingest section in the same recipe) and output_dir")
    shards = source_shards(config.input_dir)
    ids, count = task_plan(config)
    if count > len(shards):
        raise PrecacheError(
            f"{count} tasks for {len(shards)} source shards: some tasks would get no shard; use fewer tasks"
        )
    return ids, count


def write_index(config: PrecacheConfig) -> dict:
    records = done_records(config.output_dir)
    skipped = Counter(s["reason"].split(":")[0] for r in records for s in r["skipped"])
    record = {
        "chunk_size": config.tar_chunk_size,
        "shards": [shard for r in records for shard in r["shards"]],
        "skipped": dict(sorted(skipped.items())),
    }
    return generate_wdinfo(config.output_dir.rstrip("/"), record)


def summarize(config: PrecacheConfig, done: list[dict], index: dict, seconds: float) -> PrecacheSummary:
    samples = sum(d["samples"] for d in done)
    return PrecacheSummary(
        output=config.output_dir,
        tasks=len(done),
        source_samples=sum(d["source_samples"] for d in done),
        samples=samples,
        encoded=sum(d.get("encoded_now", 0) for d in done),
        skipped=sum(len(d["skipped"]) for d in done),
        shards=len(index["shardlist"]),
        samples_in_complete_shards=index["total_key_count"],
        seconds=round(seconds, 2),
        samples_per_s=round(samples / seconds, 1) if seconds > 0 else None,
    )
