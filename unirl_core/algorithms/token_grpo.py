"""GRPO on tokens (DeepSeekMath, arXiv 2402.03300; TRL's GRPOTrainer `loss_type="grpo"`): per-token PPO-clip ratios,
each completion's token mean, then the mean over completions; advantages normalized by the group's std; a k3 KL to
the reference when `beta` > 0 (the paper's 0.04; TRL's default 0). The loss is `token_base.TokenAlgorithm`'s."""

from __future__ import annotations

from typing import ClassVar, Literal

from unirl_core.algorithms.token_base import TokenAlgorithm, TokenAlgorithmConfig


class TokenGRPOConfig(TokenAlgorithmConfig):
    """GRPO on tokens: per-token PPO-clip ratios, each completion's token mean, the mean over completions."""

    name: Literal["token_grpo"] = "token_grpo"
    """GRPO on tokens (DeepSeekMath): per-token ratios, each completion's token mean, then the mean over completions."""


class TokenGRPO(TokenAlgorithm):
    config_class: ClassVar[type[TokenGRPOConfig]] = TokenGRPOConfig
