"""Evaluation tasks: thin Prefect adapters around unirl_core.evaluation, retried for transient errors only."""

from __future__ import annotations

from prefect import task
from prefect.concurrency.sync import concurrency

from tasks.progress import report
from tasks.retries import retry_unless
from unirl_core.errors import UserError
from unirl_core.evaluation import run
from unirl_core.evaluation.run import EvalSpec
from unirl_core.precache.run import resolve_device

is_transient = retry_unless(UserError)


@task(
    name="eval_shard",
    task_run_name="{label} shard {shard}",
    retries=2,
    retry_delay_seconds=[5, 30],
    retry_condition_fn=is_transient,
)
def score_shard(spec: EvalSpec, label: str, shard: int) -> dict:
    """One shard of one model, generated and scored; it holds one slot of the `gpu`/`cpu` concurrency limit."""
    slot = "gpu" if resolve_device(spec.device).type == "cuda" else "cpu"
    with concurrency(slot, occupy=1, strict=False):
        done = run.score_shard(spec, label, shard)
    report("rows", done["prompts"])
    return done
