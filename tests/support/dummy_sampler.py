"""A sampler added as one module, outside unirl: recipes name it `train.algorithm.sde_type:
dummy_sampler:TruncatedSDE` (this folder is on the tests' path). tests/integration/test_dummy_sampler.py rolls out,
trains, checkpoints and resumes with it, and a DDIM family refuses it (its kind is `flow`).

TruncatedSDE: Flow-GRPO's SDE whose noise scale stops growing at sigma 0.5 (std_t = eta sqrt(min(sigma, 0.5) /
(1 - min(sigma, 0.5)))), so the first, noisiest steps explore no more than the middle ones. The mean keeps the
marginal-preserving drift of that std, as Flow-GRPO's does for its own."""

from __future__ import annotations

import math

import torch

from unirl_core.domains.diffusion.rollout.samplers import Sampler, StepResult, gaussian_step


class TruncatedSDE(Sampler):
    name, kind = "truncated_sde", "flow"

    def step(self, prediction, latents, level, level_next, eta, level_max=None, prev_sample=None, generator=None):
        v, x = prediction.float(), latents.float()
        sigma, dt = level, level_next - level
        if eta == 0:
            mean = x + v * dt
            return StepResult(mean, None, mean, torch.zeros((), device=x.device), dt, x - sigma * v, v)
        capped = min(sigma, 0.5)
        std_t = eta * math.sqrt(capped / (1 - capped))
        mean = x * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
        std = torch.tensor(std_t * math.sqrt(-dt), device=x.device, dtype=torch.float32)
        return gaussian_step(mean, std, prev_sample, generator, dt, x - sigma * v, v)
