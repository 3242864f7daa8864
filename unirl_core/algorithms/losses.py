"""Losses: PPO-clip on per-step log-probs, KL to the reference policy, and the flow-matching supervised loss.

ratio = exp(logp_new - logp_old)
loss  = max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps))     per sample (eps ~ 1e-4: per-step ratios are near 1)
pg    = -A log pi                                           per sample (`reinforce`: on-policy, one update each)
kl    = mean((mean_new - mean_ref)^2) / (2 std^2)           per sample (Gaussian steps of equal std)

A policy loss returns its per-sample terms [B]; the train stack takes their mean (or a weighted sum when samples
are left out or a micro-batch trains several denoising steps). Which algorithm uses which: its module
(`algorithms/<name>.py`).
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logp_new_B: torch.Tensor, logp_old_B: torch.Tensor, advantages_B: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO-clip loss terms [B] of one trained step and its diagnostics (detached)."""
    log_ratio = logp_new_B.float() - logp_old_B.float()
    ratio = torch.exp(log_ratio)
    unclipped = -advantages_B * ratio
    clipped = -advantages_B * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)
    loss = torch.maximum(unclipped, clipped)
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
    """REINFORCE with a baseline (DDPO's PG): terms -A log pi [B], on-policy; the ratio diagnostics for comparison."""
    _, metrics = ppo_clip_loss(logp_new_B.detach(), logp_old_B, advantages_B, clip_range or 1.0)
    return -(advantages_B * logp_new_B.float()), metrics


def _mean_over_elements(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(1, x.ndim)))


def ratio_norm_loss(result, logp_old_B, mean_old, advantages_B, clip_range: float, bias: str = "batch"):
    """GRPO-Guard (arXiv 2510.22319, flow_grpo's `rationorm`): with s the step's std and dmu = mean - mean_old,
        log r = (logp - logp_old + b) s,   b = mean(dmu^2) / (2 s^2)
    then the PPO-clip terms, each step's divided by |dt| (the gradient reweighting; 1 on DDIM steps, which have no
    dt). `bias`: `batch` (the reference, `train_sd3_GRPO_Guard.py`: one b per denoising step, the mean over the
    micro-batch's samples and latent elements, so the samples' gradients couple through it) or `sample` (each
    sample's own b: its log r is exactly mean(eps dmu), eps = (x_next - mean_old) / s, whatever else is in the
    micro-batch)."""
    std = result.std.float()
    bias_B = _mean_over_elements((result.mean - mean_old) ** 2) / (2 * std**2)
    if bias == "batch":
        bias_B = bias_B.mean().expand_as(bias_B)
    log_ratio = (result.log_prob.float() - logp_old_B.float() + bias_B) * std
    ratio = torch.exp(log_ratio)
    terms = torch.maximum(-advantages_B * ratio, -advantages_B * torch.clamp(ratio, 1 - clip_range, 1 + clip_range))
    if result.dt is not None:
        terms = terms / abs(result.dt)
    with torch.no_grad():
        metrics = {
            "ratio_mean": ratio.mean(), "ratio_min": ratio.min(), "ratio_max": ratio.max(),
            "clip_fraction": ((ratio - 1).abs() > clip_range).float().mean(), "approx_kl": 0.5 * (log_ratio**2).mean(),
        }  # fmt: skip
    return terms, metrics


def divergence_mask_loss(result, logp_old_B, mean_old, advantages_B, kl_threshold: float):
    """FlowDPPO (Tencent-Hunyuan/UniRL): no ratio clipping; the term -A ratio of a (sample, step) is dropped (0,
    still counted in the mean) when the step's KL to pi_old, mean(dmu^2) / (2 s^2) over latent elements, is at or
    above `kl_threshold` and the update pushes further the same way (A (ratio - 1) > 0). Corrective moves stay."""
    ratio = torch.exp(result.log_prob.float() - logp_old_B.float())
    with torch.no_grad():
        kl = _mean_over_elements((result.mean.float() - mean_old.float()) ** 2) / (2 * result.std.float() ** 2)
        drop = (kl >= kl_threshold) & (((ratio > 1) & (advantages_B > 0)) | ((ratio < 1) & (advantages_B < 0)))
    terms = torch.where(drop, torch.zeros_like(ratio), -advantages_B * ratio)
    with torch.no_grad():
        metrics = {
            "ratio_mean": ratio.mean(), "ratio_min": ratio.min(), "ratio_max": ratio.max(),
            "masked_fraction": drop.float().mean(), "kl_old_mean": kl.mean(), "kl_old_max": kl.max(),
            "approx_kl": 0.5 * ((ratio.log()) ** 2).mean(),
        }  # fmt: skip
    return terms, metrics


def nft_preference(advantages_B: torch.Tensor, adv_clip: float) -> torch.Tensor:
    """DiffusionNFT's optimality weight r = 1/2 + 1/2 clip(A / adv_clip, -1, 1) in [0, 1] (A: the group-normalized
    advantage; the reference's r = clamp(A_clipped / adv_clip / 2 + 0.5, 0, 1))."""
    return (advantages_B.float().clamp(-adv_clip, adv_clip) / adv_clip / 2 + 0.5).clamp(0.0, 1.0)


def _adaptive_error(x0_pred: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """mean((x0_pred - x0)^2) / sg(mean|x0_pred - x0|) per sample (the denominator at least 1e-5): DiffusionNFT's
    adaptively weighted x0 error, computed in float64 as the reference does."""
    error = x0_pred.double() - x0.double()
    with torch.no_grad():
        weight = _mean_over_elements(error.abs()).clamp(min=1e-5)
    return _mean_over_elements(error**2) / weight


def nft_loss(x0_new, x0_old, x0, r_B, nft_beta: float, adv_clip: float):
    """DiffusionNFT (arXiv 2509.16117; NVlabs/DiffusionNFT `train_nft_sd3.py`): the implicit positive and negative
    policies around the old one, in x0 space (affine in the velocity, so mixing x0 predictions mixes velocities):
        x0+ = beta x0_new + (1 - beta) x0_old          x0- = (1 + beta) x0_old - beta x0_new
        term = adv_clip (r E+(x0+) + (1 - r) E-(x0-)) / beta,   E: `_adaptive_error` against the rollout's x0.
    Returns the per-sample terms [B] and diagnostics. No likelihood, ratio or SDE: any sampler's final latent."""
    positive = nft_beta * x0_new.float() + (1 - nft_beta) * x0_old.float()
    negative = (1 + nft_beta) * x0_old.float() - nft_beta * x0_new.float()
    positive_error, negative_error = _adaptive_error(positive, x0), _adaptive_error(negative, x0)
    terms = adv_clip * (r_B * positive_error + (1 - r_B) * negative_error) / nft_beta
    with torch.no_grad():
        metrics = {
            "positive_loss": positive_error.mean(), "negative_loss": negative_error.mean(), "r_mean": r_B.mean(),
            "old_gap": _mean_over_elements((x0_new.float() - x0_old.float()) ** 2).mean(),
        }  # fmt: skip
    return terms.float(), metrics


def prediction_mse(prediction: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-sample mean squared difference [B] of two model outputs (DiffusionNFT's KL term: velocity to the base)."""
    return _mean_over_elements((prediction.float() - reference.float()) ** 2)


def gaussian_kl(mean_new: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean_new, std^2) || N(mean_ref, std^2)) per sample, averaged over non-batch dims: [B]."""
    squared = (mean_new.float() - mean_ref.float()) ** 2
    return (squared / (2 * std.float() ** 2)).mean(dim=tuple(range(1, squared.ndim)))


def flow_matching_loss(velocity_pred: torch.Tensor, noise: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
    """Rectified-flow supervised loss: x_sigma = (1 - sigma) x0 + sigma noise, target velocity = noise - x0."""
    return torch.nn.functional.mse_loss(velocity_pred.float(), (noise - latents).float())
