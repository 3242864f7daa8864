"""The single controller of a training round, over a group of FSDP2-sharded workers: Ray actors, or one rank in
this process (`unirl train --local`): one loop, two transports.

    run_round(config, round)  -> resume from the latest committed checkpoint, the round strategy's before-steps
                                 (warm-up eval), the round's remaining steps (each logged, checkpointed when due),
                                 its after-steps (warm-up eval; sample grid, eval grid)

One RL step: the controller draws the prompts and expands GRPO groups, scatters whole groups to the ranks, which
roll out with the trained module itself and score their images; the controller gathers the rewards and computes
advantages over the whole batch (a group is never split across a normalization), scatters them back, and the ranks
train (FSDP averages gradients). Every random draw of a rollout depends on (seed, step, sample id) only, so a
recipe gives the same rewards on any number of workers. Metrics are reduced here; the controller alone writes the
checkpoints' commit records, `metrics.jsonl` and MLflow.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from unirl_core.algorithms.advantages import PerPromptStatTracker
from unirl_core.config.schema import TrainConfig
from unirl_core.controller.grids import Grids
from unirl_core.controller.metrics_file import MetricsFile
from unirl_core.controller.round_plan import (
    Round,
    RoundDeadlineError,
    TrainingConfigError,
    output_dir,
    validate,
    worker_credentials,
)
from unirl_core.controller.rounds import STRATEGIES
from unirl_core.controller.train_eval import guard_stop
from unirl_core.data.sources import build_source
from unirl_core.io.storage import permanent_errors_name
from unirl_core.summaries import RoundSummary
from unirl_core.worker.checkpoint import CheckpointError, CheckpointManager, config_hash, legacy_config_hash
from unirl_core.worker.export import CONFIG_FILE
from unirl_core.worker.worker import TrainWorker

RAY_RECORD = "ray_processes.json"  # the local Ray of the running round, for the flow's teardown hooks


def checkpoints(config: TrainConfig, states: dict | None = None) -> CheckpointManager:
    identity = {"config_hash": config_hash(config), "world_size": config.ray.workers}
    accepted = {"config_hash": {legacy_config_hash(config)}}  # checkpoints of this recipe by an earlier unirl
    return CheckpointManager(output_dir(config) / "checkpoints", config.keep_checkpoints, states, identity,
                             config.checkpoint.on_corrupt, accepted)  # fmt: skip


def latest_record(config: TrainConfig) -> tuple[Path | None, dict[str, Any] | None]:
    """The latest committed checkpoint of this run and its record, checked against this config and world size."""
    return checkpoints(config).load(states=False)


class Progress:
    """The trainer's own place in the run, stored flat in the commit record."""

    def __init__(self, round_: Round, mlflow_run):
        self.round, self.mlflow_run, self.step = round_, mlflow_run, round_.first

    def state_dict(self) -> dict[str, Any]:
        step = self.step
        return {"global_step": step, "stage": self.round.stage, "stage_step": step - self.round.stage_start,
                "round": self.round.index, "mlflow_run_id": self.mlflow_run.run_id}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["global_step"] + 1


class Controller:
    """One round on the controller: the group, the data source, the advantage tracker, the round's strategy (RL or
    warm-up: `rounds.py`), the checkpoints of their named states, the metrics file, the grids and tracking."""

    def __init__(self, config: TrainConfig, round_: Round, group, mlflow_run, precache, on_step, on_eval=None):
        self.config, self.round, self.group, self.mlflow_run, self.on_step = config, round_, group, mlflow_run, on_step
        self.on_eval = on_eval  # `train.eval`'s points, as `train_eval.eval_line` reads them
        self.out = output_dir(config)
        self.workers = config.ray.workers
        self.source = build_source(config.data)
        algorithm = config.algorithm
        self.advantage_tracker = PerPromptStatTracker(algorithm.tracker_buffer_size, algorithm.tracker_min_count)
        self.progress = Progress(round_, mlflow_run)
        self.metrics_file = MetricsFile(self.out)
        self.grids = Grids(config, round_, group, mlflow_run, self.out)
        self.strategy = STRATEGIES[round_.stage](self, precache)
        # "tracker": the advantage tracker's state key in commit records (kept: checkpoints carry it); MLflow's run is
        # `mlflow_run`
        states = {"": self.progress, "source": self.source, "tracker": self.advantage_tracker}
        self.checkpoints = checkpoints(config, states | self.strategy.states())
        self.last_checkpoint: Path | None = None
        self.stop: Exception | None = None  # what stopped the run after a step's checkpoint (`train.eval`'s guards)

    def run(self, latest: Path | None, record: dict | None, deadline: float) -> tuple[dict, dict]:
        """Resume, the strategy's before-steps, the remaining steps, its after-steps: (last metrics, outputs)."""
        self.resume(latest, record)
        outputs = self.strategy.before_steps(deadline)
        metrics = self.run_steps(deadline)
        outputs |= self.strategy.after_steps(deadline)
        if self.stop is not None:  # after the round's grids: what the stopped run shows is kept
            raise self.stop
        return metrics, outputs

    def resume(self, latest: Path | None, record: dict | None) -> None:
        """Continue after the latest checkpoint: the same stage restores everything (weights, optimizer, EMA,
        schedule, RNG, data cursor, advantage tracker); a new stage starts from the trained weights alone."""
        if record is None:
            return
        same = record["stage"] == self.round.stage
        self.group.run(TrainWorker.load, str(latest), record, not same)
        if same:
            self.checkpoints.restore(record)
        self.progress.step = record["global_step"] + 1

    def run_steps(self, deadline: float) -> dict[str, float]:
        """The round's remaining steps, each logged as it ends (before its commit), checkpointed every
        `checkpoint_every` stage steps and at the round's end. Exactly once: rows of steps past the resumed
        checkpoint (logged, then lost with a kill or a failed checkpoint write) are dropped from `metrics.jsonl`
        before they run again, and MLflow is not given a step it already holds (RunTracker)."""
        metrics: dict[str, float] = {}
        round_, every = self.round, self.config.checkpoint_every
        self.metrics_file.drop_rows_from(self.progress.step)
        for step in range(self.progress.step, round_.end):
            self.progress.step = step
            remaining = self._remaining(deadline, step)
            last = step == round_.end - 1
            stage_step = step - round_.stage_start
            metrics = self.strategy.step(stage_step, remaining, last)
            self.log(step, metrics)
            self.stop = self.strategy.after_step(step, deadline)
            if last or self.stop is not None or (every and (stage_step + 1) % every == 0):
                self.checkpoint(step)
            if self.stop is not None:  # raised by `run` once the round's after-steps are done
                break
        return metrics

    def _remaining(self, deadline: float, step: int) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RoundDeadlineError(
                f"{self.round.name} passed its deadline of {self.config.ray.round_timeout_s:.0f} s (train.ray."
                f"round_timeout_s) before step {step}; committed steps are kept, a retry resumes"
            )
        return remaining

    def checkpoint(self, step: int) -> Path:
        def write(folder: Path) -> dict[str, Any]:
            parts = self.group.run(TrainWorker.save, str(folder))
            (folder / CONFIG_FILE).write_text(self.config.model_dump_json(indent=1))
            return {"model_keys": parts[0]["model_keys"], "rng": [p["rng"] for p in parts],
                    "scheduler": parts[0]["scheduler"]}  # fmt: skip

        with permanent_errors_name(str(self.checkpoints.folder(step)), "cannot write the checkpoint"):
            self.last_checkpoint = self.checkpoints.save(step, write)
        return self.last_checkpoint

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "stage": self.round.stage, "round": self.round.index, **metrics}
        self.metrics_file.append(row)
        self.mlflow_run.log_metrics({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step)
        if self.on_step:
            self.on_step(row)


def open_tracker(config: TrainConfig, run_name: str, tags: dict[str, str] | None):
    """The MLflow run of this output_dir: the recipe's defining knobs as params, the whole of it as recipe.yaml."""
    from unirl_core.tracking.run_page import key_params, run_description
    from unirl_core.tracking.run_tracker import RunTracker, flatten

    recipe = config.model_dump(mode="json")
    mlflow_run = RunTracker(output_dir(config), config.tracking.experiment, run_name, tags)
    mlflow_run.open(key_params(flatten(recipe)), recipe, run_description(recipe, run_name, tags or {}))
    return mlflow_run


def run_round(
    config: TrainConfig,
    round_: Round,
    run_name: str = "train",
    precache=None,
    tags: dict[str, str] | None = None,
    on_step: Callable[[dict], None] | None = None,
    local: bool = False,
    on_eval: Callable[[dict], None] | None = None,
) -> RoundSummary:
    """Run (or finish) one round; a round whose steps are all committed is a no-op. `local`: one rank in this
    process instead of Ray workers (`train.ray.workers` must be 1). `on_step(row)` after each step's log,
    `on_eval(point)` after each `train.eval` point computed."""
    from unirl_core.distributed.groups import worker_group

    validate(config, precache)
    started = time.monotonic()
    deadline = started + config.ray.round_timeout_s
    latest, record = latest_record(config)
    plan = {"round": round_.name, "first_step": round_.first, "end_step": round_.end}
    done_through = _done_through(round_, record)
    if done_through >= round_.end - 1:
        if round_.stage == "rl" and (stop := guard_stop(config, round_.end)) is not None:
            raise stop  # stopped at the round's last point: still stopped until the guard changes
        return RoundSummary(**plan, skipped=True, checkpoint=str(latest), resumed_from=done_through)
    output_dir(config).mkdir(parents=True, exist_ok=True)
    mlflow_run = open_tracker(config, run_name, tags)
    if round_.first == 0 and record is None:
        _log_inputs(mlflow_run, config, precache)
    credentials = worker_credentials(config)
    rewards = config.reward if STRATEGIES[round_.stage].scores_rewards else None
    with (
        worker_group(TrainWorker, config.ray, output_dir(config) / RAY_RECORD, local, credentials, rewards) as group,
        served_rewards(rewards, local, group) as served,
        mlflow_run.system_metrics(),
    ):
        shards = group.run(TrainWorker.build, config.model_dump_json(), round_.stage, served)
        controller = Controller(config, round_, group, mlflow_run, precache, on_step, on_eval)
        metrics, outputs = controller.run(latest, record, deadline)
        group.run(TrainWorker.teardown)
    return RoundSummary(
        **plan, **outputs, checkpoint=str(controller.last_checkpoint), resumed_from=done_through,
        shard_elements=shards, metrics=metrics, mlflow_run_id=mlflow_run.run_id, seconds=time.monotonic() - started,
    )  # fmt: skip


@contextlib.contextmanager
def served_rewards(reward_config, local: bool, group) -> Iterator[dict]:
    """{name: scorer} of the model rewards served by dedicated reward actors for the block ({} when colocated); the
    actors start with the training workers' runtime environment (forwarded variables, working_dir)."""
    from unirl_core.rewards.registry import used_model_rewards

    names = used_model_rewards(reward_config) if reward_config and reward_config.placement == "dedicated" else []
    if not names:
        yield {}
        return
    if local:
        raise TrainingConfigError(
            "train.reward.placement: dedicated serves the model rewards from Ray actors, which --local does not "
            "start: drop --local, or set train.reward.placement=colocated"
        )
    from unirl_core.distributed.reward_actors import reward_actors

    with reward_actors(reward_config, names, group.env.runtime_env()) as served:
        yield served


def _done_through(round_: Round, record: dict | None) -> int:
    """The last committed global step (-1: none); a round cannot start past a gap."""
    done_through = record["global_step"] if record else -1
    if done_through < round_.first - 1:
        raise CheckpointError(
            f"{round_.name} starts at step {round_.first} but the latest committed checkpoint is step "
            f"{done_through}: run the earlier rounds first"
        )
    return done_through


def _log_inputs(mlflow_run, config: TrainConfig, precache) -> None:
    source = build_source(config.data)
    fingerprint = source.fingerprint() if hasattr(source, "fingerprint") else "unknown"
    mlflow_run.log_dataset("prompts", config.data.data_path or config.data.source, fingerprint)
    if config.warmup.steps and precache is not None:
        import hashlib

        from unirl_core.precache.read import done_records

        digest = hashlib.sha256(json.dumps(done_records(precache.output_dir), sort_keys=True).encode()).hexdigest()
        mlflow_run.log_dataset("precache", precache.output_dir, digest)
