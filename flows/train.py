"""The train flow: warm-up rounds, then RL rounds, each a retryable task on its own Ray worker group; then the
final adapter is exported and registered in MLflow.

Cancelling or crashing the flow run tears down the Ray processes a round started (the hooks run in the process
that supervises the run, which outlives a killed flow process).
"""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from flows.engine import flow
from tasks import train as train_tasks
from tasks.progress import report
from unirl_core.config.precache import PrecacheConfig
from unirl_core.config.schema import TrainConfig
from unirl_core.controller import RAY_RECORD, output_dir, plan_rounds
from unirl_core.controller.train_eval import curve
from unirl_core.summaries import TrainSummary


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
    report("stage", "train")  # the `unirl` command's progress display
    planned = plan_rounds(config)
    progress = create_progress_artifact(progress=0.0, key="train-progress", description=f"training {run_name}: steps")
    rounds = []
    for index, round_ in enumerate(planned):
        label = f"{round_.name} (steps {round_.first}-{round_.end - 1})"
        rounds.append(train_tasks.train_round(config, index, label, run_name, precache))
        update_progress_artifact(progress, progress=100.0 * round_.end / max(planned[-1].end, 1))
    final = train_tasks.register_model(config, run_name)
    summary = TrainSummary(rounds=rounds, final_metrics=rounds[-1].metrics, eval=curve(config, output_dir(config)),
                           **final.model_dump())  # fmt: skip
    create_markdown_artifact(markdown=_report(summary), key="train-summary", description=f"training {run_name}")
    return summary


def _report(summary: TrainSummary) -> str:
    lines = ["| round | steps | reward (last step) | loss | seconds | resumed from |", "|---|---|---|---|---|---|"]
    for s in summary.rounds:
        reward = s.metrics.get("reward_mean")
        loss = s.metrics.get("loss", s.metrics.get("warmup_loss"))
        fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
        seconds = "skipped" if s.skipped else f"{s.seconds or 0:.1f}"
        resumed_from = {None: "", -1: "started fresh"}.get(s.resumed_from, f"step {s.resumed_from}")
        lines.append(
            f"| {s.round} | {s.first_step}-{s.end_step - 1} | {fmt(reward)} | {fmt(loss)} | {seconds} "
            f"| {resumed_from} |"
        )
    lines += eval_report(summary.eval)
    lines += [
        "",
        f"- checkpoint: `{summary.checkpoint}`",
        f"- exported: `{summary.export}`",
        f"- registered model: `{summary.registered_model}` version {summary.model_version} (alias `{summary.alias}`)",
        "- MLflow run: "
        + (
            f"[{summary.mlflow_run_id}]({summary.mlflow_run_url})"
            if summary.mlflow_run_url
            else f"`{summary.mlflow_run_id}`"
        ),
    ]
    return "\n".join(lines)


def eval_report(found) -> list[str]:
    """`train.eval`'s curve as a markdown table (a row per point, a column per metric), its best step, breaches."""
    if found is None or not found.points:
        return []
    names = list(found.points[0].metrics)
    lines = ["", "Evaluation during training (`train.eval`: mean [95 % interval] per prompt set and reward):", "",
             "| step | " + " | ".join(f"eval/{n}" for n in names) + " | training reward |",
             "|---|" + "---|" * (len(names) + 1)]  # fmt: skip
    for point in found.points:
        cells = [f"{m['mean']:.4f} [{m['low']:.4f}, {m['high']:.4f}]" for m in (point.metrics[n] for n in names)]
        reward = "" if point.train_reward is None else f"{point.train_reward:.4f}"
        lines.append(f"| {point.step} | " + " | ".join(cells) + f" | {reward} |")
    if found.best_step is not None:
        lines += ["", f"- best step: {found.best_step} (eval/{found.best_metric} {found.best_value:.4f})"]
    lines += [f"- **guard breached**, {message}" for message in found.breaches]
    return lines
