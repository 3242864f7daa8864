"""The autoregressive RL train stack: one RL step on a rollout of completions.

pi_old    log-probs at training geometry, no gradients, before the first update (with one update per rollout,
          the first forward's own values, detached: the first ratio is exactly 1)
pi_ref    the model with its LoRA adapter disabled, when `beta` > 0
rows      a NaN advantage marks a completion outside the step's batch (dynamic sampling's left-out groups): no token of
          it counts in the loss or its normalizer
updates   `num_updates_per_batch` disjoint mini-batches, each accumulated over micro-batches of
          `micro_batch_size` completions: the token algorithm's loss (unirl_core/algorithms/token_base.py),
          gradient clipping across shards, a finite check, one AdamW step
"""

from __future__ import annotations

import contextlib

import torch

from unirl_core.algorithms.registry import algorithm_class, build_algorithm
from unirl_core.algorithms.token_base import masked_mean
from unirl_core.worker.fsdp import gathered
from unirl_core.worker.optim import NonFiniteError, adamw, lr_factor, optimizer_step


class TokenStack:
    def __init__(self, policy, config, total_updates: int = 1, gather: bool = True):
        problems = list(algorithm_class(config.name).config_problems(config))
        if problems:
            raise ValueError("; ".join(f"train.algorithm.{path}: {bad!r}: {fix}" for path, bad, fix in problems))
        self.policy, self.config, self.gather = policy, config, gather
        self.algorithm = build_algorithm(config)
        self._summed: set[str] = set()  # metrics whose micro-batch values add up to an update's (train's summary)
        self.optimizer = adamw(policy.parameters(), config.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, total_updates, config.lr_schedule, config.warmup_steps)
        )

    def rollout_policy(self):
        return contextlib.nullcontext()

    def states(self) -> dict:
        return {}

    def _world(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_initialized() else 1

    def _batch_counts(self, samples: int, tokens: int) -> tuple[int, int]:
        """(completions, completion tokens) of this mini-batch over every rank."""
        import torch.distributed as dist

        if self._world() == 1:
            return samples, tokens
        counts = torch.tensor([samples, tokens], dtype=torch.float64, device=self.policy.device)
        dist.all_reduce(counts)
        return int(counts[0]), int(counts[1])

    @torch.no_grad()
    def _logp(self, completions, reference: bool = False) -> torch.Tensor:
        """[B, T] log-probs of every completion, micro-batch by micro-batch, no gradients."""
        with self.policy.reference() if reference else contextlib.nullcontext():
            return torch.cat([self.policy.token_logp(completions, micro) for micro in
                              torch.arange(len(completions.ids)).split(self.config.micro_batch_size)])  # fmt: skip

    def train(self, rollout, advantages_B: torch.Tensor, step: int) -> dict[str, float]:
        completions = rollout.completions
        advantages_B = advantages_B.to(self.policy.device, torch.float32)
        size, updates = len(completions.ids), self.config.num_updates_per_batch
        if size % updates:
            raise ValueError(f"{size} completions do not split into num_updates_per_batch={updates} mini-batches")
        rows = ~advantages_B.isnan()  # in the step's batch
        advantages_B = advantages_B.nan_to_num(0.0)
        mask = completions.mask.float() * rows[:, None]
        if self.config.drop_zero_advantage:
            mask = mask * (advantages_B != 0).float()[:, None]
        with gathered(self.policy.trainable, self.gather):
            logp_old = self._logp(completions) if updates > 1 else None
            logp_ref = self._logp(completions, reference=True) if self.config.beta > 0 else None
        metrics: dict[str, list[float]] = {}
        for mini in torch.arange(size).split(size // updates):
            self._update(rollout, mini, (mask, rows), advantages_B, logp_old, logp_ref, metrics, step)
        # token means (ratio, clip fraction, KL, entropy): each micro-batch's weighted by its share of the update's
        # tokens on every rank, so they add up to the update's mean (the same on any number of ranks); the
        # micro-batches' loss shares add up to each update's loss; the rest (grad norm, lr) once per update
        summary = {k: max(v) if k.endswith("_max") else sum(v) / (updates if k in self._summed else len(v))
                   for k, v in metrics.items()}  # fmt: skip
        lengths = completions.lengths[rows].float() if rows.any() else torch.zeros(1)  # a rank may keep none
        truncated = torch.tensor(completions.truncated, device=rows.device)[rows].float() if rows.any() else lengths
        return summary | {"response_length_mean": lengths.mean().item(), "response_length_max": lengths.max().item(),
                          "truncated_fraction": truncated.mean().item()}  # fmt: skip

    def _update(self, rollout, mini, masks, advantages_B, logp_old, logp_ref, metrics, step: int) -> None:
        """One optimizer step on the completions `mini` (`masks`: the token mask and the rows in the batch),
        accumulated over micro-batches."""
        completions, (mask, rows) = rollout.completions, masks
        self.optimizer.zero_grad(set_to_none=True)
        samples, tokens = self._batch_counts(int(rows[mini].sum()), int(mask[mini].sum()))
        normalizer = self.algorithm.normalizer(samples, tokens, self.policy.settings.max_new_tokens)
        normalizer /= self._world()  # FSDP2 averages the ranks' gradients
        with gathered(self.policy.trainable, self.gather):
            for micro in mini.split(self.config.micro_batch_size):
                logp, entropy = self.policy.token_logp(completions, micro, entropy=True)
                old = logp_old[micro] if logp_old is not None else logp.detach()
                ref = logp_ref[micro] if logp_ref is not None else None
                loss, info = self.algorithm.token_loss(logp, old, ref, advantages_B[micro], mask[micro], normalizer)
                if not torch.isfinite(loss):
                    ids = [rollout.samples[i].sample_id for i in micro.tolist()]
                    raise NonFiniteError(f"step {step}: non-finite loss for samples {ids}; optimizer step skipped")
                loss.backward()
                share = float(mask[micro].sum()) / max(tokens, 1) * self._world()  # of the update's token means
                means = {**info, "entropy": masked_mean(entropy, mask[micro])}
                for key, value in {**means, "loss": loss.detach()}.items():
                    weight = 1.0 if key.endswith("_max") or key == "loss" else share
                    metrics.setdefault(key, []).append(float(value) * weight)
                self._summed.update(k for k in (*means, "loss") if not k.endswith("_max"))
        optimizer_step(self.optimizer, self.scheduler, self.policy.parameters(), self.config.max_grad_norm, metrics,
                       step)  # fmt: skip
