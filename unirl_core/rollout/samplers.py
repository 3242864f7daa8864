"""Stochastic denoising steps with log-probabilities: the transitions GRPO trains on.

Two families, one contract: a step maps x_t to x_next by a Gaussian N(mean, std^2) and returns the sample, its
log-probability (mean over all non-batch dimensions), the mean and the std. Everything is computed in float32
whatever the model's dtype: bf16 breaks the "first ratio is exactly 1" invariant (RL.md, pitfalls).

Flow matching (SD3; velocity v, sigma from 1 to 0, dt = sigma_next - sigma < 0), Flow-GRPO's SDE:
    std_t  = eta * sqrt(sigma / (1 - sigma))          (sigma_max in place of 1 at sigma = 1)
    mean   = x (1 + std_t^2 dt / (2 sigma)) + v (1 + std_t^2 (1 - sigma) / (2 sigma)) dt
    x_next = mean + std_t sqrt(-dt) noise
DDIM (SD 1.x; epsilon prediction, alpha-bar a_t -> a_prev), DDPO's eta = 1 step:
    x0     = (x - sqrt(1 - a_t) eps) / sqrt(a_t)
    std    = eta * sqrt((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev))
    mean   = sqrt(a_prev) x0 + sqrt(1 - a_prev - std^2) eps
With eta = 0 both are deterministic (evaluation): no noise, no log-prob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from unirl_core.rollout.noise import Generators, randn_like_samples

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


def _gaussian_step(
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
    return _gaussian_step(mean, std, prev_sample, generator, dt, x0, v)


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
    return _gaussian_step(mean, std, prev_sample, generator, sigma_next - sigma, x0, v)


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
    return _gaussian_step(mean, std, prev_sample, generator, None, x0, eps)


def dpm_solver_2m(first_order, x0, x0_prev, levels_prev, levels, levels_next) -> torch.Tensor:
    """DPM-Solver++ 2M (arXiv 2211.01095; diffusers' DPMSolverMultistepScheduler with `dpmsolver++`, order 2,
    `midpoint`): the deterministic step x_i -> x_{i+1} from the x0 predictions of steps i and i - 1. With
    (alpha, sigma) each step's noise levels (x = alpha x0 + sigma noise) and lambda = log(alpha / sigma):
        h = lambda_{i+1} - lambda_i,   r = (lambda_i - lambda_{i-1}) / h
        D = x0_i + (x0_i - x0_{i-1}) / (2 r)
        x_{i+1} = (sigma_{i+1} / sigma_i) x_i + alpha_{i+1} (1 - e^-h) D
    The D = x0_i part is exactly flow matching's Euler step and DDIM's eta-0 step, so this is the family's own
    step `first_order` plus alpha_{i+1} (1 - e^-h) (x0_i - x0_{i-1}) / (2 r). Levels are (alpha, sigma) floats
    with sigma > 0 (the step to sigma 0 stays first order: lambda is infinite there). A previous level of pure
    noise (alpha 0, sigma 1: a flow schedule's first) has lambda -inf, r infinite: no correction (as in the
    references' code, where the division by r gives 0)."""
    if levels_prev[0] <= 0:
        return first_order
    lambdas = [math.log(alpha / sigma) for alpha, sigma in (levels_prev, levels, levels_next)]
    h, h_prev = lambdas[2] - lambdas[1], lambdas[1] - lambdas[0]
    scale = levels_next[0] * -math.expm1(-h) * h / (2 * h_prev)
    return first_order + scale * (x0.float() - x0_prev.float())
