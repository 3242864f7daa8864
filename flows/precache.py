"""The precache flow: NeMo's precache_encodings over task slices, then the shard index.

plan tasks -> precache_encodings (one Prefect task per NeMo task id, each holding a `gpu`/`cpu` slot of the
global concurrency limit) -> generate_wdinfo over the outputs
"""

from __future__ import annotations

import time

from prefect import unmapped
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.futures import as_completed

from flows.engine import flow
from tasks import precache as precache_tasks
from tasks.progress import report
from unirl_core.config.precache import PrecacheConfig
from unirl_core.precache.stages import summarize
from unirl_core.summaries import PrecacheSummary


@flow(name="precache", log_prints=True)
def precache(config: PrecacheConfig) -> PrecacheSummary:
    """WebDataset shards -> encoding shards of frozen encoders (safe formats by default) and an index."""
    report("stage", "precache")  # the `unirl` command's progress display
    started = time.monotonic()
    ids, count = precache_tasks.plan_tasks(config)
    futures = precache_tasks.precache_task.map(unmapped(config), ids, unmapped(count))
    progress = create_progress_artifact(progress=0.0, key="precache-progress", description="precache: tasks done")
    for finished, _ in enumerate(as_completed(futures), start=1):
        update_progress_artifact(progress, progress=100.0 * finished / len(futures))
    done = [future.result() for future in futures]
    if config.merge_source_extensions:
        precache_tasks.merge_source_tar(config)
    index = precache_tasks.write_index(config)
    summary = summarize(config, done, index, time.monotonic() - started)
    create_table_artifact(
        table=[{"metric": k, "value": str(v)} for k, v in summary.model_dump().items()],
        key="precache-summary",
        description=f"precache into {config.output_dir}",
    )
    return summary
