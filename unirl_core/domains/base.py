"""The domain contract: what one kind of generative model (image diffusion, autoregressive tokens, ...) does in a
training round. Everything else is generic and calls these: the round strategies, resume and the checkpoint
manager, data sources and GRPO groups, rewards, advantages, metrics, MLflow, the export's staging and registration,
the worker group, EMA and checkpoints of the trained module.

    rank side: one Domain per worker (`worker.worker.TrainWorker` builds it with the round's config and device)
        build_policy()                     -> the policy: `trainable` (the module FSDP2 shards, the optimizer trains
                                              and checkpoints save), `blocks()` (FSDP2 units), `dtype`, `parameters()`
        rl_stack(policy)                   -> the RL train stack: `train(rollout, advantages_B, step)` -> metrics,
                                              `rollout_policy()` (a context), `optimizer`, `scheduler`, `states()`
        rollout(policy, stack, samples, step) -> a rollout whose `outputs` (sample order) the rewards score; the
                                              worker keeps it for `stack.train`; its optional `reward_terms`
                                              ({name: a float per sample}) add to the total as they are
        evaluate(policy, stack, prompts, first_index, seed[, steps, guidance])
                                           -> deterministic outputs of evaluation prompts (stack None outside
                                              training: `unirl eval`; steps, guidance: `train.eval`'s)
        warmup_stack / warmup_step / warmup_eval: the supervised warm-up (domains with "warmup" in `stages`)
    controller side: class methods, no model built
        config_problems(config)            -> what this domain cannot train in the recipe (on loading it); with
                                              `outputs_of(config)` ("image", "video", "text") known, rewards of
                                              another kind too (image rewards score videos frame by frame)
        start_problems(config)             -> ... that the model's classes show (when training starts)
        title(config)                      -> what trains, in a few words
        grid(outputs, captions, cols)      -> a PIL image of outputs, a row per caption (sample and eval grids)
        export(policy, config, folder, merged) -> writes what `from_pretrained` loads; returns whether merged
        model_card(config, run_name)       -> what the registered MLflow model version says of itself
        warmup_data(config, precache), split_warmup(batch, workers): the warm-up's batches and their shares
        export_config(config)              -> the config an export builds the policy from (default: the recipe's)

A domain outside unirl is a `Domain` subclass named in the recipe as `train.domain.name: package.module:ClassName`,
with its own settings in `config_class` (the rest of `train.domain`); the toy token domain in tests/support is one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from unirl_core.config.schema_base import StrictModel


class DomainConfig(StrictModel):
    """`train.domain`: which domain trains (a built-in name or `package.module:ClassName`) and its own settings."""

    name: str = "diffusion"
    """`diffusion` (image diffusion: `train.model`'s family, `train.sampling`), or a `Domain` subclass as
    `package.module:ClassName`, whose config class adds its keys beside `name`."""


class Domain:
    """One domain's parts of a round (see the module's table). `config`: the round's TrainConfig; `device`: the
    rank's torch device ("cpu" when exporting)."""

    config_class: ClassVar[type[DomainConfig]] = DomainConfig
    stages: ClassVar[frozenset[str]] = frozenset({"rl"})  # the round strategies it can train
    outputs: ClassVar[str | None] = None  # what rewards score: "image", "video", "text" (see `outputs_of`)

    def __init__(self, config, device):
        self.config, self.device = config, device

    # --- rank side --------------------------------------------------------------------------------------------

    def build_policy(self):
        raise NotImplementedError

    def rl_stack(self, policy):
        raise NotImplementedError

    def rollout(self, policy, stack, samples: list, step: int):
        raise NotImplementedError

    def evaluate(self, policy, stack, prompts: list[str], first_index: int, seed: int, steps: int | None = None,
                 guidance: float | None = None) -> list:  # fmt: skip
        raise NotImplementedError

    def warmup_stack(self, policy):
        raise NotImplementedError(f"{type(self).__name__} has no supervised warm-up")

    def warmup_step(self, policy, stack, batch: dict[str, Any], step: int) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} has no supervised warm-up")

    def warmup_eval(self, policy, batch: dict[str, Any], seed: int, rank: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} has no supervised warm-up")

    # --- controller side --------------------------------------------------------------------------------------

    @classmethod
    def config_problems(cls, config) -> Iterator[tuple[str, Any, str]]:
        """(path under `train.`, value, what is allowed) of what this domain cannot train."""
        if config.warmup.steps and "warmup" not in cls.stages:
            yield "warmup.steps", config.warmup.steps, f"0: the {config.domain.name} domain has no supervised warm-up"
        yield from cls._reward_problems(config)

    @classmethod
    def outputs_of(cls, config) -> str | None:
        """What this domain's outputs are under `config` (None: unknown, no reward is refused); a domain whose
        outputs depend on its model (image or video diffusion families) overrides it."""
        return cls.outputs

    @classmethod
    def _reward_problems(cls, config) -> Iterator[tuple[str, Any, str]]:
        """Rewards (trained, guards, `train.eval`'s) that score another kind of output than this domain's (image
        rewards score videos frame by frame, so they pass on videos)."""
        from unirl_core.rewards.names import modality

        outputs = cls.outputs_of(config)
        if outputs is None:
            return
        accepted = {"any", outputs} | ({"image"} if outputs == "video" else set())
        kinds = " or ".join(f"{kind}s" for kind in sorted(accepted - {"any"}))
        used = [("weights", config.reward.weights), ("guards", config.reward.guards)]
        used += [("eval.rewards", config.eval.rewards)] if config.eval is not None else []
        for key, names in used:
            for reward in names:
                if modality(reward) not in accepted:
                    yield (f"reward.{key}.{reward}" if key != "eval.rewards" else f"eval.rewards.{reward}", reward,
                           f"a reward of {kinds}, a remote scorer or a "
                           f"'package.module:function': {cls._whose(config)} outputs are {outputs}s, and {reward} "
                           f"scores {modality(reward)}s")  # fmt: skip

    @classmethod
    def _whose(cls, config) -> str:
        """Whose outputs, in the reward refusal (`the ar domain's`)."""
        return f"the {config.domain.name} domain's"

    @classmethod
    def warmup_data(cls, config, precache):
        """The warm-up's data on the controller: `next_batch()` and `state_dict()`/`load_state_dict()` (a named
        state of the checkpoints; `epoch`, `batch_in_epoch` in it)."""
        raise NotImplementedError(f"{cls.__name__} has no supervised warm-up")

    @classmethod
    def split_warmup(cls, batch, workers: int) -> list:
        """A warm-up batch in `workers` equal shares."""
        raise NotImplementedError(f"{cls.__name__} has no supervised warm-up")

    @classmethod
    def start_problems(cls, config) -> list[str]:
        """What cannot train that only the model's classes show (checked when training starts, not on loading)."""
        return []

    @classmethod
    def title(cls, config) -> str:
        """What trains, in a few words (the command's first line)."""
        return config.domain.name

    @classmethod
    def grid(cls, outputs: list, captions: list[str], cols: int):
        raise NotImplementedError

    @classmethod
    def export(cls, policy, config, folder, merged: bool) -> bool:
        raise NotImplementedError

    @classmethod
    def model_card(cls, config, run_name: str):
        raise NotImplementedError

    @classmethod
    def export_config(cls, config):
        """The config an export (one CPU process, weights only) builds the policy from."""
        return config
