"""One data-parallel rank of a training round: the domain's policy (`unirl_core.domains`: for image diffusion the
model family) with its FSDP2-sharded trained module, the reward service and the domain's train stack, driven by the
controller (`unirl_core.controller`) one call at a time, as a Ray actor or in the controller's own process
(`--local`). What is generated, trained and exported is the domain's; this file never asks which domain it is.

Rollouts use the trained module itself (colocated: no weight sync). Every rank receives an equal share of whole
GRPO groups, so every rank runs the same number of forward passes (FSDP's collectives need that).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from unirl_core.distributed.rank import TorchWorker


def rl_stack(worker, config, served):
    """RL: the reward service (colocated models, or the dedicated actors in `served`) and the domain's RL stack."""
    from unirl_core.rewards.service import RewardService

    worker.rewards = RewardService.from_config(config.reward, device=str(worker.device), served=served)
    return worker.domain.rl_stack(worker.policy)


def warmup_stack(worker, config, served):
    return worker.domain.warmup_stack(worker.policy)


STACKS = {"rl": rl_stack, "warmup": warmup_stack}  # the train stack of each round strategy's stage


class TrainWorker(TorchWorker):
    def build(self, config_json: str, stage: str, served: dict | None = None) -> dict[str, int]:
        """Build the domain's policy, shard it, and the stack of `stage` (`STACKS`: rl or warmup); returns how much
        of the trained module this rank holds. `served`: model rewards scored by the dedicated reward actors, by
        name."""
        from unirl_core.config.schema import TrainConfig
        from unirl_core.models.logs import quiet_model_libraries

        quiet_model_libraries()
        from unirl_core.domains.registry import domain_class
        from unirl_core.worker.determinism import apply_determinism
        from unirl_core.worker.ema import EMA
        from unirl_core.worker.fsdp import local_fraction, parallelize

        self.config = config = TrainConfig.model_validate_json(config_json)
        self.stage = stage
        apply_determinism(config.deterministic)  # before the first cuBLAS call
        torch.set_num_threads(max(1, int(config.ray.cpus_per_worker)))
        self.device = self.device_for(config.ray.gpus_per_worker)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
            from unirl_core.errors import UserError

            raise UserError(
                f"train.ray.backend: nccl cannot reduce this worker's CPU tensors (train.ray.gpus_per_worker: "
                f"{config.ray.gpus_per_worker}); set it to auto or gloo, or give each worker a GPU"
            )
        torch.manual_seed(config.sampling.seed)  # identical initial (LoRA) weights on every rank before sharding
        self.domain = domain_class(config.domain.name)(config, self.device)
        self.policy = policy = self.domain.build_policy()
        parallelize(policy.trainable, policy.blocks(), self.device, config.fsdp, policy.dtype)
        self.stack = STACKS[stage](self, config, served)
        self.ema = EMA(policy.parameters(), config.ema.decay, config.ema.interval) if config.ema else None
        self._rollout = None
        return local_fraction(policy.trainable)

    # --- RL ---------------------------------------------------------------------------------------------------

    def rollout(self, samples: list, step: int, want_outputs: list[str] = (), extend: bool = False) -> dict[str, Any]:
        """Roll out this rank's samples with the stack's rollout policy (the current weights; DiffusionNFT's old
        policy) and score their outputs; the rollout stays here for `train` (`extend`: after the step's earlier
        ones, dynamic sampling's). Returns the reward components (lists in sample order) and the outputs of the
        samples whose ids are in `want_outputs` (the sample grid's: {sample id: output})."""
        started = time.perf_counter()
        with self.stack.rollout_policy(), self.gathered():  # gathered inside: the rollout policy's weights
            rollout = self.domain.rollout(self.policy, self.stack, samples, step)
        self._rollout = self._rollout.extend(rollout) if extend else rollout
        rolled = time.perf_counter()
        outputs = rollout.outputs
        scores = self.rewards.score(
            outputs,
            [s.example.prompt for s in samples],
            [s.sample_id for s in samples],
            [s.example.metadata for s in samples],
        )
        for name, values in getattr(rollout, "reward_terms", {}).items():  # the domain's own terms, weight 1
            scores[name] = np.asarray(values, dtype=np.float64)
            scores["total"] = scores["total"] + scores[name]
        wanted = set(want_outputs)
        return {
            "rewards": {k: [float(x) for x in v] for k, v in scores.items()},
            "outputs": {
                s.sample_id: output for s, output in zip(samples, outputs, strict=True) if s.sample_id in wanted
            },
            "seconds_rollout": rolled - started,
            "seconds_reward": time.perf_counter() - rolled,
        }

    def train(self, advantages: list[float], step: int) -> dict[str, float]:
        """Train on this rank's stored rollout with the controller's advantages (gradients averaged by FSDP)."""
        started = time.perf_counter()
        advantages_B = torch.tensor(advantages, dtype=torch.float32, device=self.device)  # meets the log-probs
        metrics = self.stack.train(self._rollout, advantages_B, step)
        if self.ema:
            self.ema.update(step)
        self._rollout = None
        return metrics | {"seconds_train": time.perf_counter() - started}

    # --- warm-up ----------------------------------------------------------------------------------------------

    def warmup(self, batch: dict[str, Any], step: int) -> dict[str, float]:
        """One supervised step on this rank's share of the warm-up batch (the domain's)."""
        started = time.perf_counter()
        metrics = self.domain.warmup_step(self.policy, self.stack, batch, step)
        if self.ema:
            self.ema.update(step)
        return metrics | {"seconds_train": time.perf_counter() - started}

    @torch.no_grad()
    def warmup_eval(self, batch: dict[str, Any], seed: int) -> float:
        """The supervised loss on this rank's share of a fixed batch with fixed draws."""
        with self.gathered():
            return self.domain.warmup_eval(self.policy, batch, seed, self.rank)

    def gathered(self):
        """The trained module's FSDP2 units gathered once for a phase of forwards (`fsdp.reshard_after_forward`
        false); enter it after any weight swap (EMA, an old policy): the gathered copies are of the weights then."""
        from unirl_core.worker.fsdp import gathered

        return gathered(self.policy.trainable, not self.config.fsdp.reshard_after_forward)

    # --- evaluation -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, share: tuple[list[str], int], seed: int) -> list:
        """The domain's deterministic outputs of this rank's (prompts, index of the first); EMA weights when kept."""
        import contextlib

        prompts, first_index = share
        with self.ema.applied() if self.ema else contextlib.nullcontext(), self.gathered():
            return self.domain.evaluate(self.policy, self.stack, prompts, first_index, seed)

    @torch.no_grad()
    def evaluate_scores(self, share: tuple[list, int], seed: int, steps: int | None, guidance: float | None,
                        batch_size: int, reward_json: str) -> dict[str, list[float]]:  # fmt: skip
        """`train.eval` on this rank: the deterministic outputs of its share ((prompt, metadata) pairs, index of the
        first) in batches, scored by the evaluation's rewards (loaded on first use): {reward: [score per prompt]}.
        The global RNG is left as it was (training after it draws as without it)."""
        import contextlib

        from unirl_core.config.schema import RewardConfig
        from unirl_core.rewards.service import RewardService

        if getattr(self, "_eval_rewards", (None,))[0] != reward_json:
            config = RewardConfig.model_validate_json(reward_json)
            loaded = getattr(self, "rewards", None)  # the training's scorers: a model reward loaded once per rank
            served = {name: loaded.scorers[name] for name in config.weights if loaded and name in loaded.scorers}
            self._eval_rewards = (reward_json, RewardService.from_config(config, str(self.device), served))
        items, first_index = share
        devices = [self.device] if self.device.type == "cuda" else []
        outputs = []
        swapped = self.ema.applied() if self.ema else contextlib.nullcontext()
        with torch.random.fork_rng(devices=devices):
            with swapped, self.gathered():
                for start in range(0, len(items), batch_size):
                    prompts = [prompt for prompt, _ in items[start : start + batch_size]]
                    outputs += self.domain.evaluate(self.policy, self.stack, prompts, first_index + start, seed,
                                                    steps, guidance)  # fmt: skip
            ids = [f"eval:{first_index + i}" for i in range(len(items))]
            scores = self._eval_rewards[1].score(outputs, [p for p, _ in items], ids, [m for _, m in items],
                                                 finite=False)  # fmt: skip
        return {name: [float(x) for x in values] for name, values in scores.items() if name != "total"}

    # --- checkpoints ------------------------------------------------------------------------------------------

    def _checkpoint(self):
        from unirl_core.worker.checkpoint import ModelState, OptimizerState, RankCheckpoint, RNGState

        module = self.policy.trainable
        tensors = {"model": ModelState(module), "optim": OptimizerState(module, self.stack.optimizer)}
        return RankCheckpoint(tensors | self._averages(), {"rng": RNGState(), "scheduler": self.stack.scheduler})

    def _averages(self) -> dict:
        """The checkpointed averages of the weights: the EMA, DiffusionNFT's old policy (`stack.states()`)."""
        return self.stack.states() | ({"ema": self.ema} if self.ema else {})

    def save(self, folder: str) -> dict[str, Any]:
        """This rank's part of checkpoint `folder` (a collective); returns what the commit record keeps of it."""
        return self._checkpoint().save(Path(folder))

    def load(self, folder: str, record: dict[str, Any], weights_only: bool) -> None:
        """Restore from checkpoint `folder` with its commit `record` (a collective). `weights_only`: a new stage
        starting from the trained weights with its own optimizer (and an EMA restarted from them); otherwise every
        named state: weights, optimizer, EMA, LR schedule and this rank's RNG."""
        states = {"rng": record["rng"][self.rank], "scheduler": record["scheduler"]}
        self._checkpoint().load(Path(folder), None if weights_only else states, weights_only)
        if weights_only:  # the averages restart from the loaded weights
            for average in self._averages().values():
                average.reset()
