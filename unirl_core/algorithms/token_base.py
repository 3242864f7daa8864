"""The token algorithms of the autoregressive domain: GRPO on tokens and its successors, one loss with named parts.

Per completion token t of sample i (mask m_it: 1 up to and including the completion's end):

    r_it  = exp(logp_it - logp_old_it)                                     importance: "token" (GRPO, DAPO, Dr. GRPO)
    r_it  = sg(s_i) exp(logp_it - sg(logp_it)),  s_i = exp(mean_t m (logp - logp_old))   "sequence" (GSPO-token:
            the value is the sequence ratio, the gradient that of the token's own log-prob times s_i)
    L_it  = -min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i) + beta KL_it
    KL_it = exp(ref - logp) - (ref - logp) - 1  (k3, GRPO's)  |  logp - ref  (k1)

aggregated over the batch (`loss_agg`, veRL's names):

    seq-mean-token-mean       mean_i (sum_t m L / sum_t m)              GRPO (DeepSeekMath), GSPO
    token-mean                sum_it m L / sum_it m                     DAPO (every token of the batch counts once)
    seq-mean-token-sum-norm   sum_it m L / (B x max_new_tokens)         Dr. GRPO (a constant normalizer)

The batch is the whole RL step's (every micro-batch, every rank): `token-mean` divides by the tokens of all ranks
(one all-reduce), so the update is the same on any number of ranks and micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, ClassVar, Literal

import torch
from pydantic import Field

from unirl_core.algorithms.base import Algorithm
from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.config.schema_base import Problem

LossAgg = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


DIFFUSION_ONLY = frozenset({
    "sde_type", "ode_solver", "exclude_last_step", "eta", "timestep_fraction", "step_rounding", "train_timesteps",
    "untrained_steps", "sde_window", "kl_form", "cfg_gradient", "tracker_buffer_size", "tracker_min_count",
})  # fmt: skip


class TokenAlgorithmConfig(AlgorithmConfig):
    """A token algorithm of the autoregressive domain (`train.domain.name: ar`). Advantages as TRL's GRPOTrainer
    computes them: the group's N - 1 std, eps 1e-4 (`std_mode`, `group_by`, `adv_clip` and `drop_zero_advantage` as
    for diffusion); the denoising keys (sde_type, eta, windows, ...) are refused."""

    unread_keys: ClassVar[frozenset[str]] = DIFFUSION_ONLY

    clip_range: Annotated[float, Field(gt=0)] = 0.2
    """PPO clip epsilon (the lower one, and the upper one unless `clip_range_high` is set)."""

    clip_range_high: Annotated[float, Field(gt=0)] | None = None
    """The upper clip epsilon (DAPO's clip-higher: 0.28); empty: `clip_range`."""

    loss_agg: LossAgg = "seq-mean-token-mean"
    """How token losses become the batch's loss (the module's table)."""

    importance: Literal["token", "sequence"] = "token"
    """Per-token ratios (`token`), or the sequence's length-normalized ratio on every token (`sequence`, GSPO)."""

    kl_estimator: Literal["k3", "k1"] = "k3"
    """The per-token KL estimate to the reference when `beta` > 0 (k3: GRPO's, unbiased and positive)."""

    beta: Annotated[float, Field(ge=0)] = 0.0
    """KL weight to the reference policy (the model with its LoRA adapter disabled); 0: no reference forward."""

    std_ddof: Annotated[int, Field(ge=0, le=1)] = 1
    """The group std's N - 1 (TRL's torch .std()); 0: the population std."""

    adv_eps: Annotated[float, Field(gt=0)] = 1e-4
    """Added to the std before dividing (TRL's 1e-4)."""

    learning_rate: Annotated[float, Field(gt=0)] = 1e-6
    """AdamW learning rate (TRL's GRPOConfig default; LoRA runs take ~1e-5)."""

    micro_batch_size: Annotated[int, Field(ge=1)] = 8
    """Completions per forward/backward inside a mini-batch (gradient accumulation)."""

    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (veRL's `filter_groups`): groups whose total rewards are all equal (population std 0)
    are left out, and more prompts are drawn and rolled out (`prompts_per_rollout` at a time) until
    `prompts_per_rollout` groups with differing rewards are kept; the step trains on the first that many."""

    max_gen_batches: Annotated[int, Field(ge=0)] = 10
    """Dynamic sampling: rollouts per step at most (veRL's `max_num_gen_batches`); a step that has not kept enough
    groups by then stops the run (the prompts are too hard or too easy for the policy). 0: no limit."""


class TokenAlgorithm(Algorithm):
    """A token algorithm: `token_loss` of a micro-batch; the stack (unirl_core/domains/ar/stack.py) runs the
    forwards, the old and reference log-probs and the optimizer."""

    config_class: ClassVar[type[AlgorithmConfig]] = TokenAlgorithmConfig
    domains: ClassVar[tuple[str, ...]] = ("ar",)

    @classmethod
    def config_problems(cls, config) -> Iterator[Problem]:
        yield from super().config_problems(config)
        for key in sorted(DIFFUSION_ONLY):  # set away from its default (a config sent to a worker sets every key)
            if getattr(config, key) != type(config).model_fields[key].default:
                yield key, getattr(config, key), "left out: a denoising setting, which token algorithms do not read"
        if config.std_mode == "per_prompt":
            yield "std_mode", config.std_mode, "group, batch or none (the token algorithms keep no per-prompt tracker)"

    def prepare(self, stack, rollout, plan, most):  # the AR stack computes pi_old and the reference itself
        raise NotImplementedError("token algorithms are driven by unirl_core.domains.ar.stack")

    def item_loss(self, stack, rollout, item, prepared, advantages_B, weights):
        raise NotImplementedError("token algorithms are driven by unirl_core.domains.ar.stack")

    def token_loss(self, logp: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, normalizer: float) -> tuple[torch.Tensor, dict]:  # fmt: skip
        """(the micro-batch's share of the batch loss, detached metrics). `logp`, `logp_old`, `logp_ref`, `mask`:
        [b, T]; `advantages`: [b]; `normalizer`: the batch's divisor for this `loss_agg` (`normalizer()`)."""
        config = self.config
        mask = mask.to(logp.dtype)
        log_ratio = logp - logp_old
        if config.importance == "sequence":
            sequence = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
            ratio = torch.exp(sequence.detach()[:, None] + logp - logp.detach())
            ratio_value = torch.exp(sequence)[:, None].expand_as(logp)
        else:
            ratio = ratio_value = torch.exp(log_ratio)
        low, high = config.clip_range, config.clip_range_high or config.clip_range
        adv = advantages[:, None]
        unclipped, clipped = ratio * adv, ratio.clamp(1 - low, 1 + high) * adv
        per_token = -torch.minimum(unclipped, clipped)
        metrics = {}
        if config.beta > 0:
            delta = logp_ref - logp
            kl = torch.exp(delta) - delta - 1 if config.kl_estimator == "k3" else -delta
            per_token = per_token + config.beta * kl
            metrics["kl"] = masked_mean(kl.detach(), mask)
        if config.loss_agg == "seq-mean-token-mean":
            loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / normalizer
        else:
            loss = (per_token * mask).sum() / normalizer
        with torch.no_grad():
            is_clipped = (clipped < unclipped).to(mask.dtype)  # the clipped term was taken
            metrics |= {"ratio_mean": masked_mean(ratio_value.detach(), mask),
                        "ratio_max": ratio_value.detach().masked_fill(mask == 0, 0.0).max(),
                        "clip_fraction": masked_mean(is_clipped, mask),
                        "approx_kl": masked_mean(0.5 * log_ratio.detach() ** 2, mask)}  # fmt: skip
        return loss, metrics

    def normalizer(self, samples: int, tokens: int, max_new_tokens: int) -> float:
        """The batch divisor of `loss_agg` from the whole batch's `samples` and completion `tokens`."""
        if self.config.loss_agg == "seq-mean-token-mean":
            return float(samples)
        if self.config.loss_agg == "token-mean":
            return float(max(tokens, 1))
        return float(samples * max_new_tokens)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)
