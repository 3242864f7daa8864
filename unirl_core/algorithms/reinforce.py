"""REINFORCE with a baseline (DDPO's PG, arXiv 2305.13301): the on-policy gradient -A log pi per stored
transition, exactly one update per rollout (no importance ratio to correct for a policy that moved); the ratio's
diagnostics are logged for comparison with `grpo`.
"""

from __future__ import annotations

from typing import Literal

from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.algorithms.losses import policy_gradient_loss
from unirl_core.algorithms.policy_gradient import PolicyGradient


class ReinforceConfig(AlgorithmConfig):
    """`reinforce`: the shared defaults; `num_updates_per_batch` must stay 1."""

    name: Literal["reinforce"] = "reinforce"
    """The on-policy gradient -A log pi (DDPO's PG), exactly one update per rollout."""


class Reinforce(PolicyGradient):
    config_class = ReinforceConfig
    supports_multi_update = False

    def policy_loss(self, result, logp_old_B, mean_old, advantages_B):
        return policy_gradient_loss(result.log_prob, logp_old_B, advantages_B, self.config.clip_range)
