"""The training controller: rounds of steps on a Ray worker group with FSDP2-sharded workers.

    plan_rounds(config)             -> warm-up rounds, then RL rounds, over one global step count
    run_round(config, round, ...)   -> one round: bring up Ray + workers, resume from the latest committed checkpoint,
                                       run the round's remaining steps, checkpoint, evaluate, tear down
    finalize(config, ...)           -> export the final adapter, register it in MLflow with an alias

One RL step: the controller draws the prompts and expands GRPO groups, scatters whole groups to the ranks, which
roll out with the trained module itself and score their images; the controller gathers the rewards and computes
advantages over the whole batch (a group is never split across a normalization), scatters them back, and the ranks
train (FSDP averages gradients). Metrics are reduced on the controller, which alone writes checkpoints' commit
records, `metrics.jsonl` and MLflow.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unirl_core.config.schema import TrainConfig
from unirl_core.errors import UserError
from unirl_core.train.checkpoint import CheckpointError, CheckpointManager, config_hash
from unirl_core.train.export import CONFIG_FILE

log = logging.getLogger("unirl.trainer")

METRICS_FILE = "metrics.jsonl"
RAY_RECORD = "ray_processes.json"  # the local Ray of the running round, for the flow's teardown hooks


class TrainingConfigError(UserError, ValueError):
    """A recipe that cannot train as configured (the message shows the arithmetic); never retried."""


class RoundDeadlineError(TimeoutError):
    """The round ran past `train.ray.round_timeout_s`; its committed checkpoints remain, a retry resumes."""


@dataclass(frozen=True)
class Round:
    stage: str  # "warmup" or "rl"
    index: int  # 0-based within the stage
    first: int  # first global step (inclusive)
    end: int  # last global step + 1
    stage_start: int  # global step of the stage's step 0

    @property
    def name(self) -> str:
        return f"{self.stage} round {self.index}"


def plan_rounds(config: TrainConfig) -> list[Round]:
    """Warm-up steps are global steps 0..W-1, RL steps W..W+S-1; each stage is cut into its rounds."""
    rounds: list[Round] = []
    start = 0
    for stage, steps, per_round in (
        ("warmup", config.warmup.steps, config.warmup.steps_per_round),
        ("rl", config.steps, config.steps_per_round),
    ):
        per_round = per_round or max(steps, 1)
        for index, first in enumerate(range(0, steps, per_round)):
            rounds.append(Round(stage, index, start + first, start + min(steps, first + per_round), start))
        start += steps
    return rounds


def validate(config: TrainConfig, precache=None) -> None:
    """Refuse up front what would fail mid-round, with the arithmetic."""
    problems = [f"train.{path}: {value!r} must be {message}" for path, value, message in config.distributed_problems()]
    from unirl_core.data.sources import build_source

    try:
        source = build_source(config.data)
    except ValueError as exc:
        raise TrainingConfigError(f"training cannot start: train.data: {exc}") from None
    available = getattr(source, "prompts", None)
    if available is not None and len(available) < config.data.prompts_per_rollout:
        problems.append(
            f"train.data.prompts_per_rollout: {config.data.prompts_per_rollout} prompts per rollout, but the source "
            f"has only {len(available)} prompts; lower it or add prompts"
        )
    from unirl_core.models.registry import UnknownFamilyError, family_class

    try:
        factor = family_class(config.model.family).latent_stride
    except UnknownFamilyError as exc:
        raise TrainingConfigError(f"training cannot start: train.model.family: {exc}") from None
    for key in ("height", "width"):
        size = getattr(config.sampling, key)
        if size % factor:
            problems.append(
                f"train.sampling.{key}: {size} must be a multiple of {factor} (the {config.model.family} family's "
                "pixels per latent token: VAE stride x patch size)"
            )
    if config.warmup.steps and precache is None:
        problems.append(
            f"train.warmup.steps: {config.warmup.steps} warm-up steps need the recipe's `precache` section (the "
            "precached latents and text conditioning to train on)"
        )
    elif config.warmup.steps:
        keys = [e.key for e in precache.encodings]
        for name in ("latent_key", "text_key"):
            if getattr(config.warmup, name) not in keys:
                problems.append(
                    f"train.warmup.{name}: {getattr(config.warmup, name)!r} is not an encoding of the recipe's "
                    f"precache section (it has {keys})"
                )
    if problems:
        raise TrainingConfigError("training cannot start:\n  " + "\n  ".join(problems))


def output_dir(config: TrainConfig) -> Path:
    if not config.output_dir:
        raise TrainingConfigError("train.output_dir is empty: load the recipe with load_recipe (it fills it in)")
    if "://" in config.output_dir and not config.output_dir.startswith("file://"):
        raise TrainingConfigError(
            f"train.output_dir={config.output_dir!r}: training rounds write checkpoints to a local or shared "
            "filesystem path (mount the bucket, e.g. with a CSI driver, on every node)"
        )
    return Path(config.output_dir.removeprefix("file://"))


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


def split_groups(samples: list, workers: int) -> list[list]:
    """Equal contiguous shares of whole groups (samples are group-major, so a share never cuts a group)."""
    per_rank = len(samples) // workers
    return [samples[r * per_rank : (r + 1) * per_rank] for r in range(workers)]


class _Controller:
    """The state of one round on the controller: data source, advantage tracker, checkpoints, tracking."""

    def __init__(self, config: TrainConfig, round_: Round, group, tracker, precache, on_step):
        from unirl_core.algorithms.advantages import PerPromptStatTracker
        from unirl_core.data.sources import build_source

        self.config, self.round, self.group, self.tracker, self.on_step = config, round_, group, tracker, on_step
        self.out = output_dir(config)
        self.checkpoints = CheckpointManager(self.out / "checkpoints", keep=config.keep_checkpoints)
        self.identity = {"config_hash": config_hash(config), "world_size": config.ray.workers}
        self.source = build_source(config.data)
        algorithm = config.algorithm
        self.advantage_tracker = PerPromptStatTracker(algorithm.tracker_buffer_size, algorithm.tracker_min_count)
        self.warmup_data = None
        if round_.stage == "warmup":
            from unirl_core.train.warmup import open_warmup_data

            self.warmup_data = open_warmup_data(config, precache)
        self.last_images: tuple[list, list[str]] | None = None

    # --- state -------------------------------------------------------------------------------------------------

    def controller_state(self) -> dict[str, Any]:
        state = {"source": self.source.state_dict(), "tracker": self.advantage_tracker.state_dict()}
        if self.warmup_data is not None:
            state["warmup_data"] = self.warmup_data.state_dict()
        return state

    def restore(self, record: dict[str, Any]) -> None:
        self.source.load_state_dict(record["source"])
        self.advantage_tracker.load_state_dict(record["tracker"])
        if self.warmup_data is not None and "warmup_data" in record:
            self.warmup_data.load_state_dict(record["warmup_data"])

    def checkpoint(self, step: int) -> Path:
        folder = self.checkpoints.prepare(step)
        parts = self.group.run("save", str(folder))
        (folder / CONFIG_FILE).write_text(self.config.model_dump_json(indent=1))
        record = {
            "step": step,
            "global_step": step,
            "stage": self.round.stage,
            "stage_step": step - self.round.stage_start,
            "round": self.round.index,
            "model_keys": parts[0]["model_keys"],
            "rng": [part["rng"] for part in parts],
            "scheduler": parts[0]["scheduler"],
            "mlflow_run_id": self.tracker.run_id,
            **self.controller_state(),
            **self.identity,
        }
        return self.checkpoints.commit(folder, record)

    # --- steps -------------------------------------------------------------------------------------------------

    def rl_step(self, step: int, timeout: float, want_images: bool) -> dict[str, float]:
        from unirl_core.data.groups import expand_groups
        from unirl_core.train.local import compute_advantages

        config, group = self.config, self.config.sampling.samples_per_prompt
        stage_step = step - self.round.stage_start
        started = time.perf_counter()
        batch = self.source.next_batch()
        samples = expand_groups(batch, group, first_group_id=stage_step * config.data.prompts_per_rollout)
        shares = split_groups(samples, config.ray.workers)
        results = self.group.scatter("rollout", shares, stage_step, want_images, timeout=timeout)
        scores = {k: [x for r in results for x in r["rewards"][k]] for k in results[0]["rewards"]}
        advantages, advantage_stats = compute_advantages(
            config.algorithm, self.advantage_tracker, samples, scores["total"], group
        )
        per_rank = len(samples) // config.ray.workers
        advantage_shares = [advantages[r * per_rank : (r + 1) * per_rank].tolist() for r in range(config.ray.workers)]
        train_parts = self.group.scatter("train", advantage_shares, stage_step, timeout=timeout)
        metrics: dict[str, float] = {
            "reward_mean": float(np.mean(scores["total"])),
            "reward_std": float(np.std(scores["total"])),
        }
        metrics |= {f"reward_{k}_mean": float(np.mean(v)) for k, v in scores.items() if k != "total"}
        metrics |= {f"reward_{k}_std": float(np.std(v)) for k, v in scores.items() if k != "total"}
        metrics |= advantage_stats | reduce_metrics(train_parts)
        metrics["seconds_rollout"] = max(r["seconds_rollout"] for r in results)
        metrics["seconds_reward"] = max(r["seconds_reward"] for r in results)
        metrics["images_per_s"] = len(samples) / (time.perf_counter() - started)
        if want_images:
            images = [image for r in results for image in r["images"]]
            self.last_images = (images, [b.prompt for b in batch])
        return metrics

    def warmup_step(self, step: int, timeout: float) -> dict[str, float]:
        from unirl_core.train.warmup import split_batch

        started = time.perf_counter()
        batch = self.warmup_data.next_batch()
        shares = split_batch(batch, self.config.ray.workers)
        parts = self.group.scatter("warmup", shares, step - self.round.stage_start, timeout=timeout)
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
        shares = split_batch(batch, self.config.ray.workers)
        return float(np.mean(self.group.scatter("warmup_eval", shares, self.config.warmup.seed, timeout=timeout)))

    def evaluate(self, step: int, timeout: float) -> str | None:
        from unirl_core.data.sources import build_source, load_eval_prompts
        from unirl_core.train.images import captioned_grid

        config, workers = self.config, self.config.ray.workers
        prompts = [p.prompt for p in load_eval_prompts(config.data)][: config.eval_prompts]
        if not prompts:
            source = build_source(config.data)
            while len(prompts) < config.eval_prompts:
                prompts += [p.prompt for p in source.next_batch()]
            prompts = prompts[: config.eval_prompts]
        padded = prompts + prompts[: (-len(prompts)) % workers]  # equal shares: every rank runs the same passes
        per_rank = len(padded) // workers
        shares = [padded[r * per_rank : (r + 1) * per_rank] for r in range(workers)]
        shares = [(share, r * per_rank) for r, share in enumerate(shares)]
        results = self.group.scatter("evaluate", shares, config.sampling.seed, timeout=timeout)
        images = [image for r in results for image in r][: len(prompts)]
        grid = captioned_grid(images, prompts, cols=1)
        path = self.out / "samples" / f"eval_step_{step:08d}.png"
        _save_png(grid, path)
        self.tracker.log_image(grid, key="eval", step=step)
        return str(path)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "stage": self.round.stage, "round": self.round.index, **metrics}
        with open(self.out / METRICS_FILE, "a") as f:  # append-only: rows re-run after a resume appear again
            f.write(json.dumps(row) + "\n")
        self.tracker.log_metrics({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step)
        if self.on_step:
            self.on_step(row)


def _save_png(image, path: Path) -> None:
    import io

    from unirl_core.io.storage import write_bytes_atomic

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(str(path), buffer.getvalue())


def _open_tracker(config: TrainConfig, run_name: str, tags: dict[str, str] | None):
    from unirl_core.tracking.run_tracker import RunTracker

    tracker = RunTracker(output_dir(config), config.tracking.experiment, run_name, tags)
    tracker.open(params=config.model_dump(mode="json"))
    return tracker


def latest_record(config: TrainConfig) -> tuple[Path | None, dict[str, Any] | None]:
    """The latest committed checkpoint of this run and its record, checked against this config and world size."""
    manager = CheckpointManager(output_dir(config) / "checkpoints", keep=config.keep_checkpoints)
    latest = manager.latest()
    if latest is None:
        return None, None
    identity = {"config_hash": config_hash(config), "world_size": config.ray.workers}
    return latest, manager.read_record(latest, expect=identity)


def run_round(
    config: TrainConfig,
    round_: Round,
    run_name: str = "train",
    precache=None,
    tags: dict[str, str] | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """Run (or finish) one round; a round whose steps are all committed is a no-op. Returns a summary."""
    from unirl_core.distributed.cluster import ray_cluster
    from unirl_core.distributed.worker_group import WorkerGroup
    from unirl_core.train.worker import TrainWorker

    validate(config, precache)
    started = time.monotonic()
    deadline = started + config.ray.round_timeout_s
    latest, record = latest_record(config)
    done_through = record["global_step"] if record else -1
    summary: dict[str, Any] = {"round": round_.name, "first_step": round_.first, "end_step": round_.end}
    if done_through >= round_.end - 1:
        return summary | {"skipped": True, "checkpoint": str(latest), "resumed_from": done_through}
    if done_through < round_.first - 1:
        raise CheckpointError(
            f"{round_.name} starts at step {round_.first} but the latest committed checkpoint is step "
            f"{done_through}: run the earlier rounds first"
        )
    out = output_dir(config)
    out.mkdir(parents=True, exist_ok=True)
    tracker = _open_tracker(config, run_name, tags)
    if round_.first == 0 and record is None:
        _log_inputs(tracker, config, precache)
    ray = config.ray
    resources = {"num_cpus": int(ray.workers * ray.cpus_per_worker) or 1}
    if ray.gpus_per_worker:
        resources["num_gpus"] = int(np.ceil(ray.workers * ray.gpus_per_worker))
    backend = None if ray.backend == "auto" else ray.backend
    with (
        ray_cluster(ray.address, **resources, record=out / RAY_RECORD),
        WorkerGroup(
            ray.workers, TrainWorker, ray.cpus_per_worker, ray.gpus_per_worker, backend,
            collective_timeout_s=ray.collective_timeout_s,
        ) as group,
    ):  # fmt: skip
        shards = group.run("build", config.model_dump_json(), round_.stage)
        controller = _Controller(config, round_, group, tracker, precache, on_step)
        start = round_.first
        if record is not None:
            same_stage = record["stage"] == round_.stage
            group.run("load", str(latest), not same_stage, record["rng"] if same_stage else None,
                      record["scheduler"] if same_stage else None)  # fmt: skip
            if same_stage:
                controller.restore(record)
            start = done_through + 1
        summary |= {"resumed_from": done_through, "shard_elements": shards}
        metrics: dict[str, Any] = {}
        if round_.stage == "warmup":
            before = controller.warmup_eval(deadline - time.monotonic())
            tracker.log_metrics({"warmup_eval_loss": before}, start)
            summary["warmup_eval_loss_before"] = before
        for step in range(start, round_.end):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RoundDeadlineError(
                    f"{round_.name} passed its deadline of {config.ray.round_timeout_s:.0f} s (train.ray."
                    f"round_timeout_s) before step {step}; committed steps are kept, a retry resumes"
                )
            last = step == round_.end - 1
            if round_.stage == "rl":
                metrics = controller.rl_step(step, remaining, want_images=last)
            else:
                metrics = controller.warmup_step(step, remaining)
            controller.log(step, metrics)  # before the commit: a step re-run after a kill is logged again, never lost
            due = config.checkpoint_every and (step - round_.stage_start + 1) % config.checkpoint_every == 0
            if due or last:
                summary["checkpoint"] = str(controller.checkpoint(step))
        if round_.stage == "warmup":
            after = controller.warmup_eval(deadline - time.monotonic())
            tracker.log_metrics({"warmup_eval_loss": after}, round_.end - 1)
            summary["warmup_eval_loss"] = after
        if round_.stage == "rl" and controller.last_images:
            from unirl_core.train.images import captioned_grid

            images, prompts = controller.last_images
            grid = captioned_grid(images, prompts, cols=config.sampling.samples_per_prompt)
            path = out / "samples" / f"round_{round_.index:03d}_step_{round_.end - 1:08d}.png"
            _save_png(grid, path)
            tracker.log_image(grid, key="samples", step=round_.end - 1)
            summary["samples"] = str(path)
        last_rl = [r for r in plan_rounds(config) if r.stage == "rl"][-1]
        every = config.eval_every_rounds
        if round_.stage == "rl" and every and ((round_.index + 1) % every == 0 or round_ == last_rl):
            summary["eval_samples"] = controller.evaluate(round_.end - 1, deadline - time.monotonic())
        group.run("teardown")
    summary |= {
        "metrics": metrics,
        "mlflow_run_id": tracker.run_id,
        "seconds": time.monotonic() - started,
    }
    return summary


def _log_inputs(tracker, config: TrainConfig, precache) -> None:
    from unirl_core.data.sources import build_source

    source = build_source(config.data)
    fingerprint = source.fingerprint() if hasattr(source, "fingerprint") else "unknown"
    tracker.log_dataset("prompts", config.data.data_path or config.data.source, fingerprint)
    if config.warmup.steps and precache is not None:
        import hashlib

        from unirl_core.precache.read import done_records

        digest = hashlib.sha256(json.dumps(done_records(precache.output_dir), sort_keys=True).encode()).hexdigest()
        tracker.log_dataset("precache", precache.output_dir, digest)


def finalize(config: TrainConfig, run_name: str = "train", registered_model: str | None = None) -> dict[str, Any]:
    """After the last round: export the last checkpoint's adapter (merged pipeline with full fine-tuning) and
    register it in MLflow as a new model version with the alias `tracking.alias`; end the MLflow run."""
    from unirl_core.train.export import export_checkpoint

    latest, record = latest_record(config)
    if latest is None:
        raise CheckpointError(f"{output_dir(config) / 'checkpoints'}: no committed checkpoint to export")
    out = output_dir(config) / "export" / latest.name
    done = out.parent / f"{latest.name}.registered.json"
    if done.is_file():  # a re-run of a finished training: the same export and model version
        return json.loads(done.read_text())
    export_checkpoint(latest, out, merged=config.model.lora is None)
    tracker = _open_tracker(config, run_name, None)
    name = registered_model or config.tracking.registered_model or f"unirl-{run_name}"
    version = tracker.register(str(out), "adapter" if config.model.lora else "pipeline", name, config.tracking.alias)
    tracker.finish()
    result = {
        "export": str(out),
        "checkpoint": str(latest),
        "registered_model": name,
        "model_version": version,
        "alias": config.tracking.alias,
        "mlflow_run_id": tracker.run_id,
        "mlflow_run_url": tracker.url(),
        "tracking_failures": tracker.failures,
    }
    if version is not None:  # registered: remember it (an MLflow outage leaves it to the next run)
        from unirl_core.io.storage import write_bytes_atomic

        write_bytes_atomic(str(done), json.dumps(result).encode())
    return result
