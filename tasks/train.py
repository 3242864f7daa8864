"""Training tasks: one retryable Prefect task per round, and the final export + registration.

A round retries when a worker was lost (actor death, OOM kill, a collective timing out because of a dead peer) or
its deadline passed: the retry resumes from the last committed checkpoint. A bad config, a corrupt or mismatched
checkpoint and a non-finite loss fail at once. Both return typed summaries (unirl_core.summaries).
"""

from __future__ import annotations

from prefect import task

from tasks.progress import report
from tasks.retries import retry_unless
from unirl_core.config.precache import PrecacheConfig
from unirl_core.config.schema import TrainConfig
from unirl_core.distributed.worker_group import WorkerLostError
from unirl_core.errors import UserError
from unirl_core.summaries import ExportSummary, RoundSummary
from unirl_core.trainer import RoundDeadlineError, finalize, plan_rounds, run_round

# TrainingConfigError, CheckpointError, NonFiniteError, RewardError ... fail at once
is_retryable = retry_unless(UserError, transient=(WorkerLostError, RoundDeadlineError))


def prefect_tags() -> dict[str, str]:
    """The Prefect flow run this task belongs to, for the MLflow run's tags."""
    from prefect.runtime import flow_run

    tags = {"prefect.flow_run_id": str(flow_run.id or ""), "prefect.flow_run_name": str(flow_run.name or "")}
    if flow_run.ui_url:
        tags["prefect.flow_run_url"] = str(flow_run.ui_url)
    return {k: v for k, v in tags.items() if v}


@task(
    name="train-round",
    task_run_name="{round_label}",
    retries=2,
    retry_delay_seconds=[5, 30],
    retry_condition_fn=is_retryable,
)
def train_round(
    config: TrainConfig, round_index: int, round_label: str, run_name: str, precache: PrecacheConfig | None = None
) -> RoundSummary:
    round_ = plan_rounds(config)[round_index]
    summary = run_round(
        config, round_, run_name=run_name, precache=precache, tags=prefect_tags(),
        on_step=lambda row: report("train_step", row),
    )  # fmt: skip
    return RoundSummary.model_validate(summary)  # a dict today; a RoundSummary passes through as itself


@task(name="register-model", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=is_retryable)
def register_model(config: TrainConfig, run_name: str) -> ExportSummary:
    return ExportSummary.model_validate(finalize(config, run_name))
