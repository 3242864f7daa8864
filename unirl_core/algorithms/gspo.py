"""GSPO (Group Sequence Policy Optimization, arXiv 2507.18071; TRL's `importance_sampling_level="sequence"`): the
importance ratio of a completion is its length-normalized sequence likelihood ratio exp(mean_t (logp - logp_old)),
clipped per sequence with the paper's small ranges (3e-4 below, 4e-4 above), the same on each of its tokens
(GSPO-token's form: the gradient flows through each token's log-prob times the sequence ratio)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from unirl_core.algorithms.token_base import TokenAlgorithm, TokenAlgorithmConfig


class GSPOConfig(TokenAlgorithmConfig):
    """GSPO: the sequence's length-normalized ratio on each of its tokens, clipped with 3e-4 / 4e-4."""

    name: Literal["gspo"] = "gspo"
    """GSPO: the sequence-level, length-normalized importance ratio, clipped per completion."""
    importance: Literal["token", "sequence"] = "sequence"
    """GSPO: the sequence-level ratio."""
    clip_range: Annotated[float, Field(gt=0)] = 3e-4
    """GSPO's lower clip range (3e-4)."""
    clip_range_high: Annotated[float, Field(gt=0)] | None = 4e-4
    """GSPO's upper clip range (4e-4)."""


class GSPO(TokenAlgorithm):
    config_class: ClassVar[type[GSPOConfig]] = GSPOConfig
