"""DAPO (arXiv 2503.14476; TRL's `loss_type="dapo"`): clip-higher (eps_low 0.2, eps_high 0.28), the token-level
mean over the whole batch (long completions weigh by their tokens), no KL term, and dynamic sampling (on by default,
as veRL's DAPO recipe runs it: groups whose rewards are all equal are left out and more prompts drawn, at most 10
rollouts per step; veRL's recipe/dapo/dapo_ray_trainer.py, read at 004c888). Its overlong reward shaping is the
autoregressive domain's `overlong_buffer`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from unirl_core.algorithms.token_base import LossAgg, TokenAlgorithm, TokenAlgorithmConfig


class DAPOConfig(TokenAlgorithmConfig):
    """DAPO: clip-higher (0.2 / 0.28) and one token-level mean over the whole batch, no KL."""

    name: Literal["dapo"] = "dapo"
    """DAPO: clip-higher and one token-level mean over the batch."""
    clip_range_high: Annotated[float, Field(gt=0)] | None = 0.28
    """DAPO's eps_high."""
    loss_agg: LossAgg = "token-mean"
    """DAPO's token-level mean over every token of the batch."""
    dynamic_sampling: bool = True
    """DAPO's dynamic sampling (see the base key)."""


class DAPO(TokenAlgorithm):
    config_class: ClassVar[type[DAPOConfig]] = DAPOConfig
