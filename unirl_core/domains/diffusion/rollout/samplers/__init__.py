"""Samplers, one module each: the stochastic denoising steps with log-probabilities GRPO trains on (`flow_sde`:
Flow-GRPO's SDE, `cps`: Coefficients-Preserving Sampling, `dance_sde`: DanceGRPO's constant-std SDE, `ddim`: DDIM
with eta) and the deterministic multistep solver (`dpm_solver`: DPM-Solver++ 2M). `base.py` holds the contract
(`Sampler`, `StepResult`), `registry.py` resolves the recipe's `train.algorithm.sde_type` for a family's kind.
"""

from unirl_core.domains.diffusion.rollout.samplers.base import (
    LOG_SQRT_2PI,
    Sampler,
    StepResult,
    StepSampling,
    gaussian_log_prob,
    gaussian_step,
)
from unirl_core.domains.diffusion.rollout.samplers.cps import cps_step
from unirl_core.domains.diffusion.rollout.samplers.ddim import ddim_step
from unirl_core.domains.diffusion.rollout.samplers.dpm_solver import dpm_solver_2m
from unirl_core.domains.diffusion.rollout.samplers.flow_sde import flow_sde_step

__all__ = [
    "LOG_SQRT_2PI",
    "Sampler",
    "StepResult",
    "StepSampling",
    "cps_step",
    "ddim_step",
    "dpm_solver_2m",
    "flow_sde_step",
    "gaussian_log_prob",
    "gaussian_step",
]
