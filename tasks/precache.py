"""Precache tasks: thin Prefect adapters around unirl_core.precache with retries for transient errors only."""

from __future__ import annotations

from prefect import task
from prefect.concurrency.sync import concurrency

from tasks.progress import report
from tasks.retries import retry_unless
from unirl_core.config.precache import PrecacheConfig
from unirl_core.errors import UserError
from unirl_core.precache import stages
from unirl_core.precache.run import resolve_device

is_transient = retry_unless(UserError)  # a PrecacheError (bad config, bad encoder output) fails at once


@task(name="plan-precache-tasks")
def plan_tasks(config: PrecacheConfig) -> tuple[list[int], int]:
    return stages.plan_tasks(config)


@task(
    name="precache_encodings",
    task_run_name="task {task_id} of {count}",
    retries=2,
    retry_delay_seconds=[5, 30],
    retry_condition_fn=is_transient,
)
def precache_task(config: PrecacheConfig, task_id: int, count: int) -> dict:
    """One NeMo task; it holds one slot of the global concurrency limit named after its device kind (`gpu`/`cpu`)."""
    slot = "gpu" if resolve_device(config.device).type == "cuda" else "cpu"
    with concurrency(slot, occupy=1, strict=False):
        return stages.run_task(config, task_id, count, on_samples=lambda n: report("rows", n))


@task(name="generate_wdinfo", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=is_transient)
def write_index(config: PrecacheConfig) -> dict:
    return stages.write_index(config)


@task(name="merge_source_tar", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=is_transient)
def merge_source_tar(config: PrecacheConfig) -> int:
    from unirl_core.precache.merge import merge_source_tar as merge

    return merge(config, config.merge_source_extensions)
