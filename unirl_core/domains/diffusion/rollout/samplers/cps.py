"""Coefficients-Preserving Sampling for flow matching (arXiv 2509.05952; flow_grpo's `sde_type="cps"`)."""

from __future__ import annotations

import math

import torch

from unirl_core.data.noise import Generators
from unirl_core.domains.diffusion.rollout.samplers.base import Sampler, StepResult, gaussian_step


def cps_step(
    velocity: torch.Tensor,
    latents: torch.Tensor,
    sigma: float,
    sigma_next: float,
    eta: float,
    prev_sample: torch.Tensor | None = None,
    generator: Generators | None = None,
) -> StepResult:
    """Coefficients-Preserving Sampling (arXiv 2509.05952; flow_grpo's `sde_type="cps"`): from the predicted
    x0 = x - sigma v and x1 = x + (1 - sigma) v,
        std  = sigma_next sin(eta pi / 2)
        mean = (1 - sigma_next) x0 + sqrt(sigma_next^2 - std^2) x1
    so the sample keeps the noise level sigma_next exactly. eta 0 is the Euler step. The log-prob is the Gaussian
    one (flow_grpo drops its 1/(2 std^2) and constants: its ratio is ours to the power 2 std^2). The last step
    (sigma_next = 0) has std 0: deterministic, never a trained step."""
    v, x = velocity.float(), latents.float()
    std_value = sigma_next * math.sin(eta * math.pi / 2)
    x0, x1 = x - sigma * v, x + (1 - sigma) * v
    mean = (1 - sigma_next) * x0 + math.sqrt(max(sigma_next**2 - std_value**2, 0.0)) * x1
    std = torch.tensor(std_value, device=x.device, dtype=torch.float32)
    if std_value == 0:
        return StepResult(mean, None, mean, std, sigma_next - sigma, x0, v)
    return gaussian_step(mean, std, prev_sample, generator, sigma_next - sigma, x0, v)


class CPS(Sampler):
    name, kind = "cps", "flow"
    noise_at_last_step = False  # std = sigma_next sin(eta pi / 2) is 0 on the step to sigma 0

    def step(self, prediction, latents, level, level_next, eta, level_max=None, prev_sample=None, generator=None):
        return cps_step(prediction, latents, level, level_next, eta, prev_sample=prev_sample, generator=generator)
