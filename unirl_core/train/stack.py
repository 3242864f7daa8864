"""The train stack: freeze pi_old, then `num_updates_per_batch` disjoint mini-batch updates, each a micro-batch
accumulation loop, gradient clipping, a finite check and an optimizer step.

`prepare` recomputes pi_old's log-probs under the current weights at exactly the micro-batch geometry used for
training, so the first update's ratio is exactly 1 (the rollout's own log-probs come from a different batch shape).
"""

from __future__ import annotations

import math

import torch

from unirl_core.algorithms.losses import NEEDS_OLD_MEAN, SINGLE_UPDATE, gaussian_kl, policy_loss
from unirl_core.errors import UserError


class NonFiniteError(UserError, RuntimeError):
    """A non-finite loss or gradient: the optimizer step is skipped and the run stops, naming step and samples."""


def lr_factor(step: int, total: int, schedule: str, warmup: int) -> float:
    """Multiplier of the base learning rate at optimizer step `step` of `total` (linear warm-up, then the schedule)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """Clip by the global norm, across shards when the parameters are FSDP2 DTensors (every rank gets the same)."""
    from unirl_core.train.fsdp import full_value

    return full_value(torch.nn.utils.clip_grad_norm_(parameters, max_norm))


def adamw(parameters: list[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    """AdamW (no weight decay) over float32 master weights; its state takes their dtype. A bf16 weight has 8
    significant bits: an update below ~1/256 of the weight (lr 1e-5 on a weight of 0.01) would round away."""
    low = sorted({str(p.dtype) for p in parameters if p.dtype != torch.float32})
    if low:
        raise ValueError(f"trained parameters in {low}: the optimizer needs float32 master weights (fsdp.parallelize)")
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)


class TrainStack:
    """`total_updates`: optimizer steps of the whole run (RL steps x num_updates_per_batch), for the LR schedule."""

    def __init__(self, adapter, algorithm, total_updates: int = 1):
        if algorithm.name in SINGLE_UPDATE and algorithm.num_updates_per_batch > 1:
            raise ValueError(
                f"algorithm {algorithm.name!r} cannot take num_updates_per_batch={algorithm.num_updates_per_batch} "
                "updates per rollout (it has no importance ratio); set it to 1 or use grpo"
            )
        self.adapter, self.algorithm = adapter, algorithm
        adapter.use_algorithm(algorithm)
        self.optimizer = adamw(adapter.parameters(), algorithm.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: lr_factor(step, total_updates, algorithm.lr_schedule, algorithm.warmup_steps),
        )

    def _micro_batches(self, indices: torch.Tensor) -> list[torch.Tensor]:
        return list(indices.split(self.algorithm.micro_batch_size))

    def _mini_batches(self, batch_size: int) -> list[torch.Tensor]:
        updates = self.algorithm.num_updates_per_batch
        if batch_size % updates:
            raise ValueError(f"{batch_size} samples do not split into num_updates_per_batch={updates} mini-batches")
        return list(torch.arange(batch_size).split(batch_size // updates))

    def _transition(self, rollout, t: int, index: torch.Tensor, cond: dict):
        return self.adapter.transition(
            rollout.latents_TB[t, index], rollout.steps[t], self.algorithm.eta, cond, rollout.schedule,
            prev_sample=rollout.next_latents_TB[t, index],
        )  # fmt: skip

    @staticmethod
    def _slots(trained_BJ: torch.Tensor, micro: torch.Tensor) -> list[list[tuple[int, torch.Tensor]]]:
        """Per trained slot j: the micro-batch's samples grouped by the stored step they train there, as
        [(position in rollout.steps, sample indices)]; one group per slot when every sample trains the same steps."""
        slots = []
        for column in trained_BJ[micro].T:
            slots.append([(int(t), micro[column == t]) for t in column.unique().tolist()])
        return slots

    @torch.no_grad()
    def prepare(self, rollout) -> tuple[torch.Tensor, torch.Tensor | None]:
        """pi_old's log-probs [T, B] of the trained transitions, recomputed at the training geometry, and its step
        means [T, B, ...] when the loss reads them (else None)."""
        logp_old = torch.full_like(rollout.logp_TB, float("nan"))
        means = torch.empty_like(rollout.next_latents_TB) if self.algorithm.name in NEEDS_OLD_MEAN else None
        trained = rollout.trained()
        for mini in self._mini_batches(rollout.logp_TB.shape[1]):
            for micro in self._micro_batches(mini):
                for slot in self._slots(trained, micro):
                    for t, index in slot:
                        cond = self.adapter.select(rollout.cond, index)
                        result = self._transition(rollout, t, index, cond)
                        logp_old[t, index] = result.log_prob
                        if means is not None:
                            means[t, index] = result.mean
        return logp_old, means

    def _weights(self, advantages_B: torch.Tensor, micro: torch.Tensor, grouped: bool) -> torch.Tensor | None:
        """Per-sample weights summing the micro-batch's terms to its mean (over kept samples with
        `drop_zero_advantage`); None: a plain mean (one group, nothing dropped)."""
        if not self.algorithm.drop_zero_advantage:
            return torch.full_like(advantages_B, 1.0 / len(micro)) if grouped else None
        kept = (advantages_B != 0).float()
        return kept / kept[micro].sum().clamp(min=1.0)

    def _kl(self, rollout, t, index, cond, result) -> torch.Tensor:
        """The per-sample KL [b] of the step to the reference policy (`kl_form`)."""
        with torch.no_grad(), self.adapter.reference():
            reference = self._transition(rollout, t, index, cond)
        kl = gaussian_kl(result.mean, reference.mean, result.std)
        if self.algorithm.kl_form == "flow_grpo" and result.dt is not None:
            kl = kl * abs(result.dt)  # flow_grpo divides by std_t^2, not (std_t^2 |dt|)
        return kl

    def train(self, rollout, advantages_B: torch.Tensor, step: int) -> dict[str, float]:
        """`advantages_B`: float32 [B], on any device (moved to the log-probs' device: they meet in the loss)."""
        logp_old, means_old = self.prepare(rollout)
        advantages_B = advantages_B.to(logp_old.device, torch.float32)
        trained = rollout.trained()
        metrics: dict[str, list[float]] = {}
        for mini in self._mini_batches(advantages_B.shape[0]):
            self.optimizer.zero_grad(set_to_none=True)
            micro_batches = self._micro_batches(mini)
            for micro in micro_batches:
                slots = self._slots(trained, micro)
                weights = self._weights(advantages_B, micro, any(len(slot) > 1 for slot in slots))
                for slot in slots:
                    for t, index in slot:
                        cond = self.adapter.select(rollout.cond, index)
                        result = self._transition(rollout, t, index, cond)
                        mean_old = None if means_old is None else means_old[t, index]
                        terms, info = policy_loss(
                            self.algorithm, result, logp_old[t, index], mean_old, advantages_B[index]
                        )
                        loss = terms.mean() if weights is None else (terms * weights[index]).sum()
                        if self.algorithm.beta > 0:
                            kl = self._kl(rollout, t, index, cond, result)
                            kl = kl.mean() if weights is None else (kl * weights[index]).sum()
                            loss = loss + self.algorithm.beta * kl
                            info["kl"] = kl.detach()
                        self._check_finite(loss, step, rollout, index)
                        (loss / (len(slots) * len(micro_batches))).backward()
                        for key, value in info.items():
                            metrics.setdefault(key, []).append(value.item())
                        metrics.setdefault("loss", []).append(loss.item())
            grad_norm = clip_gradients(self.adapter.parameters(), self.algorithm.max_grad_norm)
            if not torch.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(f"step {step}: non-finite gradient norm; optimizer step skipped")
            metrics.setdefault("lr", []).append(self.optimizer.param_groups[0]["lr"])
            self.optimizer.step()
            self.scheduler.step()
            metrics.setdefault("grad_norm", []).append(grad_norm.item())
        summary = {k: sum(v) / len(v) for k, v in metrics.items()}
        summary["ratio_min"] = min(metrics["ratio_min"])
        summary["ratio_max"] = max(metrics["ratio_max"])
        return summary

    @staticmethod
    def _check_finite(loss, step, rollout, micro):
        if not torch.isfinite(loss):
            ids = [rollout.samples[i].sample_id for i in micro.tolist()]
            raise NonFiniteError(f"step {step}: non-finite loss for samples {ids}; optimizer step skipped")


class WarmupStack:
    """Supervised warm-up: one AdamW step per batch on the family's denoising loss (flow matching for SD3),
    accumulated over micro-batches of `warmup.micro_batch_size` samples, gradients clipped across shards; a constant
    learning rate."""

    def __init__(self, adapter, warmup, max_grad_norm: float):
        self.adapter, self.max_grad_norm, self.micro_batch_size = adapter, max_grad_norm, warmup.micro_batch_size
        self.optimizer = adamw(adapter.parameters(), warmup.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)

    def train(self, latents: torch.Tensor, cond: dict, generators: list, step: int) -> dict[str, float]:
        """`generators`: one per sample, so the step is the same however the batch is split into micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        size = len(latents)
        total = 0.0
        for micro in torch.arange(size).split(self.micro_batch_size or size):
            part = {k: v[micro] for k, v in cond.items()}
            loss = self.adapter.denoising_loss(latents[micro], part, [generators[i] for i in micro.tolist()])
            if not torch.isfinite(loss):
                raise NonFiniteError(f"warm-up step {step}: non-finite loss; optimizer step skipped")
            (loss * (len(micro) / size)).backward()  # the mean over the share, as one forward would give
            total += loss.item() * len(micro) / size
        grad_norm = clip_gradients(self.adapter.parameters(), self.max_grad_norm)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"warm-up step {step}: non-finite gradient norm; optimizer step skipped")
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        return {"loss": total, "grad_norm": grad_norm.item(), "lr": lr}
