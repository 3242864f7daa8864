"""BAGEL export task: a thin Prefect adapter around unirl_core.data.bagel.export, retried on transient errors only."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.retries import retry_unless
from unirl_core.data.bagel import export

EXPORTS = {"t2i": export.export_t2i, "vlm": export.export_vlm, "edit": export.export_edit}

# bad input (an empty source, a foreign *.parquet in the output, a bad prompt) fails at once; I/O trouble is retried
is_transient = retry_unless(ValueError, FileNotFoundError)


@task(
    name="bagel-export",
    task_run_name="export {kind} to {out_dir}",
    retries=2,
    retry_delay_seconds=[5, 30],
    retry_condition_fn=is_transient,
)
def export_task(kind: str, source: str, out_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    return EXPORTS[kind](source, out_dir, **options)
