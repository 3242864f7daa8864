"""DDIM's step with eta for epsilon prediction (alpha-bar a_t -> a_prev), DDPO's sampler at eta = 1:
x0     = (x - sqrt(1 - a_t) eps) / sqrt(a_t)
std    = eta * sqrt((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev))
mean   = sqrt(a_prev) x0 + sqrt(1 - a_prev - std^2) eps
"""

from __future__ import annotations

import math

import torch

from unirl_core.data.noise import Generators
from unirl_core.domains.diffusion.rollout.samplers.base import Sampler, StepResult, gaussian_step


def ddim_step(
    noise_pred: torch.Tensor,
    latents: torch.Tensor,
    alpha_prod: float,
    alpha_prod_prev: float,
    eta: float,
    prev_sample: torch.Tensor | None = None,
    generator: Generators | None = None,
) -> StepResult:
    """One DDIM step (epsilon prediction) with its Gaussian log-prob; eta = 1 is DDPO's sampler."""
    eps, x = noise_pred.float(), latents.float()
    x0 = (x - math.sqrt(1 - alpha_prod) * eps) / math.sqrt(alpha_prod)
    variance = (1 - alpha_prod_prev) / (1 - alpha_prod) * (1 - alpha_prod / alpha_prod_prev)
    std_value = eta * math.sqrt(max(variance, 0.0))
    direction = math.sqrt(max(1 - alpha_prod_prev - std_value**2, 0.0)) * eps
    mean = math.sqrt(alpha_prod_prev) * x0 + direction
    std = torch.tensor(std_value, device=x.device, dtype=torch.float32)
    if eta == 0 or std_value == 0:
        return StepResult(mean, None, mean, std, None, x0, eps)
    return gaussian_step(mean, std, prev_sample, generator, None, x0, eps)


class DDIM(Sampler):
    name, kind = "sde", "ddim"  # the recipe's `sde` on a DDIM family

    def step(self, prediction, latents, level, level_next, eta, level_max=None, prev_sample=None, generator=None):
        return ddim_step(prediction, latents, level, level_next, eta, prev_sample=prev_sample, generator=generator)
