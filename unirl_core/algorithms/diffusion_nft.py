"""DiffusionNFT (arXiv 2509.16117; NVlabs/DiffusionNFT `train_nft_sd3.py`, config/nft.py + base.py for SD3.5-M):
likelihood-free. Rollouts come from an old policy, a lagging average of the trained weights (`rollout_policy`, kept
in checkpoints as `nft_old`), sampled with the ODE (no log-probs, any sampler); each sample trains J grid steps of
its rollout's schedule, at x_t = the family's `noised(final latent, fresh noise, step)`, on `losses.nft_loss` with r
from its advantage, plus `beta` x the prediction MSE to the base model (LoRA disabled). After the step's updates the
old policy moves: old <- d old + (1 - d) new (`old_policy_decay`). The fresh noise of (sample, slot) derives from
(rollout seed, sample id) only, so any number of ranks and micro-batches train the same.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field

from unirl_core.algorithms.base import Algorithm, reduce_terms
from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.algorithms.losses import nft_loss, nft_preference, prediction_mse
from unirl_core.config.schema_base import Count
from unirl_core.data.noise import sample_seed


class DiffusionNFTConfig(AlgorithmConfig):
    name: Literal["diffusion_nft"] = "diffusion_nft"
    """DiffusionNFT's reward-weighted flow-matching loss on fresh noisings of deterministic (ODE) rollouts of a
    lagging old policy (`nft_beta`, `old_decay_*`); no log-probs, any sampler; `beta` is its velocity MSE to the
    base."""

    nft_beta: Annotated[float, Field(gt=0)] = 1.0
    """The implicit policies' strength beta, v+ = beta v + (1 - beta) v_old and v- = (1 + beta) v_old - beta v (the
    reference's `config.beta`: 1.0; 0.1 for its OCR and multi-reward runs)."""

    old_decay_rate: Annotated[float, Field(ge=0)] = 0.001
    """The old (rollout) policy follows the trained one after every RL step, old <- d old + (1 - d) new,
    d = min(old_decay_rate (n - old_decay_start), old_decay_max) after n optimizer steps (0 before
    `old_decay_start`). The reference's decay_type 1: 0.001, 0, 0.5; decay_type 2 (OCR): 0.0075, 75, 0.999."""

    old_decay_start: Annotated[Count, Field(ge=0)] = 0
    """Optimizer steps before the old policy starts to lag (it equals the trained one until then)."""

    old_decay_max: Annotated[float, Field(ge=0, lt=1)] = 0.5
    """The old policy's largest decay."""

    group_by: Literal["position", "prompt"] = "prompt"
    """DiffusionNFT: advantages by prompt text."""

    std_mode: Literal["group", "batch", "per_prompt"] = "batch"
    """DiffusionNFT: one batch-wide std."""

    timestep_fraction: Annotated[float, Field(gt=0, le=1)] = 0.99
    """DiffusionNFT: int(0.99 n) grid timesteps per sample."""

    step_rounding: Literal["round", "floor"] = "floor"
    """DiffusionNFT: int(n x timestep_fraction)."""

    train_timesteps: Literal["first", "random"] = "random"
    """DiffusionNFT: the timesteps drawn at random per sample."""

    beta: Annotated[float, Field(ge=0)] = 1e-4
    """DiffusionNFT: the velocity MSE to the base model, weight 1e-4."""

    ode_solver: Literal["euler", "dpm2m"] = "dpm2m"
    """DiffusionNFT's rollouts run DPM-Solver++ 2M (config/nft.py: sample.solver "dpm2")."""


def old_policy_decay(config: DiffusionNFTConfig, updates: int) -> float:
    """DiffusionNFT's old-policy decay after `updates` optimizer steps: 0 before `old_decay_start`, then
    min(old_decay_rate (updates - old_decay_start), old_decay_max) (the reference's `return_decay`)."""
    if updates < config.old_decay_start:
        return 0.0
    return min(config.old_decay_rate * (updates - config.old_decay_start), config.old_decay_max)


def _predict(stack, rollout, x_t, t: int, index: torch.Tensor):
    """The deterministic step of samples `index` from x_t at stored step t: its x0 and model output."""
    cond = stack.family.select(rollout.cond, index)
    return stack.family.transition(x_t, rollout.steps[t], 0.0, cond, rollout.schedule, sampling=stack.step_sampling)


class DiffusionNFT(Algorithm):
    config_class = DiffusionNFTConfig
    likelihood_free = True

    def setup(self, stack) -> None:
        from unirl_core.worker.ema import EMA

        self.old = EMA(stack.family.parameters(), decay=0.0)

    def rollout_policy(self):
        return self.old.applied()

    def states(self) -> dict:
        return {"nft_old": self.old}

    @staticmethod
    def _fresh_noise(rollout) -> torch.Tensor:
        """[J, B, ...] float32: the noise each sample's trained slot j is noised with."""
        x0, slots = rollout.final_latents, rollout.trained().shape[1]
        noises = []
        for sample in rollout.samples:
            generator = torch.Generator().manual_seed(sample_seed(rollout.seed, f"nft:{sample.sample_id}"))
            noises.append(torch.randn((slots, *x0.shape[1:]), generator=generator))
        return torch.stack(noises, dim=1).to(x0.device)

    @torch.no_grad()
    def prepare(self, stack, rollout, plan, most: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The noised latents x_t [J, B, ...] of every trained (slot, sample) and the old policy's x0 predictions
        there [J, B, ...]."""
        noise, x0 = self._fresh_noise(rollout), rollout.final_latents
        noisy, x0_old = torch.empty_like(noise), torch.empty_like(noise)
        items, last = 0, None
        with self.old.applied():
            for _, _, j, t, index in stack.forwards(plan):
                noisy[j, index] = stack.family.noised(
                    x0[index], noise[j, index], rollout.steps[t], rollout.schedule
                ).float()
                x0_old[j, index] = _predict(stack, rollout, noisy[j, index], t, index).x0
                items, last = items + 1, (j, t, index[:1])
            stack.pad(items, most, lambda: _predict(stack, rollout, noisy[last[0], last[2]], *last[1:]))
        return noisy, x0_old

    def item_loss(self, stack, rollout, item, prepared, advantages_B, weights):
        j, t, index = item
        noisy, x0_old = prepared
        config = self.config
        result = _predict(stack, rollout, noisy[j, index], t, index)
        r = nft_preference(advantages_B[index], config.adv_clip)
        terms, info = nft_loss(
            result.x0, x0_old[j, index], rollout.final_latents[index], r, config.nft_beta, config.adv_clip
        )  # fmt: skip
        loss = reduce_terms(terms, weights, index)
        if config.beta > 0:
            with torch.no_grad(), stack.family.reference():
                base = _predict(stack, rollout, noisy[j, index], t, index)
            kl = reduce_terms(prediction_mse(result.prediction, base.prediction), weights, index)
            loss = loss + config.beta * kl
            info["kl"] = kl.detach()
        return loss, info

    def summarize(self, metrics: dict[str, list[float]], step: int) -> dict[str, float]:
        """The step's metric means; then the old policy follows the trained one (`old_policy_decay`)."""
        decay = old_policy_decay(self.config, (step + 1) * self.config.num_updates_per_batch)
        self.old.update(step, decay)
        return super().summarize(metrics, step) | {"old_decay": decay}
