"""The single-process runner: N steps of rollout -> reward -> advantage -> update from a recipe, no Ray.

Used by tests, notebooks and `unirl train RECIPE --local`, and as the baseline of the distributed runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from unirl_core.algorithms.advantages import group_advantages
from unirl_core.config.schema import TrainConfig
from unirl_core.data.groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.models.adapters import build_adapter
from unirl_core.rewards.service import RewardService
from unirl_core.rollout.rollout import run_rollout
from unirl_core.train.stack import TrainStack


def run_local(
    config: TrainConfig, steps: int | None = None, device: str = "cpu", on_step: Callable[[dict], None] | None = None
) -> list[dict]:
    """Run `steps` (default `config.steps`) RL steps; returns one metrics dict per step."""
    return list(iter_local(config, steps, device, on_step))


def iter_local(config: TrainConfig, steps: int | None = None, device: str = "cpu", on_step=None) -> Iterator[dict]:
    torch.manual_seed(config.sampling.seed)
    source = build_source(config.data)
    adapter = build_adapter(config.model, config.sampling, device=device)
    rewards = RewardService(config.reward.weights, config.reward.guards)
    stack = TrainStack(adapter, config.algorithm)
    group = config.sampling.samples_per_prompt
    for step in range(steps or config.steps):
        started = time.perf_counter()
        batch = source.next_batch()
        samples = expand_groups(batch, group, first_group_id=step * config.data.prompts_per_rollout)
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=config.sampling.seed + step)
        rolled = time.perf_counter()
        scores = rewards.score(rollout.images, [s.example.prompt for s in samples], [s.sample_id for s in samples])
        advantages, advantage_stats = group_advantages(
            torch.tensor(scores["total"]), group, config.algorithm.std_mode, clip=config.algorithm.adv_clip
        )
        scored = time.perf_counter()
        train_metrics = stack.train(rollout, advantages, step)
        done = time.perf_counter()
        metrics = {
            "step": step,
            "reward_mean": float(np.mean(scores["total"])),
            "reward_std": float(np.std(scores["total"])),
        }
        metrics |= {f"reward_{k}_mean": float(np.mean(v)) for k, v in scores.items() if k != "total"}
        metrics |= advantage_stats | train_metrics
        metrics |= {
            "seconds_rollout": rolled - started,
            "seconds_reward": scored - rolled,
            "seconds_train": done - scored,
            "images_per_s": len(samples) / (done - started),
        }
        if on_step:
            on_step(metrics)
        yield metrics
