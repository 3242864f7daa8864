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
def train(config: TrainConfig, run_name: str = "train", precache: PrecacheConfig | None = None) -> dict:
    """Warm-up and RL rounds on a Ray worker group (FSDP2), checkpointed and resumable; MLflow tracked."""
    rounds = plan_rounds(config)
    summaries = []
    for index, round_ in enumerate(rounds):
        label = f"{round_.name} (steps {round_.first}-{round_.end - 1})"
        summaries.append(train_tasks.train_round(config, index, label, run_name, precache))
    final = train_tasks.register_model(config, run_name)
    summary = {
        "rounds": summaries,
        "checkpoint": final["checkpoint"],
        "final_metrics": summaries[-1].get("metrics", {}),
        **{k: final[k] for k in ("export", "registered_model", "model_version", "alias", "mlflow_run_id")},
        "mlflow_run_url": final["mlflow_run_url"],
    }
    create_markdown_artifact(markdown=_report(summary), key="train-summary", description=f"training {run_name}")
    return summary


def _report(summary: dict) -> str:
    lines = ["| round | steps | reward (last step) | loss | seconds | resumed from |", "|---|---|---|---|---|---|"]
    for s in summary["rounds"]:
        m = s.get("metrics") or {}
        reward = m.get("reward_mean")
        loss = m.get("loss", m.get("warmup_loss"))
        fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
        seconds = "skipped" if s.get("skipped") else f"{s.get('seconds', 0):.1f}"
        lines.append(
            f"| {s['round']} | {s['first_step']}-{s['end_step'] - 1} | {fmt(reward)} | {fmt(loss)} | {seconds} "
            f"| {s.get('resumed_from', '')} |"
        )
    lines += [
        "",
        f"- checkpoint: `{summary['checkpoint']}`",
        f"- exported: `{summary['export']}`",
        f"- registered model: `{summary['registered_model']}` version {summary['model_version']} "
        f"(alias `{summary['alias']}`)",
        f"- MLflow run: {summary['mlflow_run_url'] or summary['mlflow_run_id']}",
    ]
    return "\n".join(lines)
