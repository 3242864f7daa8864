"""The train stack: freeze pi_old, then `num_updates_per_batch` disjoint mini-batch updates, each a micro-batch
accumulation loop, gradient clipping, a finite check and an optimizer step.

`prepare` recomputes pi_old's log-probs under the current weights at exactly the micro-batch geometry used for
training, so the first update's ratio is exactly 1 (the rollout's own log-probs come from a different batch shape).
"""

from __future__ import annotations

import contextlib
import math

import torch

from unirl_core.algorithms.losses import (
    LIKELIHOOD_FREE,
    NEEDS_OLD_MEAN,
    SINGLE_UPDATE,
    gaussian_kl,
    nft_loss,
    nft_preference,
    policy_loss,
    prediction_mse,
)
from unirl_core.errors import UserError
from unirl_core.rollout.noise import sample_seed


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

    def _plan(self, rollout) -> list[list[tuple[torch.Tensor, list]]]:
        """Per mini-batch, its micro-batches as (sample indices, `_slots`): the forwards a train call runs."""
        trained = rollout.trained()
        return [
            [(micro, self._slots(trained, micro)) for micro in self._micro_batches(mini)]
            for mini in self._mini_batches(len(trained))
        ]

    @staticmethod
    def _count(minis: list) -> int:
        return sum(len(slot) for micro_batches in minis for _, slots in micro_batches for slot in slots)

    def _most(self, counts: list[int]) -> list[int]:
        """Each count's largest value over the ranks. FSDP2's forwards and backwards are collectives, run in the same
        order on every rank; with per-sample trained steps (`train_timesteps: random`, DiffusionNFT) ranks group their
        samples into different numbers of forwards, so each rank pads up to the busiest (`_pad`). One all-reduce,
        before any forward of the call."""
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return counts
        most = torch.tensor(counts, device=self.adapter.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return [int(x) for x in most.tolist()]

    @staticmethod
    def _pad(items: int, most: int, item) -> None:
        """Run `item` (a forward that keeps nothing, or a zero loss backpropagated) up to the busiest rank's count."""
        for _ in range(most - items):
            item()

    @torch.no_grad()
    def prepare(self, rollout, plan=None, most: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """pi_old's log-probs [T, B] of the trained transitions, recomputed at the training geometry, and its step
        means [T, B, ...] when the loss reads them (else None). `plan`, `most`: `train`'s (computed here if not)."""
        plan = plan or self._plan(rollout)
        most = self._most([self._count(plan)])[0] if most is None else most
        logp_old = torch.full_like(rollout.logp_TB, float("nan"))
        means = torch.empty_like(rollout.next_latents_TB) if self.algorithm.name in NEEDS_OLD_MEAN else None
        items, last = 0, None
        for micro_batches in plan:
            for _, slots in micro_batches:
                for slot in slots:
                    for t, index in slot:
                        cond = self.adapter.select(rollout.cond, index)
                        result = self._transition(rollout, t, index, cond)
                        logp_old[t, index] = result.log_prob
                        if means is not None:
                            means[t, index] = result.mean
                        items, last = items + 1, (t, index[:1])
        self._pad(items, most, lambda: self._transition(rollout, *last, self.adapter.select(rollout.cond, last[1])))
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

    def _item_loss(self, rollout, j, t, index, prepared, advantages_B, weights):
        """The loss of samples `index` at trained slot j, stored step `t` (their mean, or their `weights`' sum) and
        its metrics; `prepared`: what `prepare` returned."""
        logp_old, means_old = prepared
        cond = self.adapter.select(rollout.cond, index)
        result = self._transition(rollout, t, index, cond)
        mean_old = None if means_old is None else means_old[t, index]
        terms, info = policy_loss(self.algorithm, result, logp_old[t, index], mean_old, advantages_B[index])
        loss = terms.mean() if weights is None else (terms * weights[index]).sum()
        if self.algorithm.beta > 0:
            kl = self._kl(rollout, t, index, cond, result)
            kl = kl.mean() if weights is None else (kl * weights[index]).sum()
            loss = loss + self.algorithm.beta * kl
            info["kl"] = kl.detach()
        return loss, info

    def train(self, rollout, advantages_B: torch.Tensor, step: int) -> dict[str, float]:
        """`advantages_B`: float32 [B], on any device (moved to the rollout's device: they meet in the loss)."""
        plan = self._plan(rollout)
        most = self._most([self._count(plan), *(self._count([minibatch]) for minibatch in plan)])
        prepared = self.prepare(rollout, plan, most[0])
        advantages_B = advantages_B.to(rollout.logp_TB.device, torch.float32)
        metrics: dict[str, list[float]] = {}
        for micro_batches, most_here in zip(plan, most[1:], strict=True):
            self.optimizer.zero_grad(set_to_none=True)
            items, last = 0, None
            for micro, slots in micro_batches:
                weights = self._weights(advantages_B, micro, any(len(slot) > 1 for slot in slots))
                for j, slot in enumerate(slots):
                    for t, index in slot:
                        loss, info = self._item_loss(rollout, j, t, index, prepared, advantages_B, weights)
                        self._check_finite(loss, step, rollout, index)
                        (loss / (len(slots) * len(micro_batches))).backward()
                        for key, value in info.items():
                            metrics.setdefault(key, []).append(value.item())
                        metrics.setdefault("loss", []).append(loss.item())
                        items, last = items + 1, (j, t, index[:1])
            self._pad(items, most_here, lambda last=last: (
                0 * self._item_loss(rollout, *last, prepared, advantages_B, None)[0]).backward())  # fmt: skip
            self._optimizer_step(metrics, step)
        return self._summary(metrics, step)

    def _summary(self, metrics: dict[str, list[float]], step: int) -> dict[str, float]:
        """The step's metrics: means, the ratio's extremes."""
        summary = {k: sum(v) / len(v) for k, v in metrics.items()}
        summary["ratio_min"] = min(metrics["ratio_min"])
        summary["ratio_max"] = max(metrics["ratio_max"])
        return summary

    def rollout_policy(self):
        """The weights rollouts sample from: the trained ones (on-policy up to the last update)."""
        return contextlib.nullcontext()

    def states(self) -> dict:
        """Tensor states beyond the weights and optimizer that a checkpoint must keep (none here)."""
        return {}

    def _optimizer_step(self, metrics: dict[str, list[float]], step: int) -> None:
        """Clip the accumulated gradients, refuse a non-finite norm, step the optimizer and the LR schedule."""
        grad_norm = clip_gradients(self.adapter.parameters(), self.algorithm.max_grad_norm)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"step {step}: non-finite gradient norm; optimizer step skipped")
        metrics.setdefault("lr", []).append(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        metrics.setdefault("grad_norm", []).append(grad_norm.item())

    @staticmethod
    def _check_finite(loss, step, rollout, micro):
        if not torch.isfinite(loss):
            ids = [rollout.samples[i].sample_id for i in micro.tolist()]
            raise NonFiniteError(f"step {step}: non-finite loss for samples {ids}; optimizer step skipped")


def old_policy_decay(algorithm, updates: int) -> float:
    """DiffusionNFT's old-policy decay after `updates` optimizer steps: 0 before `old_decay_start`, then
    min(old_decay_rate (updates - old_decay_start), old_decay_max) (the reference's `return_decay`)."""
    if updates < algorithm.old_decay_start:
        return 0.0
    return min(algorithm.old_decay_rate * (updates - algorithm.old_decay_start), algorithm.old_decay_max)


class NFTStack(TrainStack):
    """DiffusionNFT (arXiv 2509.16117): rollouts come from an old policy, a lagging average of the trained weights
    (`rollout_policy`, kept in checkpoints as `nft_old`); each sample trains J grid steps of its rollout's schedule,
    at x_t = the family's `noised(final latent, fresh noise, step)`, on `nft_loss` with r from its advantage, plus
    `beta` x the prediction MSE to the base model (LoRA disabled). After the step's updates the old policy moves:
    old <- d old + (1 - d) new (`old_policy_decay`). The fresh noise of (sample, slot) derives from (rollout seed,
    sample id) only, so any number of ranks and micro-batches train the same."""

    def __init__(self, adapter, algorithm, total_updates: int = 1):
        from unirl_core.train.ema import EMA

        super().__init__(adapter, algorithm, total_updates)
        self.old = EMA(adapter.parameters(), decay=0.0)

    def rollout_policy(self):
        return self.old.applied()

    def states(self) -> dict:
        return {"nft_old": self.old}

    def _fresh_noise(self, rollout) -> torch.Tensor:
        """[J, B, ...] float32: the noise each sample's trained slot j is noised with."""
        x0, slots = rollout.final_latents, rollout.trained().shape[1]
        noises = []
        for sample in rollout.samples:
            generator = torch.Generator().manual_seed(sample_seed(rollout.seed, f"nft:{sample.sample_id}"))
            noises.append(torch.randn((slots, *x0.shape[1:]), generator=generator))
        return torch.stack(noises, dim=1).to(x0.device)

    def _predict(self, rollout, x_t, t: int, index: torch.Tensor):
        """The deterministic step of samples `index` from x_t at stored step t: its x0 and model output."""
        cond = self.adapter.select(rollout.cond, index)
        return self.adapter.transition(x_t, rollout.steps[t], 0.0, cond, rollout.schedule)

    @torch.no_grad()
    def prepare(self, rollout, plan=None, most: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The noised latents x_t [J, B, ...] of every trained (slot, sample) and the old policy's x0 predictions
        there [J, B, ...]."""
        plan = plan or self._plan(rollout)
        most = self._most([self._count(plan)])[0] if most is None else most
        noise, x0 = self._fresh_noise(rollout), rollout.final_latents
        noisy, x0_old = torch.empty_like(noise), torch.empty_like(noise)
        items, last = 0, None
        with self.old.applied():
            for micro_batches in plan:
                for _, slots in micro_batches:
                    for j, slot in enumerate(slots):
                        for t, index in slot:
                            noisy[j, index] = self.adapter.noised(
                                x0[index], noise[j, index], rollout.steps[t], rollout.schedule
                            ).float()  # fmt: skip
                            x0_old[j, index] = self._predict(rollout, noisy[j, index], t, index).x0
                            items, last = items + 1, (j, t, index[:1])
            self._pad(items, most, lambda: self._predict(rollout, noisy[last[0], last[2]], *last[1:]))
        return noisy, x0_old

    def _item_loss(self, rollout, j, t, index, prepared, advantages_B, weights):
        noisy, x0_old = prepared
        algorithm = self.algorithm
        result = self._predict(rollout, noisy[j, index], t, index)
        r = nft_preference(advantages_B[index], algorithm.adv_clip)
        terms, info = nft_loss(
            result.x0, x0_old[j, index], rollout.final_latents[index], r, algorithm.nft_beta, algorithm.adv_clip
        )  # fmt: skip
        loss = terms.mean() if weights is None else (terms * weights[index]).sum()
        if algorithm.beta > 0:
            with torch.no_grad(), self.adapter.reference():
                base = self._predict(rollout, noisy[j, index], t, index)
            kl = prediction_mse(result.prediction, base.prediction)
            kl = kl.mean() if weights is None else (kl * weights[index]).sum()
            loss = loss + algorithm.beta * kl
            info["kl"] = kl.detach()
        return loss, info

    def _summary(self, metrics: dict[str, list[float]], step: int) -> dict[str, float]:
        """The step's metric means; then the old policy follows the trained one (`old_policy_decay`)."""
        decay = old_policy_decay(self.algorithm, (step + 1) * self.algorithm.num_updates_per_batch)
        self.old.update(step, decay)
        return {k: sum(v) / len(v) for k, v in metrics.items()} | {"old_decay": decay}


def build_stack(adapter, algorithm, total_updates: int = 1) -> TrainStack:
    """The RL train stack of `algorithm`: the likelihood-free one (DiffusionNFT) or the policy-gradient one."""
    stack = NFTStack if algorithm.name in LIKELIHOOD_FREE else TrainStack
    return stack(adapter, algorithm, total_updates)


class WarmupStack:
    """Supervised warm-up: one AdamW step per batch on the family's denoising loss (flow matching for SD3),
    accumulated over micro-batches of `warmup.micro_batch_size` samples, gradients clipped across shards; a constant
    learning rate."""

    def __init__(self, adapter, warmup, max_grad_norm: float):
        self.adapter, self.max_grad_norm, self.micro_batch_size = adapter, max_grad_norm, warmup.micro_batch_size
        self.optimizer = adamw(adapter.parameters(), warmup.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)

    def states(self) -> dict:
        """No tensor states beyond the weights and optimizer."""
        return {}

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
