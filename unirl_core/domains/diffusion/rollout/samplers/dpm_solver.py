"""DPM-Solver++ 2M, the deterministic multistep solver rollouts may run after their last SDE step
(`train.algorithm.ode_solver: dpm2m`, `rollout/ode.py`)."""

from __future__ import annotations

import math

import torch


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
