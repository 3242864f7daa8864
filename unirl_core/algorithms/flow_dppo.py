"""FlowDPPO (Tencent-Hunyuan/UniRL, FlowDPPO/config.yaml): no ratio clipping; the term -A ratio of a (sample, step)
is dropped when the step's KL to pi_old is at or above `kl_threshold` and the update pushes further the same way
(`losses.divergence_mask_loss`); 3 SDE steps drawn per rollout from the first half of the steps, ODE elsewhere,
2 updates per rollout, advantages over the batch std (N - 1, eps 1e-8) as UniRL's SD3 recipe.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from unirl_core.algorithms.config import AlgorithmConfig, SDEWindowConfig
from unirl_core.algorithms.losses import divergence_mask_loss
from unirl_core.algorithms.policy_gradient import PolicyGradient
from unirl_core.config.schema_base import Count


class FlowDPPOConfig(AlgorithmConfig):
    name: Literal["flow_dppo"] = "flow_dppo"
    """-A ratio masked by a KL trust region (`kl_threshold`) instead of clipping, on 3 random SDE steps of the
    first half."""

    kl_threshold: Annotated[float, Field(gt=0)] = 1e-5
    """The trust region, on the step KL to pi_old averaged over latent elements (UniRL's 1e-5)."""

    sde_window: SDEWindowConfig | None = SDEWindowConfig(mode="subset", size=3, end_fraction=0.5)
    """FlowDPPO: 3 distinct steps of the first half drawn per RL step (a partial window in the recipe merges in)."""

    num_updates_per_batch: Annotated[Count, Field(ge=1)] = 2
    """FlowDPPO: 2 updates per rollout."""

    std_mode: Literal["group", "batch", "per_prompt"] = "batch"
    """UniRL's SD3 FlowDPPO recipe (`adv_use_global_std: true`): the group's mean over the whole batch's std."""

    std_ddof: Annotated[int, Field(ge=0, le=1)] = 1
    """UniRL: torch's .std() (N - 1)."""

    adv_eps: Annotated[float, Field(gt=0)] = 1e-8
    """UniRL: 1e-8 added to the std."""


class FlowDPPO(PolicyGradient):
    config_class = FlowDPPOConfig
    needs_old_means = True

    def policy_loss(self, result, logp_old_B, mean_old, advantages_B):
        return divergence_mask_loss(result, logp_old_B, mean_old, advantages_B, self.config.kl_threshold)
