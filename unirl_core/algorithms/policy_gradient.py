"""The hooks of the algorithms trained on a rollout's stored stochastic transitions (Flow-GRPO, DDPO and their
successors): `prepare` recomputes pi_old's log-probs under the current weights at exactly the micro-batch geometry
used for training, so the first update's ratio is exactly 1 (the rollout's own log-probs come from a different batch
shape); `item_loss` re-evaluates a stored transition under the current weights and hands it to the subclass's
`policy_loss`, plus `beta` x the step KL to the reference policy (the model with its LoRA disabled).
"""

from __future__ import annotations

import torch

from unirl_core.algorithms.base import Algorithm, reduce_terms
from unirl_core.algorithms.losses import gaussian_kl


def transition(stack, rollout, t: int, index: torch.Tensor, cond: dict):
    """The stored transition `t` of samples `index`, re-evaluated by the family under the current weights."""
    return stack.family.transition(
        rollout.latents_TB[t, index], rollout.steps[t], stack.config.eta, cond, rollout.schedule,
        prev_sample=rollout.next_latents_TB[t, index], sampling=stack.step_sampling,
    )  # fmt: skip


class PolicyGradient(Algorithm):
    """Base of the likelihood algorithms: subclasses give `policy_loss` (the per-sample terms [B] of one trained
    step) and may read pi_old's step means (`needs_old_means`)."""

    def policy_loss(self, result, logp_old_B, mean_old, advantages_B):
        """(terms [B], detached metrics) of one trained step: `result` the step under the current weights
        (`StepResult`), `mean_old` pi_old's step means when `needs_old_means` (else None)."""
        raise NotImplementedError

    @torch.no_grad()
    def prepare(self, stack, rollout, plan, most: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """pi_old's log-probs [T, B] of the trained transitions, and its step means [T, B, ...] when the loss reads
        them (else None)."""
        family = stack.family
        logp_old = torch.full_like(rollout.logp_TB, float("nan"))
        means = torch.empty_like(rollout.next_latents_TB) if self.needs_old_means else None
        items, last = 0, None
        for _, _, _, t, index in stack.forwards(plan):
            result = transition(stack, rollout, t, index, family.select(rollout.cond, index))
            logp_old[t, index] = result.log_prob
            if means is not None:
                means[t, index] = result.mean
            items, last = items + 1, (t, index[:1])
        stack.pad(items, most, lambda: transition(stack, rollout, *last, family.select(rollout.cond, last[1])))
        return logp_old, means

    def _kl(self, stack, rollout, t, index, cond, result) -> torch.Tensor:
        """The per-sample KL [b] of the step to the reference policy (`kl_form`)."""
        with torch.no_grad(), stack.family.reference():
            reference = transition(stack, rollout, t, index, cond)
        kl = gaussian_kl(result.mean, reference.mean, result.std)
        if self.config.kl_form == "flow_grpo" and result.dt is not None:
            kl = kl * abs(result.dt)  # flow_grpo divides by std_t^2, not (std_t^2 |dt|)
        return kl

    def item_loss(self, stack, rollout, item, prepared, advantages_B, weights):
        _, t, index = item
        logp_old, means_old = prepared
        cond = stack.family.select(rollout.cond, index)
        result = transition(stack, rollout, t, index, cond)
        mean_old = None if means_old is None else means_old[t, index]
        terms, info = self.policy_loss(result, logp_old[t, index], mean_old, advantages_B[index])
        loss = reduce_terms(terms, weights, index)
        if self.config.beta > 0:
            kl = reduce_terms(self._kl(stack, rollout, t, index, cond, result), weights, index)
            loss = loss + self.config.beta * kl
            info["kl"] = kl.detach()
        return loss, info

    def summarize(self, metrics: dict[str, list[float]], step: int) -> dict[str, float]:
        """The step's metric means, the ratio's extremes over every forward (none when its window was empty)."""
        summary = super().summarize(metrics, step)
        if "ratio_min" in metrics:
            summary["ratio_min"] = min(metrics["ratio_min"])
            summary["ratio_max"] = max(metrics["ratio_max"])
        return summary
