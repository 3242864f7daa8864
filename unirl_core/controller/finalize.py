"""After the last round, and a whole training in this process.

finalize(config)          -> export the last checkpoint, register it in MLflow with an alias
train_in_process(config)  -> every round on one rank in this process, then finalize (`unirl train --local`)
"""

from __future__ import annotations

from collections.abc import Callable

from unirl_core.config.schema import TrainConfig
from unirl_core.controller.controller import latest_record, open_tracker, run_round
from unirl_core.controller.round_plan import TrainingConfigError, output_dir, plan_rounds
from unirl_core.controller.train_eval import curve
from unirl_core.summaries import ExportSummary, TrainSummary
from unirl_core.worker.checkpoint import CheckpointError


def finalize(config: TrainConfig, run_name: str = "train", registered_model: str | None = None) -> ExportSummary:
    """Export the last checkpoint's adapter (merged pipeline with full fine-tuning) and register it in MLflow as a
    new model version with the alias `tracking.alias`; end the MLflow run. A re-run returns the same export."""
    from unirl_core.worker.export import export_checkpoint

    latest, _ = latest_record(config)
    if latest is None:
        raise CheckpointError(f"{output_dir(config) / 'checkpoints'}: no committed checkpoint to export")
    out = output_dir(config) / "export" / latest.name
    done = out.parent / f"{latest.name}.registered.json"
    if done.is_file():  # a re-run of a finished training: the same export and model version, the run's link as now
        from unirl_core.tracking.run_tracker import run_url

        finished = ExportSummary.model_validate_json(done.read_text())
        return finished.model_copy(update={"mlflow_run_url": run_url(finished.mlflow_run_id)})
    export_checkpoint(latest, out, merged=config.model.lora is None)
    tracker = open_tracker(config, run_name, None)
    name = registered_model or config.tracking.registered_model or f"unirl-{run_name}"
    version = tracker.register(str(out), "adapter" if config.model.lora else "pipeline", name, config.tracking.alias,
                               model_card(config, run_name))  # fmt: skip
    tracker.finish()
    result = ExportSummary(
        export=str(out), checkpoint=str(latest), registered_model=name, model_version=version,
        alias=config.tracking.alias, mlflow_run_id=tracker.run_id, mlflow_run_url=tracker.url(),
        tracking_failures=tracker.failures,
    )  # fmt: skip
    if version is not None:  # registered: remember it (an MLflow outage leaves it to the next run)
        from unirl_core.io.storage import write_bytes_atomic

        write_bytes_atomic(str(done), result.model_dump_json().encode())
    return result


def model_card(config: TrainConfig, run_name: str):
    """What the registered version says of itself (the domain's; the final reward and data digests come from the
    run)."""
    from unirl_core.domains.registry import domain_class

    return domain_class(config.domain.name).model_card(config, run_name)


def train_in_process(
    config: TrainConfig,
    run_name: str = "train",
    precache=None,
    on_step: Callable[[dict], None] | None = None,
    on_eval: Callable[[dict], None] | None = None,
) -> TrainSummary:
    """Every round of `config` on one rank in this process (no Prefect, no Ray), resumable like the flow's, then
    the export and its registration. The config must have `train.ray.workers: 1`."""
    from unirl_core.rewards.registry import used_model_rewards

    if config.ray.workers != 1:
        raise TrainingConfigError(
            f"train.ray.workers={config.ray.workers}: training in this process runs one rank; set it to 1"
        )
    if config.reward.placement == "dedicated" and config.steps and used_model_rewards(config.reward):
        raise TrainingConfigError(
            "train.reward.placement: dedicated serves the model rewards from Ray actors, which training in this "
            "process (--local) does not start: drop --local, or set train.reward.placement=colocated"
        )
    rounds = [run_round(config, r, run_name, precache, on_step=on_step, local=True, on_eval=on_eval)
              for r in plan_rounds(config)]  # fmt: skip
    final = finalize(config, run_name)
    return TrainSummary(**final.model_dump(), rounds=rounds, final_metrics=rounds[-1].metrics,
                        eval=curve(config, output_dir(config)))  # fmt: skip


__all__ = ["finalize", "train_in_process"]
