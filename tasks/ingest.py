"""Ingest tasks: thin Prefect adapters around unirl_core.ingest with retries for transient errors only."""

from __future__ import annotations

from prefect import task

from tasks.progress import report
from tasks.retries import retry_unless
from unirl_core.config.ingest import IngestConfig
from unirl_core.errors import UserError
from unirl_core.ingest import stages, workers
from unirl_core.ingest.plan import WorkUnit

is_transient = retry_unless(UserError)  # bad input (IngestInputError, ErrorBudgetExceeded) fails at once


@task(name="download_parquet", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=is_transient)
def plan_units(config: IngestConfig) -> list[WorkUnit]:
    return stages.stage_download_parquet(config)


@task(
    name="download_images",
    task_run_name="unit {unit.name}",
    retries=2,
    retry_delay_seconds=[5, 30],
    retry_condition_fn=is_transient,
)
def download_unit(config: IngestConfig, unit: WorkUnit) -> dict:
    """In the flow's worker processes (`workers.unit_processes`), else in this process."""
    return workers.run_unit(config.dataset_output_root, unit, config, on_row=lambda n: report("rows", n))


@task(name="reorganize_tar", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=is_transient)
def reorganize(config: IngestConfig, units: list[WorkUnit]) -> dict:
    return stages.stage_reorganize_tar(config, units)


@task(name="generate_wdinfo", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=is_transient)
def generate_wdinfo(config: IngestConfig, record: dict | None) -> dict:
    return stages.stage_generate_wdinfo(config, record)
