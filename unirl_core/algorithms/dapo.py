"""DAPO (arXiv 2503.14476; TRL's `loss_type="dapo"`): clip-higher (eps_low 0.2, eps_high 0.28), the token-level
mean over the whole batch (long completions weigh by their tokens), no KL term. Its overlong reward shaping is the
autoregressive domain's `overlong_buffer`; its dynamic sampling (drawing more prompts until every group's rewards
differ) is not here yet: `drop_zero_advantage` leaves equal-reward groups out of the loss instead."""

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


class DAPO(TokenAlgorithm):
    config_class: ClassVar[type[DAPOConfig]] = DAPOConfig
