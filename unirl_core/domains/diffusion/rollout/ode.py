"""The deterministic (ODE, eta 0) steps of a rollout: the family's own first-order step or DPM-Solver++ 2M.

`euler` keeps each family's step as it is (flow matching's Euler step, DDIM's eta-0 step). `dpm2m` adds the
second-order multistep correction from the previous step's x0 prediction (`samplers.dpm_solver_2m`), with the model
evaluated exactly where the Euler sampler evaluates it: the same forwards, a more accurate trajectory. As in the
references' code it applies to the steps after the rollout's last SDE step only (every step of a likelihood-free
rollout: DiffusionNFT's `dpm2`; after the window: MixGRPO-Flash's `post` strategy), the history is every step's
x0 prediction (an SDE step's included, as MixGRPO's sampler keeps it), and the first step and the last one (to
sigma 0, where lambda is infinite: diffusers' `lower_order_final`) stay first order.
"""

from __future__ import annotations

from unirl_core.domains.diffusion.rollout.samplers import StepResult, dpm_solver_2m


class OdeSteps:
    """The steps of one denoising run of `num_steps` steps. `levels(index)`: the (alpha, sigma) of x at step
    `index` (the family's `noise_level`); `first_multistep`: the first step `dpm2m` may correct."""

    def __init__(self, solver: str, levels, num_steps: int, first_multistep: int = 0):
        self.solver, self.levels, self.last, self.first = solver, levels, num_steps - 1, first_multistep
        self.history: tuple[int, object] | None = None  # (index, x0) of the previous step

    def __call__(self, index: int, result: StepResult, stochastic: bool = False):
        """x after step `index` from its transition `result` (run with eta 0 unless `stochastic`)."""
        history, self.history = self.history, (index, result.x0)
        if self.solver == "euler" or stochastic or index < self.first or index == self.last:
            return result.sample
        if history is None or history[0] != index - 1:
            return result.sample
        levels = [self.levels(i) for i in (index - 1, index, index + 1)]
        return dpm_solver_2m(result.sample, result.x0, history[1], *levels)
