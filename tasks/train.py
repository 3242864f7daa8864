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
from unirl_core.controller import RoundDeadlineError, finalize, plan_rounds, run_round
from unirl_core.controller.train_eval import eval_line
from unirl_core.distributed.worker_group import WorkerLostError
from unirl_core.errors import UserError
from unirl_core.summaries import ExportSummary, RoundSummary

# TrainingConfigError, CheckpointError, NonFiniteError, RewardError ... fail at once
is_retryable = retry_unless(UserError, transient=(WorkerLostError, RoundDeadlineError))


LOGGED_STEPS_PER_ROUND = 50  # the flow run's log gets about this many step lines per round, and always the last


def prefect_tags() -> dict[str, str]:
    """The Prefect flow run this task belongs to, for the MLflow run's tags; its UI link only when Prefect knows
    its UI's address (a temporary server has no UI: its `ui_url` reads `None/flow-runs/...`)."""
    from prefect.runtime import flow_run

    from unirl_core.tracking.run_page import http_url

    tags = {"prefect.flow_run_id": str(flow_run.id or ""), "prefect.flow_run_name": str(flow_run.name or "")}
    if url := http_url(flow_run.ui_url):
        tags["prefect.flow_run_url"] = url
    return {k: v for k, v in tags.items() if v}


def step_line(row: dict) -> str:
    """One training step as a log line: `step 12 (rl round 1): reward -1.4523 +- 0.0135, loss ..., 8.3 img/s`."""
    where = f"step {row['step']} ({'warm-up' if row['stage'] == 'warmup' else 'rl'} round {row['round']})"
    if row["stage"] == "warmup":
        return f"{where}: loss {row['warmup_loss']:.4f}, lr {row['warmup_lr']:.2e}"
    parts = [f"reward {row['reward_mean']:.4f} +- {row.get('reward_std', float('nan')):.4f}"]
    parts += [f"{key} {row[key]:.3e}" for key in ("loss", "approx_kl", "grad_norm") if isinstance(row.get(key), float)]
    parts += [f"{row['images_per_s']:.1f} img/s"] if row.get("images_per_s") else []
    return f"{where}: {', '.join(parts)}"


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
    from prefect import get_run_logger

    round_ = plan_rounds(config)[round_index]
    logger, every = get_run_logger(), max(1, -(-(round_.end - round_.first) // LOGGED_STEPS_PER_ROUND))

    def on_step(row: dict) -> None:
        report("train_step", row)  # the `unirl` command's display
        if (row["step"] - round_.first) % every == 0 or row["step"] == round_.end - 1:
            logger.info(step_line(row))  # the flow run's logs in the Prefect UI

    def on_eval(point: dict) -> None:  # `train.eval`: every point
        report("train_eval", point)
        logger.info(eval_line(point))

    summary = run_round(config, round_, run_name=run_name, precache=precache, tags=prefect_tags(), on_step=on_step,
                        on_eval=on_eval)  # fmt: skip
    return RoundSummary.model_validate(summary)  # a dict today; a RoundSummary passes through as itself


@task(name="register-model", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=is_retryable)
def register_model(config: TrainConfig, run_name: str) -> ExportSummary:
    return ExportSummary.model_validate(finalize(config, run_name))
