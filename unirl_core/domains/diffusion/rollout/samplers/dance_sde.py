"""DanceGRPO's SDE step for flow matching (arXiv 2505.07818): Flow-GRPO's mean with a constant std_t = eta at every
noise level (`flow_sde_step(..., constant_std=True)`): x_next = mean + eta sqrt(-dt) noise."""

from __future__ import annotations

from unirl_core.domains.diffusion.rollout.samplers.base import Sampler
from unirl_core.domains.diffusion.rollout.samplers.flow_sde import flow_sde_step


class DanceSDE(Sampler):
    name, kind = "dance", "flow"

    def step(self, prediction, latents, level, level_next, eta, level_max=None, prev_sample=None, generator=None):
        return flow_sde_step(prediction, latents, level, level_next, eta, sigma_max=level_max,
                             prev_sample=prev_sample, generator=generator, constant_std=True)  # fmt: skip
