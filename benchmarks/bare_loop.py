"""The bare computation of RL steps, the baseline the benchmarks measure the controller against: one process, no
group, no checkpoint, no tracking; rollout -> reward -> advantage -> update on the family, nothing else.

Not a training entry point (that is `unirl train`, `--local` for one rank in-process): only what a step costs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch

from unirl_core.algorithms.advantages import PerPromptStatTracker, compute_advantages
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack
from unirl_core.models.registry import build_family
from unirl_core.rewards.service import RewardService


def bare_steps(config, steps: int | None = None, device: str = "cpu") -> Iterator[dict]:
    """`steps` (default `config.steps`) RL steps; yields each step's reward, train metrics and phase seconds."""
    torch.manual_seed(config.sampling.seed)
    source = build_source(config.data)
    adapter = build_family(config.model, config.sampling, device=device)
    rewards = RewardService.from_config(config.reward, device=device)
    total, group, algorithm = steps or config.steps, config.sampling.samples_per_prompt, config.algorithm
    stack = TrainStack(adapter, algorithm, total_updates=total * algorithm.num_updates_per_batch)
    tracker = PerPromptStatTracker(algorithm.tracker_buffer_size, algorithm.tracker_min_count)
    for step in range(total):
        started = time.perf_counter()
        samples = expand_groups(source.next_batch(), group, first_group_id=step * config.data.prompts_per_rollout)
        rollout = run_rollout(adapter, samples, config.sampling, algorithm, seed=config.sampling.seed + step, step=step)
        rolled = time.perf_counter()
        prompts = [s.example.prompt for s in samples]
        scores = rewards.score(rollout.images, prompts, [s.sample_id for s in samples])
        advantages, _ = compute_advantages(algorithm, tracker, prompts, scores["total"], group)
        scored = time.perf_counter()
        metrics = stack.train(rollout, advantages, step)
        done = time.perf_counter()
        yield metrics | {
            "step": step, "reward_mean": float(np.mean(scores["total"])), "seconds_rollout": rolled - started,
            "seconds_reward": scored - rolled, "seconds_train": done - scored, "images_per_s": len(samples) / (done - started),
        }  # fmt: skip
