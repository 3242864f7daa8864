"""The image-diffusion train stacks. RL: the algorithm's `prepare` (pi_old frozen), then `num_updates_per_batch`
disjoint mini-batch updates, each a micro-batch accumulation loop over the algorithm's `item_loss`, gradient clipping,
a finite check and an optimizer step; what is computed belongs to the algorithm (`unirl_core.algorithms`), and the
stack never asks its name. Warm-up: supervised steps on the family's denoising loss.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from unirl_core.algorithms.registry import algorithm_class, build_algorithm
from unirl_core.worker.fsdp import gathered
from unirl_core.worker.optim import NonFiniteError, adamw, clip_gradients, lr_factor, optimizer_step

__all__ = ["NonFiniteError", "TrainStack", "WarmupStack", "build_stack"]


class TrainStack:
    """The RL train stack of one algorithm (`config`: its `train.algorithm` section; the algorithm object is built
    from it). `total_updates`: optimizer steps of the whole run (RL steps x num_updates_per_batch), for the LR
    schedule. The stack owns the optimizer, the batch geometry, the padding collectives and the update loop; the
    algorithm owns what is computed (`unirl_core.algorithms.base`)."""

    def __init__(self, family, config, total_updates: int = 1, gather: bool = True):
        problems = list(algorithm_class(config.name).config_problems(config))
        if problems:
            raise ValueError("; ".join(f"train.algorithm.{path}: {bad!r}: {fix}" for path, bad, fix in problems))
        self.family, self.config, self.gather = family, config, gather  # gather: fsdp.reshard_after_forward false
        self.algorithm = build_algorithm(config)
        self.step_sampling = family.step_sampling(config)  # its sampler and CFG gradient, for every transition
        self.optimizer = adamw(family.parameters(), config.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: lr_factor(step, total_updates, config.lr_schedule, config.warmup_steps),
        )
        self.algorithm.setup(self)

    def _micro_batches(self, indices: torch.Tensor) -> list[torch.Tensor]:
        return list(indices.split(self.config.micro_batch_size))

    def _mini_batches(self, batch_size: int) -> list[torch.Tensor]:
        updates = self.config.num_updates_per_batch
        if batch_size % updates:
            raise ValueError(f"{batch_size} samples do not split into num_updates_per_batch={updates} mini-batches")
        return list(torch.arange(batch_size).split(batch_size // updates))

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
    def forwards(minis: list) -> Iterator[tuple[torch.Tensor, list, int, int, torch.Tensor]]:
        """Every forward of `minis` (`_plan`'s mini-batches), in order: (micro-batch, its slots, slot j, stored
        step t, sample indices)."""
        for micro_batches in minis:
            for micro, slots in micro_batches:
                for j, slot in enumerate(slots):
                    for t, index in slot:
                        yield micro, slots, j, t, index

    @classmethod
    def _count(cls, minis: list) -> int:
        return sum(1 for _ in cls.forwards(minis))

    def _most(self, counts: list[int]) -> list[int]:
        """Each count's largest value over the ranks. FSDP2's forwards and backwards are collectives, run in the same
        order on every rank; with per-sample trained steps (`train_timesteps: random`, DiffusionNFT) ranks group their
        samples into different numbers of forwards, so each rank pads up to the busiest (`pad`). One all-reduce,
        before any forward of the call."""
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return counts
        most = torch.tensor(counts, device=self.family.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return [int(x) for x in most.tolist()]

    @staticmethod
    def pad(items: int, most: int, item) -> None:
        """Run `item` (a forward that keeps nothing, or a zero loss backpropagated) up to the busiest rank's count."""
        for _ in range(most - items):
            item()

    def prepare(self, rollout, plan=None, most: int | None = None):
        """The algorithm's `prepare` for this rollout (pi_old's log-probs, ...). `plan`, `most`: `train`'s
        (computed here if not)."""
        plan = plan or self._plan(rollout)
        most = self._most([self._count(plan)])[0] if most is None else most
        return self.algorithm.prepare(self, rollout, plan, most)

    def _weights(self, advantages_B: torch.Tensor, micro: torch.Tensor, grouped: bool) -> torch.Tensor | None:
        """Per-sample weights summing the micro-batch's terms to its mean (over kept samples with
        `drop_zero_advantage`); None: a plain mean (one group, nothing dropped)."""
        if not self.config.drop_zero_advantage:
            return torch.full_like(advantages_B, 1.0 / len(micro)) if grouped else None
        kept = (advantages_B != 0).float()
        return kept / kept[micro].sum().clamp(min=1.0)

    def train(self, rollout, advantages_B: torch.Tensor, step: int) -> dict[str, float]:
        """`advantages_B`: float32 [B], on any device (moved to the rollout's device: they meet in the loss)."""
        plan = self._plan(rollout)
        most = self._most([self._count(plan), *(self._count([minibatch]) for minibatch in plan)])
        prepared = self.prepare(rollout, plan, most[0])
        advantages_B = advantages_B.to(rollout.logp_TB.device, torch.float32)
        metrics: dict[str, list[float]] = {}
        for micro_batches, most_here in zip(plan, most[1:], strict=True):
            self._update(rollout, micro_batches, most_here, prepared, advantages_B, metrics, step)
        return self.algorithm.summarize(metrics, step)

    def _update(self, rollout, micro_batches, most: int, prepared, advantages_B, metrics, step: int) -> None:
        """One optimizer step: the mini-batch's forwards and backwards (padded to the busiest rank's `most`)."""
        self.optimizer.zero_grad(set_to_none=True)
        items, last = 0, None
        with gathered(self.family.trainable, self.gather):  # resharded before the optimizer step
            for micro, slots, j, t, index in self.forwards([micro_batches]):
                weights = self._weights(advantages_B, micro, any(len(slot) > 1 for slot in slots))
                loss, info = self.algorithm.item_loss(self, rollout, (j, t, index), prepared, advantages_B, weights)
                self._check_finite(loss, step, rollout, index)
                (loss / (len(slots) * len(micro_batches))).backward()
                for key, value in info.items():
                    metrics.setdefault(key, []).append(value.item())
                metrics.setdefault("loss", []).append(loss.item())
                items, last = items + 1, (j, t, index[:1])
            self.pad(items, most, lambda: (
                0 * self.algorithm.item_loss(self, rollout, last, prepared, advantages_B, None)[0]).backward())  # fmt: skip
        self._optimizer_step(metrics, step)

    def rollout_policy(self):
        """The weights rollouts sample from (the algorithm's: the trained ones, DiffusionNFT's old policy)."""
        return self.algorithm.rollout_policy()

    def states(self) -> dict:
        """Tensor states beyond the weights and optimizer that a checkpoint must keep (the algorithm's)."""
        return self.algorithm.states()

    def _optimizer_step(self, metrics: dict[str, list[float]], step: int) -> None:
        """Clip the accumulated gradients, refuse a non-finite norm, step the optimizer and the LR schedule."""
        optimizer_step(self.optimizer, self.scheduler, self.family.parameters(), self.config.max_grad_norm, metrics,
                       step)  # fmt: skip

    @staticmethod
    def _check_finite(loss, step, rollout, micro):
        if not torch.isfinite(loss):
            ids = [rollout.samples[i].sample_id for i in micro.tolist()]
            raise NonFiniteError(f"step {step}: non-finite loss for samples {ids}; optimizer step skipped")


def build_stack(family, config, total_updates: int = 1, gather: bool = True) -> TrainStack:
    """The RL train stack of the algorithm `config` names (`gather`: not `fsdp.reshard_after_forward`)."""
    return TrainStack(family, config, total_updates, gather)


class WarmupStack:
    """Supervised warm-up: one AdamW step per batch on the family's denoising loss (flow matching for SD3),
    accumulated over micro-batches of `warmup.micro_batch_size` samples, gradients clipped across shards; a constant
    learning rate."""

    def __init__(self, family, warmup, max_grad_norm: float, gather: bool = True):
        self.family, self.max_grad_norm, self.micro_batch_size = family, max_grad_norm, warmup.micro_batch_size
        self.gather = gather
        self.optimizer = adamw(family.parameters(), warmup.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)

    def states(self) -> dict:
        """No tensor states beyond the weights and optimizer."""
        return {}

    def train(self, latents: torch.Tensor, cond: dict, generators: list, step: int) -> dict[str, float]:
        """`generators`: one per sample, so the step is the same however the batch is split into micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        size = len(latents)
        total = 0.0
        with gathered(self.family.trainable, self.gather):  # resharded before the optimizer step
            for micro in torch.arange(size).split(self.micro_batch_size or size):
                part = {k: v[micro] for k, v in cond.items()}
                loss = self.family.denoising_loss(latents[micro], part, [generators[i] for i in micro.tolist()])
                if not torch.isfinite(loss):
                    raise NonFiniteError(f"warm-up step {step}: non-finite loss; optimizer step skipped")
                (loss * (len(micro) / size)).backward()  # the mean over the share, as one forward would give
                total += loss.item() * len(micro) / size
        grad_norm = clip_gradients(self.family.parameters(), self.max_grad_norm)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"warm-up step {step}: non-finite gradient norm; optimizer step skipped")
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        return {"loss": total, "grad_norm": grad_norm.item(), "lr": lr}
