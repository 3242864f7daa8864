"""The sampler contract: a stochastic denoising step maps x_t to x_next by a Gaussian N(mean, std^2) and returns the
sample, its log-probability (mean over all non-batch dimensions), the mean and the std (`StepResult`). Everything is
computed in float32 whatever the model's dtype: bf16 breaks the "first ratio is exactly 1" invariant (RL.md,
pitfalls). With eta = 0 a step is deterministic (evaluation, ODE steps): no noise, no log-prob.

A `Sampler` is one such step, of one `kind`: `flow` steps take the velocity and the noise levels (sigma, sigma_next,
and sigma_max, the schedule's second sigma), `ddim` steps the epsilon prediction and the alpha-bars (a_t, a_prev).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from unirl_core.data.noise import Generators, randn_like_samples

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class StepResult:
    sample: torch.Tensor  # x_next, float32 [B, C, H, W]
    log_prob: torch.Tensor | None  # [B], None for a deterministic step
    mean: torch.Tensor  # float32 [B, C, H, W]
    std: torch.Tensor  # float32, broadcastable to the sample (a scalar per step)
    dt: float | None = None  # flow steps: sigma_next - sigma (< 0); None for DDIM
    x0: torch.Tensor | None = None  # float32 [B, C, H, W]: the clean latent the step predicts (DiffusionNFT)
    prediction: torch.Tensor | None = None  # float32: the (guided) model output, velocity or epsilon


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std^2) per element, averaged over every non-batch dimension: [B]."""
    x, mean, std = x.float(), mean.float(), std.float()
    per_element = -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - LOG_SQRT_2PI
    return per_element.mean(dim=tuple(range(1, x.ndim)))


def gaussian_step(
    mean, std, prev_sample, generator: Generators | None, dt: float | None = None, x0=None, prediction=None
) -> StepResult:
    """Draw x_next ~ N(mean, std^2), or take the stored `prev_sample`, and its log-prob. `generator`: one for the
    batch, or one per sample (each sample's noise then depends on its own generator only)."""
    if prev_sample is None:
        if generator is None:
            noise = torch.randn(mean.shape, device=mean.device, dtype=torch.float32)
        else:
            noise = randn_like_samples(mean.shape, generator).to(mean.device)
        prev_sample = mean + std * noise
    prev_sample = prev_sample.float()
    return StepResult(prev_sample, gaussian_log_prob(prev_sample, mean, std), mean, std, dt, x0, prediction)


class Sampler:
    """One stochastic step, chosen by name (`train.algorithm.sde_type`, `samplers.registry`). `kind`: the family
    kind whose `transition` calls it (`flow` or `ddim`); `noise_at_last_step`: whether the step to the last noise
    level is stochastic (CPS keeps the level exact, so its last step has std 0 and is never trained)."""

    name: ClassVar[str]
    kind: ClassVar[str]
    noise_at_last_step: ClassVar[bool] = True

    def step(self, prediction, latents, level, level_next, eta, level_max=None, prev_sample=None, generator=None):
        """`prediction`: the guided float32 model output (velocity or epsilon); `level`, `level_next`: sigma and
        sigma_next (flow) or a_t and a_prev (ddim); `level_max`: a flow schedule's second sigma (Flow-GRPO's std at
        sigma = 1). With `prev_sample`, the log-prob of that stored transition."""
        raise NotImplementedError


@dataclass(frozen=True)
class StepSampling:
    """How an algorithm's transitions sample and train: its sampler and whether the CFG negative branch is detached
    from the gradient (`Family.step_sampling`); passed to every transition."""

    sampler: Sampler
    detach_uncond: bool = False
