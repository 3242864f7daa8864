"""Dr. GRPO ("Understanding R1-Zero-Like Training", arXiv 2503.20783; TRL's `loss_type="dr_grpo"`): GRPO without its
two biases: advantages are the reward minus the group mean (no std division), and token losses are summed and divided
by a constant, completions x max_new_tokens (no per-completion length normalization)."""

from __future__ import annotations

from typing import ClassVar, Literal

from unirl_core.algorithms.token_base import LossAgg, TokenAlgorithm, TokenAlgorithmConfig


class DrGRPOConfig(TokenAlgorithmConfig):
    """Dr. GRPO: advantages without the std division, token sums over completions x max_new_tokens."""

    name: Literal["dr_grpo"] = "dr_grpo"
    """Dr. GRPO: no std division of advantages, token sums over a constant normalizer."""
    std_mode: Literal["group", "batch", "none"] = "none"
    """Dr. GRPO: the group mean subtracted, no std division."""
    loss_agg: LossAgg = "seq-mean-token-sum-norm"
    """Dr. GRPO's constant normalizer."""


class DrGRPO(TokenAlgorithm):
    config_class: ClassVar[type[DrGRPOConfig]] = DrGRPOConfig
