"""The train flow: warm-up rounds, then RL rounds, each a retryable task on its own Ray worker group; then the
final adapter is exported and registered in MLflow.

Cancelling or crashing the flow run tears down the Ray processes a round started (the hooks run in the process
that supervises the run, which outlives a killed flow process).
"""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from tasks import train as train_tasks
from unirl_core.config.precache import PrecacheConfig
from unirl_core.config.schema import TrainConfig
from unirl_core.summaries import TrainSummary
from unirl_core.trainer import RAY_RECORD, output_dir, plan_rounds


def _stop_ray(flow, flow_run, state) -> None:
    """on_cancellation / on_crashed: stop the local Ray of the interrupted round, if it still runs."""
    from unirl_core.distributed.cluster import stop_recorded

    config = flow_run.parameters.get("config")
    if config is None:
        return
    config = TrainConfig.model_validate(config)
    killed = stop_recorded(output_dir(config) / RAY_RECORD)
    print(f"stopped {killed} Ray processes of the interrupted round")


@flow(name="train", log_prints=True, on_cancellation=[_stop_ray], on_crashed=[_stop_ray])
def train(config: TrainConfig, run_name: str = "train", precache: PrecacheConfig | None = None) -> TrainSummary:
    """Warm-up and RL rounds on a Ray worker group (FSDP2), checkpointed and resumable; MLflow tracked."""
    rounds = []
    for index, round_ in enumerate(plan_rounds(config)):
        label = f"{round_.name} (steps {round_.first}-{round_.end - 1})"
        rounds.append(train_tasks.train_round(config, index, label, run_name, precache))
    final = train_tasks.register_model(config, run_name)
    summary = TrainSummary(rounds=rounds, final_metrics=rounds[-1].metrics, **final.model_dump())
    create_markdown_artifact(markdown=_report(summary), key="train-summary", description=f"training {run_name}")
    return summary


def _report(summary: TrainSummary) -> str:
    lines = ["| round | steps | reward (last step) | loss | seconds | resumed from |", "|---|---|---|---|---|---|"]
    for s in summary.rounds:
        reward = s.metrics.get("reward_mean")
        loss = s.metrics.get("loss", s.metrics.get("warmup_loss"))
        fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
        seconds = "skipped" if s.skipped else f"{s.seconds or 0:.1f}"
        resumed_from = "" if s.resumed_from is None else s.resumed_from
        lines.append(
            f"| {s.round} | {s.first_step}-{s.end_step - 1} | {fmt(reward)} | {fmt(loss)} | {seconds} "
            f"| {resumed_from} |"
        )
    lines += [
        "",
        f"- checkpoint: `{summary.checkpoint}`",
        f"- exported: `{summary.export}`",
        f"- registered model: `{summary.registered_model}` version {summary.model_version} (alias `{summary.alias}`)",
        f"- MLflow run: {summary.mlflow_run_url or summary.mlflow_run_id}",
    ]
    return "\n".join(lines)
