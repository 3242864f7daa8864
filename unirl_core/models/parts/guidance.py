"""The guidance part of a family: classifier-free guidance over [negative, positive] halves of one batch, the
negative half's gradient detached when the algorithm says so (`StepSampling.detach_uncond`), and a view of the family
at another guidance scale (evaluation). A family without a negative branch (guidance embedded in the model, FLUX.1
dev; or none) sets `cfg_branch = False`.

Reads from the family: `guidance_scale`, `cfg_branch`.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, ClassVar

import torch

from unirl_core.models.text_cache import Conditioning

if TYPE_CHECKING:
    from unirl_core.domains.diffusion.rollout.samplers.base import StepSampling


class ClassifierFreeGuidance:
    """CFG over one batch of both halves (see the module)."""

    guidance: ClassVar[str] = "CFG"  # how `sampling.guidance_scale` is used (shown by `unirl families`)
    cfg_branch: ClassVar[bool] = True  # guidance_scale > 1 runs a negative branch; False: embedded or unused

    @property
    def cfg(self) -> bool:
        return self.cfg_branch and self.guidance_scale > 1.0

    def select(self, cond: Conditioning, index: torch.Tensor) -> Conditioning:
        """The conditioning of a subset of samples (both CFG halves, kept in [negative, positive] order)."""
        if not self.cfg:
            return {k: v[index] for k, v in cond.items()}
        halves = {k: v.chunk(2) for k, v in cond.items()}
        return {k: torch.cat([negative[index], positive[index]]) for k, (negative, positive) in halves.items()}

    def guided(self, output: torch.Tensor, sampling: StepSampling | None = None) -> torch.Tensor:
        """The denoiser's output on [negative, positive] inputs -> the guided float32 prediction."""
        if not self.cfg:
            return output.float()
        uncond, cond = self.cfg_halves(output, sampling)
        return uncond + self.guidance_scale * (cond - uncond)

    def cfg_halves(self, output: torch.Tensor, sampling: StepSampling | None = None) -> tuple[torch.Tensor, ...]:
        """(negative, positive) float32 halves of a CFG output; the negative one detached when `sampling` says so
        (`algorithm.cfg_gradient: detach_uncond`)."""
        uncond, cond = output.float().chunk(2)
        return (uncond.detach() if sampling is not None and sampling.detach_uncond else uncond), cond

    def with_guidance(self, guidance_scale: float):
        """This family (the same modules) sampling with another guidance scale: evaluation's `eval_guidance`,
        without setting anything on the family the rollouts use."""
        view = copy.copy(self)
        view.guidance_scale = guidance_scale
        return view
