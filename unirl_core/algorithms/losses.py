"""Losses: PPO-clip on per-step log-probs, KL to the reference policy, and the flow-matching supervised loss.

ratio = exp(logp_new - logp_old)
loss  = mean(max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps)))     (eps ~ 1e-4: per-step ratios are near 1)
pg    = mean(-A log pi)                                            (`reinforce`: on-policy, one update per rollout)
kl    = mean((mean_new - mean_ref)^2) / (2 std^2)                 (Gaussian steps of equal std)
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logp_new_B: torch.Tensor, logp_old_B: torch.Tensor, advantages_B: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO-clip loss of one trained step and its diagnostics (detached)."""
    log_ratio = logp_new_B.float() - logp_old_B.float()
    ratio = torch.exp(log_ratio)
    unclipped = -advantages_B * ratio
    clipped = -advantages_B * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        metrics = {
            "ratio_mean": ratio.mean(),
            "ratio_min": ratio.min(),
            "ratio_max": ratio.max(),
            "clip_fraction": ((ratio - 1).abs() > clip_range).float().mean(),
            "approx_kl": 0.5 * (log_ratio**2).mean(),
        }
    return loss, metrics


def policy_gradient_loss(
    logp_new_B: torch.Tensor, logp_old_B: torch.Tensor, advantages_B: torch.Tensor, clip_range: float = 0.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with a baseline (DDPO's PG): -A log pi, on-policy; the ratio diagnostics for comparison."""
    _, metrics = ppo_clip_loss(logp_new_B.detach(), logp_old_B, advantages_B, clip_range or 1.0)
    return -(advantages_B * logp_new_B.float()).mean(), metrics


LOSSES = {"grpo": ppo_clip_loss, "reinforce": policy_gradient_loss}
MULTI_UPDATE = {"grpo": True, "reinforce": False}


def gaussian_kl(mean_new: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean_new, std^2) || N(mean_ref, std^2)) per sample, averaged over non-batch dims: [B]."""
    squared = (mean_new.float() - mean_ref.float()) ** 2
    return (squared / (2 * std.float() ** 2)).mean(dim=tuple(range(1, squared.ndim)))


def flow_matching_loss(velocity_pred: torch.Tensor, noise: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
    """Rectified-flow supervised loss: x_sigma = (1 - sigma) x0 + sigma noise, target velocity = noise - x0."""
    return torch.nn.functional.mse_loss(velocity_pred.float(), (noise - latents).float())
