"""An algorithm added as one module, outside unirl: recipes name it `dummy_algorithm:ScaledGRPO` (this folder is on
the tests' path). Its own config key, a capability, a loss and a checkpointed state, and nothing else edited:
tests/integration/test_dummy_algorithm.py trains it, checkpoints it and resumes it.

ScaledGRPO: GRPO's PPO-clip with each step's advantages divided by the running mean of |A| over the steps before
(1 at the first), times `gain`. The running mean is state a resumed run must restore to repeat its steps.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.algorithms.losses import ppo_clip_loss
from unirl_core.algorithms.policy_gradient import PolicyGradient


class ScaledGRPOConfig(AlgorithmConfig):
    gain: Annotated[float, Field(gt=0)] = 1.0
    """Multiplies the rescaled advantages."""


class RunningScale:
    """[steps seen, mean |A| over them]: a tensor state DCP saves and loads in place."""

    def __init__(self):
        self.value = torch.zeros(2)

    def scale(self) -> float:
        return float(self.value[1]) if self.value[0] > 0 else 1.0

    def update(self, mean_abs: float) -> None:
        seen = self.value[0] + 1
        self.value.copy_(torch.stack([seen, self.value[1] + (mean_abs - self.value[1]) / seen]))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state["value"] is not self.value:
            self.value.copy_(state["value"])

    def reset(self) -> None:
        self.value.zero_()


class ScaledGRPO(PolicyGradient):
    config_class = ScaledGRPOConfig
    supports_multi_update = False  # a capability the stack and the recipe check read

    def setup(self, stack) -> None:
        self.running = RunningScale()

    def states(self) -> dict:
        return {"advantage_scale": self.running}

    def policy_loss(self, result, logp_old_B, mean_old, advantages_B):
        scaled = advantages_B * (self.config.gain / max(self.running.scale(), 1e-6))
        terms, metrics = ppo_clip_loss(result.log_prob, logp_old_B, scaled, self.config.clip_range)
        return terms, metrics | {"abs_advantage": advantages_B.abs().mean(), "advantage_scale": torch.tensor(
            self.running.scale())}  # fmt: skip

    def summarize(self, metrics: dict[str, list[float]], step: int) -> dict[str, float]:
        summary = super().summarize(metrics, step)
        self.running.update(summary["abs_advantage"])
        return summary
