"""The single controller of a training round, over a group of FSDP2-sharded workers: Ray actors, or one rank in
this process (`unirl train --local`): one loop, two transports.

    run_round(config, round)  -> resume from the latest committed checkpoint, the round's remaining steps (each
                                 logged, checkpointed when due), after-round (warm-up eval, sample grid, eval grid)

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

import numpy as np

from unirl_core.algorithms.advantages import PerPromptStatTracker, compute_advantages, per_reward_advantages
from unirl_core.config.schema import TrainConfig
from unirl_core.data.groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.io.storage import permanent_errors_name, write_bytes_atomic
from unirl_core.summaries import RoundSummary
from unirl_core.train.checkpoint import CheckpointError, CheckpointManager, config_hash
from unirl_core.train.export import CONFIG_FILE
from unirl_core.train.worker import TrainWorker
from unirl_core.trainer.plan import (
    Round,
    RoundDeadlineError,
    TrainingConfigError,
    output_dir,
    plan_rounds,
    validate,
    worker_credentials,
)

METRICS_FILE = "metrics.jsonl"
RAY_RECORD = "ray_processes.json"  # the local Ray of the running round, for the flow's teardown hooks


def reduce_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Mean over ranks; min/max for *_min/*_max; max for seconds (the slowest rank sets the pace)."""
    out: dict[str, float] = {}
    for key in per_rank[0]:
        values = [m[key] for m in per_rank]
        if key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith("_max") or key.startswith("seconds_"):
            out[key] = max(values)
        else:
            out[key] = float(np.mean(values))
    return out


def split_even(items: list, workers: int) -> list[list]:
    """Equal contiguous shares (samples are group-major, so a share of whole groups never cuts a group)."""
    per_rank = len(items) // workers
    return [items[r * per_rank : (r + 1) * per_rank] for r in range(workers)]


def checkpoints(config: TrainConfig, states: dict | None = None) -> CheckpointManager:
    identity = {"config_hash": config_hash(config), "world_size": config.ray.workers}
    return CheckpointManager(output_dir(config) / "checkpoints", config.keep_checkpoints, states, identity,
                             config.checkpoint.on_corrupt)  # fmt: skip


def latest_record(config: TrainConfig) -> tuple[Path | None, dict[str, Any] | None]:
    """The latest committed checkpoint of this run and its record, checked against this config and world size."""
    return checkpoints(config).load(states=False)


class Progress:
    """The trainer's own place in the run, stored flat in the commit record."""

    def __init__(self, round_: Round, tracker):
        self.round, self.tracker, self.step = round_, tracker, round_.first

    def state_dict(self) -> dict[str, Any]:
        step = self.step
        return {"global_step": step, "stage": self.round.stage, "stage_step": step - self.round.stage_start,
                "round": self.round.index, "mlflow_run_id": self.tracker.run_id}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["global_step"] + 1


class Controller:
    """One round on the controller: the group, the data source, the advantage tracker, the warm-up data, the
    checkpoints of their named states, and tracking."""

    def __init__(self, config: TrainConfig, round_: Round, group, tracker, precache, on_step):
        self.config, self.round, self.group, self.tracker, self.on_step = config, round_, group, tracker, on_step
        self.out = output_dir(config)
        self.workers = config.ray.workers
        self.source = build_source(config.data)
        algorithm = config.algorithm
        self.advantage_tracker = PerPromptStatTracker(algorithm.tracker_buffer_size, algorithm.tracker_min_count)
        self.progress = Progress(round_, tracker)
        states = {"": self.progress, "source": self.source, "tracker": self.advantage_tracker}
        self.warmup_data = None
        if round_.stage == "warmup":
            from unirl_core.train.warmup import open_warmup_data

            self.warmup_data = states["warmup_data"] = open_warmup_data(config, precache)
        self.checkpoints = checkpoints(config, states)
        self.last_checkpoint: Path | None = None
        self.last_images: tuple[list, list[str]] | None = None

    # --- resume, steps, after-round -----------------------------------------------------------------------------

    def resume(self, latest: Path | None, record: dict | None) -> None:
        """Continue after the latest checkpoint: the same stage restores everything (weights, optimizer, EMA,
        schedule, RNG, data cursor, tracker); a new stage starts from the trained weights alone."""
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
        self.drop_rows_from(self.progress.step)
        for step in range(self.progress.step, round_.end):
            self.progress.step = step
            remaining = self._remaining(deadline, step)
            last = step == round_.end - 1
            stage_step = step - round_.stage_start
            if round_.stage == "rl":
                metrics = self.rl_step(stage_step, remaining, want_images=last)
            else:
                metrics = self.warmup_step(stage_step, remaining)
            self.log(step, metrics)
            if last or (every and (stage_step + 1) % every == 0):
                self.checkpoint(step)
        return metrics

    def warmup_evals(self, deadline: float, before: bool) -> dict[str, float]:
        """Warm-up: the fixed-draw eval loss before the round's steps (logged at its first step) or after them."""
        if self.round.stage != "warmup":
            return {}
        loss = self.warmup_eval(deadline - time.monotonic())
        self.tracker.log_metrics({"warmup_eval_loss": loss}, self.progress.step if before else self.round.end - 1)
        return {"warmup_eval_loss_before" if before else "warmup_eval_loss": loss}

    def after_round(self, deadline: float) -> dict[str, Any]:
        """RL: the last step's sample grid, and the evaluation grid when due."""
        if self.round.stage != "rl":
            return {}
        summary = {"samples": self.save_samples()} if self.last_images else {}
        rl_rounds = [r for r in plan_rounds(self.config) if r.stage == "rl"]
        every = self.config.eval_every_rounds
        if every and ((self.round.index + 1) % every == 0 or self.round == rl_rounds[-1]):
            summary["eval_samples"] = self.evaluate(self.round.end - 1, deadline - time.monotonic())
        return summary

    def _remaining(self, deadline: float, step: int) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RoundDeadlineError(
                f"{self.round.name} passed its deadline of {self.config.ray.round_timeout_s:.0f} s (train.ray."
                f"round_timeout_s) before step {step}; committed steps are kept, a retry resumes"
            )
        return remaining

    # --- steps --------------------------------------------------------------------------------------------------

    def rl_step(self, stage_step: int, timeout: float, want_images: bool) -> dict[str, float]:
        """Prompts -> groups -> the ranks roll out and score -> advantages over the whole batch -> the ranks train."""
        config, group = self.config, self.config.sampling.samples_per_prompt
        started = time.perf_counter()
        batch = self.source.next_batch()
        samples = expand_groups(batch, group, first_group_id=stage_step * config.data.prompts_per_rollout)
        first_group = samples[0].group_id
        grid = [s for s in samples if s.group_id - first_group < config.grid_prompts
                and s.sample_index < config.grid_images_per_prompt] if want_images else []  # fmt: skip
        results = self.group.scatter(TrainWorker.rollout, split_even(samples, self.workers), stage_step,
                                     [s.sample_id for s in grid], timeout=timeout)  # fmt: skip
        scores = {k: [x for r in results for x in r["rewards"][k]] for k in results[0]["rewards"]}
        prompts = [s.example.prompt for s in samples]
        if config.reward.normalize == "per_reward":
            advantages, advantage_stats = per_reward_advantages(
                config.algorithm, prompts, scores, config.reward.weights, group
            )
        else:
            advantages, advantage_stats = compute_advantages(
                config.algorithm, self.advantage_tracker, prompts, scores["total"], group
            )
        shares = split_even(advantages.tolist(), self.workers)
        train_parts = self.group.scatter(TrainWorker.train, shares, stage_step, timeout=timeout)
        metrics = reward_metrics(scores) | advantage_stats | reduce_metrics(train_parts)
        metrics["seconds_rollout"] = max(r["seconds_rollout"] for r in results)
        metrics["seconds_reward"] = max(r["seconds_reward"] for r in results)
        metrics["images_per_s"] = len(samples) / (time.perf_counter() - started)
        if want_images:  # only the grid's images came back
            images = {sample_id: image for r in results for sample_id, image in r["images"].items()}
            prompts = [b.prompt for b in batch[: config.grid_prompts]]
            self.last_images = ([images[s.sample_id] for s in grid], prompts)
        return metrics

    def warmup_step(self, stage_step: int, timeout: float) -> dict[str, float]:
        from unirl_core.train.warmup import split_batch

        started = time.perf_counter()
        batch = self.warmup_data.next_batch()
        parts = self.group.scatter(TrainWorker.warmup, split_batch(batch, self.workers), stage_step,
                                   timeout=timeout)  # fmt: skip
        metrics = {f"warmup_{k}": v for k, v in reduce_metrics(parts).items()}
        metrics["warmup_samples_per_s"] = len(batch["keys"]) / (time.perf_counter() - started)
        return metrics

    def warmup_eval(self, timeout: float) -> float:
        """The mean denoising loss on the data's first batch with fixed draws: comparable across the warm-up."""
        from unirl_core.train.warmup import split_batch

        saved = self.warmup_data.state_dict()
        self.warmup_data.load_state_dict(saved | {"epoch": 0, "batch_in_epoch": 0})
        batch = self.warmup_data.next_batch()
        self.warmup_data.load_state_dict(saved)
        shares = split_batch(batch, self.workers)
        losses = self.group.scatter(TrainWorker.warmup_eval, shares, self.config.warmup.seed, timeout=timeout)
        return float(np.mean(losses))

    def evaluate(self, step: int, timeout: float) -> str:
        """Deterministic samples of the evaluation prompts (or the first prompts of the source) as a grid."""
        from unirl_core.data.sources import load_eval_prompts
        from unirl_core.train.images import captioned_grid

        config, workers = self.config, self.workers
        prompts = [p.prompt for p in load_eval_prompts(config.data)][: config.eval_prompts]
        if not prompts:
            source = build_source(config.data)
            while len(prompts) < config.eval_prompts:
                prompts += [p.prompt for p in source.next_batch()]
            prompts = prompts[: config.eval_prompts]
        padded = prompts + prompts[: (-len(prompts)) % workers]  # equal shares: every rank runs the same passes
        per_rank = len(padded) // workers
        shares = [(share, r * per_rank) for r, share in enumerate(split_even(padded, workers))]
        results = self.group.scatter(TrainWorker.evaluate, shares, config.sampling.seed, timeout=timeout)
        images = [image for r in results for image in r][: len(prompts)]
        grid = captioned_grid(images, prompts, cols=1)
        return self.save_grid(grid, self.out / "samples" / f"eval_step_{step:08d}.png", "eval", step)

    # --- outputs ------------------------------------------------------------------------------------------------

    def checkpoint(self, step: int) -> Path:
        def write(folder: Path) -> dict[str, Any]:
            parts = self.group.run(TrainWorker.save, str(folder))
            (folder / CONFIG_FILE).write_text(self.config.model_dump_json(indent=1))
            return {"model_keys": parts[0]["model_keys"], "rng": [p["rng"] for p in parts],
                    "scheduler": parts[0]["scheduler"]}  # fmt: skip

        with permanent_errors_name(str(self.checkpoints.folder(step)), "cannot write the checkpoint"):
            self.last_checkpoint = self.checkpoints.save(step, write)
        return self.last_checkpoint

    def drop_rows_from(self, step: int) -> None:
        """Rewrite `metrics.jsonl` (atomically) without the rows of `step` and later, and without a torn last line."""
        path = self.out / METRICS_FILE
        if not path.is_file():
            return
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.endswith("\n") and json.loads(line)["step"] < step]
        if len(kept) != len(lines):
            write_bytes_atomic(str(path), "".join(kept).encode())

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "stage": self.round.stage, "round": self.round.index, **metrics}
        with open(self.out / METRICS_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.tracker.log_metrics({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step)
        if self.on_step:
            self.on_step(row)

    def save_samples(self) -> str:
        from unirl_core.train.images import captioned_grid

        images, prompts = self.last_images
        cols = min(self.config.sampling.samples_per_prompt, self.config.grid_images_per_prompt)
        grid = captioned_grid(images, prompts, cols=cols)
        step = self.round.end - 1
        path = self.out / "samples" / f"round_{self.round.index:03d}_step_{step:08d}.png"
        return self.save_grid(grid, path, "samples", step)

    def save_grid(self, grid, path: Path, key: str, step: int) -> str:
        """The grid, titled with its step, to `path` and to MLflow under `key` (and as `<key>/<file name>`). The
        image card's slider counts a key's grids (0 = the first): the card opens at step 0."""
        import io

        from unirl_core.train.images import titled

        grid = titled(grid, f"{key}: step {step} ({self.round.name})")
        buffer = io.BytesIO()
        grid.save(buffer, format="PNG")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(str(path), buffer.getvalue())
        self.tracker.log_image(grid, key=key, step=self.grid_number(key), file=path)
        return str(path)

    def grid_number(self, key: str) -> int:
        """This round's grid of `key` among the run's: `samples` one per RL round, `eval` per round evaluated."""
        if key != "eval":
            return self.round.index
        every = self.config.eval_every_rounds
        rl_rounds = [r for r in plan_rounds(self.config) if r.stage == "rl"]
        return sum(1 for r in rl_rounds[: self.round.index] if every and (r.index + 1) % every == 0)


def reward_metrics(scores: dict[str, list[float]]) -> dict[str, float]:
    """Mean and std of the total reward and of each component."""
    metrics = {"reward_mean": float(np.mean(scores["total"])), "reward_std": float(np.std(scores["total"]))}
    metrics |= {f"reward_{k}_mean": float(np.mean(v)) for k, v in scores.items() if k != "total"}
    return metrics | {f"reward_{k}_std": float(np.std(v)) for k, v in scores.items() if k != "total"}


def open_tracker(config: TrainConfig, run_name: str, tags: dict[str, str] | None):
    """The MLflow run of this output_dir: the recipe's defining knobs as params, the whole of it as recipe.yaml."""
    from unirl_core.tracking.run_page import key_params, run_description
    from unirl_core.tracking.run_tracker import RunTracker, flatten

    recipe = config.model_dump(mode="json")
    tracker = RunTracker(output_dir(config), config.tracking.experiment, run_name, tags)
    tracker.open(key_params(flatten(recipe)), recipe, run_description(recipe, run_name, tags or {}))
    return tracker


def run_round(
    config: TrainConfig,
    round_: Round,
    run_name: str = "train",
    precache=None,
    tags: dict[str, str] | None = None,
    on_step: Callable[[dict], None] | None = None,
    local: bool = False,
) -> RoundSummary:
    """Run (or finish) one round; a round whose steps are all committed is a no-op. `local`: one rank in this
    process instead of Ray workers (`train.ray.workers` must be 1)."""
    from unirl_core.distributed.groups import worker_group

    validate(config, precache)
    started = time.monotonic()
    deadline = started + config.ray.round_timeout_s
    latest, record = latest_record(config)
    plan = {"round": round_.name, "first_step": round_.first, "end_step": round_.end}
    done_through = _done_through(round_, record)
    if done_through >= round_.end - 1:
        return RoundSummary(**plan, skipped=True, checkpoint=str(latest), resumed_from=done_through)
    output_dir(config).mkdir(parents=True, exist_ok=True)
    tracker = open_tracker(config, run_name, tags)
    if round_.first == 0 and record is None:
        _log_inputs(tracker, config, precache)
    credentials = worker_credentials(config)
    rewards = config.reward if round_.stage == "rl" else None
    with (
        worker_group(TrainWorker, config.ray, output_dir(config) / RAY_RECORD, local, credentials, rewards) as group,
        served_rewards(rewards, local, group) as served,
        tracker.system_metrics(),
    ):
        shards = group.run(TrainWorker.build, config.model_dump_json(), round_.stage, served)
        controller = Controller(config, round_, group, tracker, precache, on_step)
        controller.resume(latest, record)
        evals = controller.warmup_evals(deadline, before=True)
        metrics = controller.run_steps(deadline)
        evals |= controller.warmup_evals(deadline, before=False)
        outputs = controller.after_round(deadline)
        group.run(TrainWorker.teardown)
    return RoundSummary(
        **plan, **evals, **outputs, checkpoint=str(controller.last_checkpoint), resumed_from=done_through,
        shard_elements=shards, metrics=metrics, mlflow_run_id=tracker.run_id, seconds=time.monotonic() - started,
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


def _log_inputs(tracker, config: TrainConfig, precache) -> None:
    source = build_source(config.data)
    fingerprint = source.fingerprint() if hasattr(source, "fingerprint") else "unknown"
    tracker.log_dataset("prompts", config.data.data_path or config.data.source, fingerprint)
    if config.warmup.steps and precache is not None:
        import hashlib

        from unirl_core.precache.read import done_records

        digest = hashlib.sha256(json.dumps(done_records(precache.output_dir), sort_keys=True).encode()).hexdigest()
        tracker.log_dataset("precache", precache.output_dir, digest)
