"""The ingest flow: NeMo's stages as tasks; work units mapped with bounded concurrency.

download_parquet -> download_images (one task per unit, `download_num_processes` at a time)
                 -> reorganize_tar -> generate_wdinfo -> event `unirl.dataset.updated`
"""

from __future__ import annotations

import time
from datetime import datetime

from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.events import emit_event
from prefect.futures import as_completed

from flows.engine import flow
from tasks import ingest as ingest_tasks
from tasks.progress import report
from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest.download import COMMITTED_NOW, committed_stats
from unirl_core.ingest.stages import committed_units, published_index, summarize
from unirl_core.ingest.workers import unit_processes
from unirl_core.summaries import IngestSummary


@flow(name="ingest", log_prints=True)
def ingest(config: IngestConfig) -> IngestSummary:
    """Parquet (or jsonl/csv) of captions and image URLs or bytes -> equal-size WebDataset shards and an index."""
    report("stage", "ingest")  # the `unirl` command's progress display
    started, published = time.time(), published_index(config.dataset_output_root)
    units = ingest_tasks.plan_units(config)
    for unit in units:  # committed with other output settings: an error now, before any download
        committed_stats(config.dataset_output_root, unit, config)
    stats = download_images(config, units) if config.download_images.enable else committed_units(config, units)
    record = ingest_tasks.reorganize(config, units) if config.reorganize_tar.enable else None
    index = ingest_tasks.generate_wdinfo(config, record) if config.generate_wdinfo.enable else None
    new = [s for s in stats if s.get(COMMITTED_NOW)]
    # from the first unit this run started: `unirl ingest` starts some before the flow (workers.head_start)
    started = min([started, *(datetime.fromisoformat(s["start_time"]).timestamp() for s in new)])
    summary = summarize(config.dataset_output_root, units, stats, index, time.time() - started, len(new))
    # the dataset changed: new units, or an index unlike the last one (a run killed after its units committed)
    _publish(summary, changed=bool(new) or published_index(config.dataset_output_root) != published)
    return summary


def download_images(config: IngestConfig, units: list) -> list[dict]:
    """One task per work unit in worker processes (their own interpreter locks: unirl_core/ingest/workers.py):
    `download_num_processes` units take rows at a time, and as many more may finish their last rows; a progress
    artifact follows them."""
    report("total_rows", sum(u.stop - u.start for u in units))
    progress = create_progress_artifact(progress=0.0, key="ingest-progress", description="ingest: work units committed")
    limit, futures, running = config.download_images.download_num_processes, [], []

    def wait_for_one() -> None:
        running.remove(next(as_completed(running)))
        finished = len(futures) - len(running)
        update_progress_artifact(progress, progress=100.0 * finished / len(units))

    with unit_processes(limit) as pool:
        limit = pool.max_units if pool is not None else limit  # the pool gives units their turns
        for unit in units:
            if len(running) >= limit:
                wait_for_one()
            future = ingest_tasks.download_unit.submit(config, unit)
            futures.append(future)
            running.append(future)
        while running:
            wait_for_one()
    return [future.result() for future in futures]


def _publish(summary: IngestSummary, changed: bool) -> None:
    values = summary.model_dump()
    table = [{"metric": k, "value": str(v)} for k, v in values.items() if k != "skip_reasons"]
    table += [{"metric": f"skipped: {reason}", "value": str(n)} for reason, n in summary.skip_reasons.items()]
    create_table_artifact(table=table, key="ingest-summary", description=f"ingest of {summary.dataset}")
    if not changed:  # a re-run that changed nothing: no event (retrain would loop on itself)
        return
    emit_event(
        event="unirl.dataset.updated",
        resource={
            "prefect.resource.id": f"unirl.dataset.{summary.dataset}",
            "unirl.dataset.uri": summary.dataset,
        },
        payload={k: values[k] for k in ("dataset", "rows", "ok", "skipped", "shards", "samples_in_shards")},
    )
