"""Flow-GRPO's SDE step for flow matching (arXiv 2505.05470; velocity v, sigma from 1 to 0, dt = sigma_next - sigma):
    std_t  = eta * sqrt(sigma / (1 - sigma))          (sigma_max in place of 1 at sigma = 1)
    mean   = x (1 + std_t^2 dt / (2 sigma)) + v (1 + std_t^2 (1 - sigma) / (2 sigma)) dt
    x_next = mean + std_t sqrt(-dt) noise
With eta 0, the Euler step of the flow ODE.
"""

from __future__ import annotations

import math

import torch

from unirl_core.data.noise import Generators
from unirl_core.domains.diffusion.rollout.samplers.base import Sampler, StepResult, gaussian_step


def flow_sde_step(
    velocity: torch.Tensor,
    latents: torch.Tensor,
    sigma: float,
    sigma_next: float,
    eta: float,
    sigma_max: float | None = None,
    prev_sample: torch.Tensor | None = None,
    generator: Generators | None = None,
    constant_std: bool = False,
) -> StepResult:
    """One flow-matching SDE step. With `prev_sample`, the log-prob of that stored transition (re-evaluation).
    `constant_std`: DanceGRPO's SDE, std_t = eta at every sigma (the same mean formula)."""
    v, x = velocity.float(), latents.float()
    dt, x0 = sigma_next - sigma, x - sigma * v
    if eta == 0:
        mean = x + v * dt
        return StepResult(mean, None, mean, torch.zeros((), device=x.device), dt, x0, v)
    denominator = 1 - sigma if sigma < 1 else 1 - (sigma_max if sigma_max is not None and sigma_max < 1 else 1 - 1e-4)
    std_t = eta if constant_std else eta * math.sqrt(sigma / max(denominator, 1e-8))
    mean = x * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    std = torch.tensor(std_t * math.sqrt(-dt), device=x.device, dtype=torch.float32)
    return gaussian_step(mean, std, prev_sample, generator, dt, x0, v)


class FlowSDE(Sampler):
    name, kind = "sde", "flow"

    def step(self, prediction, latents, level, level_next, eta, level_max=None, prev_sample=None, generator=None):
        return flow_sde_step(prediction, latents, level, level_next, eta, sigma_max=level_max,
                             prev_sample=prev_sample, generator=generator)  # fmt: skip
