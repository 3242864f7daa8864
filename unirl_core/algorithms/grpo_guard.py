"""GRPO-Guard (arXiv 2510.22319; flow_grpo's config/grpo_guard.py): PPO-clip on RatioNorm-ed per-step ratios, each
step's loss divided by |dt| (the gradient reweighting), clip 2e-6, Flow-GRPO's full-SDE sampler with int(0.99 n)
trained steps. RatioNorm reads pi_old's step means (`losses.ratio_norm_loss`); checked against flow_grpo's
`scripts/train_sd3_GRPO_Guard.py` (zhtmike/flow_grpo 2e2f712).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from unirl_core.algorithms.grpo import GRPOConfig
from unirl_core.algorithms.losses import ratio_norm_loss
from unirl_core.algorithms.policy_gradient import PolicyGradient


class GRPOGuardConfig(GRPOConfig):
    name: Literal["grpo_guard"] = "grpo_guard"  # type: ignore[assignment]
    """PPO-clip on RatioNorm-ed ratios, each step's loss divided by |dt| (clip 2e-6)."""

    clip_range: Annotated[float, Field(gt=0)] = 2e-6
    """GRPO-Guard's clip range on the normalized ratio."""

    timestep_fraction: Annotated[float, Field(gt=0, le=1)] = 0.99
    """GRPO-Guard: int(0.99 n) trained steps."""

    step_rounding: Literal["round", "floor"] = "floor"
    """GRPO-Guard: int(n x timestep_fraction)."""

    untrained_steps: Literal["ode", "sde"] = "sde"
    """GRPO-Guard: Flow-GRPO's full-SDE sampler."""

    ratio_norm_bias: Literal["batch", "sample"] = "batch"
    """RatioNorm's bias mean(dmu^2) / (2 s^2): `batch` (the reference: one per denoising step over the micro-batch)
    or `sample` (per sample: a sample's normalized ratio then depends on its own move only, not on the micro-batch
    it shares; use it to compare runs with different micro-batch sizes)."""


class GRPOGuard(PolicyGradient):
    config_class = GRPOGuardConfig
    needs_old_means = True

    def policy_loss(self, result, logp_old_B, mean_old, advantages_B):
        config = self.config
        return ratio_norm_loss(result, logp_old_B, mean_old, advantages_B, config.clip_range, config.ratio_norm_bias)
