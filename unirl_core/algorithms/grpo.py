"""GRPO for diffusion (Flow-GRPO, arXiv 2505.05470; DDPO's PPO): PPO-clip on the per-step ratios of the stored
stochastic transitions to pi_old, advantages normalized within each prompt's group; several updates per rollout
(`num_updates_per_batch`) are sound, the ratio corrects for the moved policy.

    ratio = exp(logp_new - logp_old)
    loss  = max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps))     per sample (eps ~ 1e-4: per-step ratios are near 1)
"""

from __future__ import annotations

from typing import Literal

from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.algorithms.losses import ppo_clip_loss
from unirl_core.algorithms.policy_gradient import PolicyGradient


class GRPOConfig(AlgorithmConfig):
    """`grpo`: every key at its shared default (Flow-GRPO's SDE on every step, the first steps trained)."""

    name: Literal["grpo"] = "grpo"
    """PPO-clip on per-step ratios to pi_old (Flow-GRPO, DDPO's PPO); several updates per rollout are allowed."""


class GRPO(PolicyGradient):
    config_class = GRPOConfig

    def policy_loss(self, result, logp_old_B, mean_old, advantages_B):
        return ppo_clip_loss(result.log_prob, logp_old_B, advantages_B, self.config.clip_range)
