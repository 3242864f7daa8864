"""The algorithm contract: what the rollout and the train stack ask an RL algorithm, so that adding one is one module.

An algorithm is a class with its own typed config (`config_class`, an `AlgorithmConfig` subclass whose `name` is
the algorithm's name), capability attributes the loop reads instead of comparing names, and the hooks the train
stack calls for one RL step:

| hook                                   | when                                                                      |
|----------------------------------------|---------------------------------------------------------------------------|
| `setup(stack)`                         | the stack is built (per-run state over the trained weights)               |
| `rollout_policy()`                     | around each rollout: the weights it samples from                          |
| `prepare(stack, rollout, plan, most)`  | once per RL step, before any update (pi_old, no gradients)               |
| `item_loss(stack, rollout, item, ...)` | per forward of an update: the loss of a trained (slot, step, samples)     |
| `summarize(metrics, step)`             | after the step's updates: the step's metrics (and state moved on)         |
| `states()`                             | checkpointed states beyond weights and optimizer, by name                 |

| capability              | meaning                                                                                 |
|-------------------------|-----------------------------------------------------------------------------------------|
| `domains`               | which domains it trains (`diffusion`)                                                   |
| `samplers`              | the stochastic steps (`train.algorithm.sde_type`) it works with (None: any)             |
| `supports_multi_update` | several optimizer steps per rollout (`num_updates_per_batch` > 1) are sound             |
| `needs_old_means`       | its loss reads pi_old's step means (recorded by `prepare`)                               |
| `likelihood_free`       | the rollout records no transitions (ODE rollouts; trained on the final latents)         |
| `shares_group_noise`    | siblings of a group start from the same noise unless the recipe says otherwise           |
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.config.schema_base import Problem


class Algorithm:
    """Base of every RL algorithm; `config`: its validated `config_class` instance."""

    config_class: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    domains: ClassVar[tuple[str, ...]] = ("diffusion",)
    samplers: ClassVar[tuple[str, ...] | None] = None
    supports_multi_update: ClassVar[bool] = True
    needs_old_means: ClassVar[bool] = False
    likelihood_free: ClassVar[bool] = False
    shares_group_noise: ClassVar[bool] = False

    def __init__(self, config: AlgorithmConfig):
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, not {type(config).__name__}")
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @classmethod
    def config_problems(cls, config: AlgorithmConfig) -> Iterator[Problem]:
        """What this algorithm refuses in its config (paths relative to `train.algorithm`)."""
        if not cls.supports_multi_update and config.num_updates_per_batch > 1:
            yield (
                "num_updates_per_batch",
                config.num_updates_per_batch,
                f"1: `{config.name}` is on-policy (no importance ratio), so a second update would use stale samples; "
                "use name: grpo for several updates per rollout",
            )
        if cls.samplers is not None and config.sde_type not in cls.samplers:
            yield "sde_type", config.sde_type, f"one of {', '.join(cls.samplers)} (what `{config.name}` works with)"
        if cls.likelihood_free and config.sde_window is not None:
            yield "sde_window", "set", f"empty: {config.name} rolls out with the ODE (no SDE steps to window)"

    # --- hooks ------------------------------------------------------------------------------------------------

    def setup(self, stack) -> None:
        """Per-run state over the stack's trained weights (none here)."""

    def rollout_policy(self):
        """The weights rollouts sample from: the trained ones (on-policy up to the last update)."""
        return contextlib.nullcontext()

    def prepare(self, stack, rollout, plan, most: int):
        """What every update of this RL step reads, computed once under no gradients before the first update."""
        raise NotImplementedError

    def item_loss(self, stack, rollout, item, prepared, advantages_B, weights):
        """(loss, detached metrics) of one forward: `item` = (slot j, stored step t, sample indices); `weights`:
        per-sample weights summing the micro-batch to its mean, or None for a plain mean."""
        raise NotImplementedError

    def summarize(self, metrics: dict[str, list[float]], step: int) -> dict[str, float]:
        """The step's metrics from every forward's and update's values: their means."""
        return {k: sum(v) / len(v) for k, v in metrics.items()}

    def states(self) -> dict:
        """Tensor states beyond the weights and optimizer that a checkpoint must keep (none here)."""
        return {}


def reduce_terms(terms_B, weights, index):
    """The mean of per-sample terms, or their `weights`' sum (samples left out, several steps per micro-batch)."""
    return terms_B.mean() if weights is None else (terms_B * weights[index]).sum()
