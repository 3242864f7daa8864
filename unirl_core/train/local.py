"""The single-process runner: N steps of rollout -> reward -> advantage -> update from a recipe, no Ray.

Used by tests, notebooks and `unirl train RECIPE --local`, and as the baseline of the distributed runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from unirl_core.algorithms.advantages import PerPromptStatTracker, group_advantages
from unirl_core.config.schema import TrainConfig
from unirl_core.data.groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.models.registry import build_family
from unirl_core.rewards.service import RewardService
from unirl_core.rollout.rollout import run_rollout
from unirl_core.train.stack import TrainStack


def run_local(
    config: TrainConfig, steps: int | None = None, device: str = "cpu", on_step: Callable[[dict], None] | None = None
) -> list[dict]:
    """Run `steps` (default `config.steps`) RL steps; returns one metrics dict per step."""
    return list(iter_local(config, steps, device, on_step))


def save_grid(images, path: str, group: int) -> str:
    """One PNG of a rollout's images, one row per prompt group (atomic write)."""
    import io

    from diffusers.utils import make_image_grid

    from unirl_core.io.storage import write_bytes_atomic

    buffer = io.BytesIO()
    make_image_grid(list(images), rows=len(images) // group, cols=group).save(buffer, format="PNG")
    write_bytes_atomic(path, buffer.getvalue())
    return path


def compute_advantages(algorithm, tracker, samples, rewards, group: int) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages [B] by the configured normalization, clipped to +-adv_clip, and their stats."""
    rewards_B = torch.tensor(rewards)
    if algorithm.std_mode != "per_prompt":
        return group_advantages(rewards_B, group, algorithm.std_mode, clip=algorithm.adv_clip)
    _, stats = group_advantages(rewards_B, group, "group", clip=algorithm.adv_clip)  # zero_std_ratio
    advantages = tracker.update([s.example.prompt for s in samples], rewards_B).clamp(
        -algorithm.adv_clip, algorithm.adv_clip
    )
    return advantages, stats | {
        "advantage_mean": advantages.mean().item(),
        "advantage_abs_max": advantages.abs().max().item(),
    }


def iter_local(
    config: TrainConfig,
    steps: int | None = None,
    device: str = "cpu",
    on_step=None,
    samples_dir: str | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 0,
) -> Iterator[dict]:
    """As `run_local`, one step at a time. With `samples_dir`, the first and last rollouts are saved as image grids
    (`step_00000.png`, one row per prompt) and their paths reported as the metric `samples_path`.

    With `checkpoint_dir`, a checkpoint commits every `checkpoint_every` steps and after the last one, and a run
    finding a committed checkpoint there resumes after it: the steps that follow equal an uninterrupted run's."""
    torch.manual_seed(config.sampling.seed)
    source = build_source(config.data)
    adapter = build_family(config.model, config.sampling, device=device)
    rewards = RewardService.from_config(config.reward, device=device)
    total = steps or config.steps
    stack = TrainStack(adapter, config.algorithm, total_updates=total * config.algorithm.num_updates_per_batch)
    group = config.sampling.samples_per_prompt
    algorithm = config.algorithm
    tracker = PerPromptStatTracker(algorithm.tracker_buffer_size, algorithm.tracker_min_count)
    checkpoints, first_step = None, 0
    if checkpoint_dir:
        from unirl_core.train.checkpoint import CheckpointManager, config_hash, rng_state, set_rng_state

        checkpoints = CheckpointManager(checkpoint_dir)
        identity = {"config_hash": config_hash(config), "world_size": 1}
        latest = checkpoints.latest()
        if latest is not None:
            record = checkpoints.load(latest, adapter.trainable, stack.optimizer, expect=identity)
            source.load_state_dict(record["source"])
            tracker.load_state_dict(record["tracker"])
            stack.scheduler.load_state_dict(record["scheduler"])
            set_rng_state(record["rng"])
            first_step = record["step"] + 1
    for step in range(first_step, total):
        started = time.perf_counter()
        batch = source.next_batch()
        samples = expand_groups(batch, group, first_group_id=step * config.data.prompts_per_rollout)
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=config.sampling.seed + step)
        rolled = time.perf_counter()
        scores = rewards.score(rollout.images, [s.example.prompt for s in samples], [s.sample_id for s in samples])
        advantages, advantage_stats = compute_advantages(config.algorithm, tracker, samples, scores["total"], group)
        scored = time.perf_counter()
        train_metrics = stack.train(rollout, advantages, step)
        done = time.perf_counter()
        metrics = {
            "step": step,
            "reward_mean": float(np.mean(scores["total"])),
            "reward_std": float(np.std(scores["total"])),
        }
        metrics |= {f"reward_{k}_mean": float(np.mean(v)) for k, v in scores.items() if k != "total"}
        metrics |= {f"reward_{k}_std": float(np.std(v)) for k, v in scores.items() if k != "total"}
        metrics |= advantage_stats | train_metrics
        metrics |= {
            "seconds_rollout": rolled - started,
            "seconds_reward": scored - rolled,
            "seconds_train": done - scored,
            "images_per_s": len(samples) / (done - started),
        }
        if samples_dir and step in (0, total - 1):
            metrics["samples_path"] = save_grid(rollout.images, f"{samples_dir}/step_{step:05d}.png", group)
        if checkpoints and ((checkpoint_every and (step + 1) % checkpoint_every == 0) or step == total - 1):
            state = {"source": source.state_dict(), "tracker": tracker.state_dict(), "rng": rng_state()}
            state |= {"scheduler": stack.scheduler.state_dict()} | identity
            metrics["checkpoint"] = str(checkpoints.save(step, adapter.trainable, stack.optimizer, state))
        if on_step:
            on_step(metrics)
        yield metrics
